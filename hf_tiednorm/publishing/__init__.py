"""Publishing a trained model: its model card (``model_card``, ``tiednorm-card``), the upload to the Hugging Face
Hub (``hub``, ``tiednorm-push``), the plain export to the parent architecture (``export``, ``export_checks``,
``export_card``, ``tiednorm-export``) and what staging refuses (``staging_checks``)."""
