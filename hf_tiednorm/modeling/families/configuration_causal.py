"""The configuration of the Llama-style causal family: Llama's fields, the head's and the techniques'."""

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from .config_fields import layer_count_field, size_field
from .configuration import TiedNormHeadConfigMixin
from .configuration_techniques import TiedNormTechniquesConfigMixin


@strict
class TiedNormCausalConfig(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, LlamaConfig):
    """A Llama-style decoder-only LM whose output layer is the normalized tied head."""

    model_type = "tiednorm_causal"
    # Where its models keep the token embedding (module path from the LM; families/tie_topology.py reads it). No field.
    input_embedding_path = "model.embed_tokens"

    vocab_size: int = size_field(default=8000)
    hidden_size: int = size_field(default=256)
    # Width of the SwiGLU feed-forward block.
    intermediate_size: int = size_field(default=768)
    num_hidden_layers: int = layer_count_field(default=4)
    num_attention_heads: int = size_field(default=4)
    max_position_embeddings: int = size_field(default=512)
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    # Input embedding = output embedding (Press & Wolf, 2017). False gives the untied control.
    tie_word_embeddings: bool = True


__all__ = ["TiedNormCausalConfig"]
