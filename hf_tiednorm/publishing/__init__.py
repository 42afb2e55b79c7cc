"""Publishing a trained model: its model card (``model_card``, ``tiednorm-card``) and the upload to the Hugging Face
Hub (``hub``, ``tiednorm-push``)."""
