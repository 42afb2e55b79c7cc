"""The training loss of a normalized tied head: the token cross-entropy and count (``token``), which path computes
it (``policy``), the chunked kernel (``chunked``), the one entry point of the head's fused loss (``head_loss``), the
families' loss (``model_loss``), the regularizers (``regularizers``) and the wrapper's gradient-accumulation share
(``accumulated``). Imports the head, nothing else of the model layer."""
