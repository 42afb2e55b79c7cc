"""The publishing layer: model cards (``model_card``, ``card_metrics``, ``provenance``, ``tiednorm-card``) and pushing
to the Hub (``hub``, ``tiednorm-push``, which stages through ``hf_tiednorm.conversion.staging_checks`` and pushes plain
exports made by ``hf_tiednorm.conversion.export``)."""
