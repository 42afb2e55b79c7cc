"""What the command-line flags of the config fields say: their help texts, and which fields fine-tuning may change
(``finetune``: a loss weight, which changes no parameter) or only a new model takes (``new_model_only``). The training
scripts' model flags (``hf_tiednorm.training.arguments``) and the converter's head flags (``field_flags.py``) are made
from them, so a field is described once for both; a config field of one's own gets a flag by carrying
``metadata=script_flag(...)`` (the package's own fields are described here, so that a saved model's configuration file
holds fields and their comments only).
"""

from __future__ import annotations

import dataclasses

from ..registration.head_modes import HEAD_MODES, head_mode_summaries


def script_flag(help: str, *, finetune: bool = False, new_model_only: bool = False, choices=None) -> dict:
    """The description of a config field as a flag: its ``help`` text, whether fine-tuning a saved model may change it
    (``finetune``) or only a new model takes it (``new_model_only``), and ``choices`` for a field whose type is no
    ``Literal`` (a live sequence such as ``HEAD_MODES`` is read when the flag is parsed)."""
    metadata = {"help": help, "finetune": finetune, "new_model_only": new_model_only}
    if choices is not None:
        metadata["choices"] = choices
    return metadata


# The package's own config fields that are flags, by name (configuration.py's mixins).
FIELD_FLAGS: dict[str, dict] = {
    "head_mode": script_flag(
        "how the output layer scores token i against the decoder state h (hf_tiednorm/modeling/head/modes.py): "
        f"{head_mode_summaries()}",
        choices=HEAD_MODES,
    ),
    "logit_scale_kind": script_flag(
        "multiplier g on the logits: none, fixed (a constant), scalar or vector (learned, one g per token)"),
    "logit_scale_init": script_flag(
        "g for logit_scale_kind fixed, its initial value for scalar/vector; None: 1 for scalar/vector (the "
        "scale-free head at step 0), sqrt(hidden size) for fixed"
    ),
    "logit_bias": script_flag(
        "a learned per-token bias b added to the scores, zero at initialization (s_i = g·score_i + b_i): where a "
        "normalized head can keep the unigram prior that the row norms carried"
    ),
    "norm_eps": script_flag("lower bound on the row norms: a row with norm <= norm_eps is dead (score 0, no gradient "
        "through its norm), so zero rows never divide by zero"),
    "loss_implementation": script_flag(
        "what computes the head's training loss (hf_tiednorm/modeling/loss/policy.py): auto (the fastest "
        "path correct for "
        "the device, dtype and options: a fused linear cross-entropy on the folded weight — liger-kernel on CUDA, "
        "torch's where exact, else the chunked loop — once the logits are large, else the plain one), fused "
        "(always a fused path), chunked (the chunked loop) or plain (the materialized logits). A fused path "
        "returns logits=None in training",
        finetune=True,
    ),
    "label_smoothing": script_flag(
        "label smoothing of the model's own cross-entropy (set here rather than in the Trainer's "
        "--label_smoothing_factor, so that the regularizer terms of the model's loss are kept)",
        finetune=True,
    ),
    "loss_chunk_size": script_flag(
        "tokens per chunk of the chunked training loss, which never materializes the (tokens × V) logits "
        "(hf_tiednorm/modeling/loss/chunked.py; the forward then returns logits=None): set, it picks the "
        "chunked loop "
        "under loss_implementation auto; None: the chunked loop's default size",
        finetune=True,
    ),
    "projection_regularization": script_flag(
        "Press & Wolf's projection P (H×H, identity init) between the decoder output and the tied head, with "
        "penalty λ·‖P‖_F (paper: λ = 0.15; 0: P unregularized; None: no P; "
        "hf_tiednorm/modeling/loss/regularizers.py). "
        "Fine-tuning may change λ of a model trained with P, never add P",
        finetune=True,
    ),
    "weight_norm_regularization": script_flag(
        "Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² over the output embedding rows "
        "(paper: ρ = 1e-3; 0: off)",
        finetune=True,
    ),
    "weight_norm_target": script_flag(
        "ν, the row norm the weight-norm regularization pulls towards (paper: 2)", finetune=True),
    "embedding_init_std": script_flag(
        "std of a new model's token embeddings (and untied output matrix); None: the parent's init_std (0.02). "
        "The paper's fairseq init is d**-0.5 (row norms ≈ 1 instead of 0.02·√d), e.g. 0.0625 at d = 256; "
        "square mode (scores w·h/‖w‖²) needs it. The padding row stays zero"
    ),
    "weight_norm_init_sigma": script_flag(
        "Herold et al.'s weight-norm initialization: a new model's embedding rows get norm σ·log(count), counts "
        "from the tokenized training data; None: HF's random init",
        new_model_only=True,
    ),
    "adaptive_cutoffs": script_flag(
        "adaptive input + tied adaptive softmax (Baevski & Auli, 2019): increasing token ids c_1 < … < c_n-1 < V "
        "that split the frequency-ordered vocabulary into bands, such as 2000 6000 (encoder-decoders: "
        "tie_topology three_way); None: plain embedding"
    ),
    "adaptive_div_value": script_flag("k of the adaptive bands: band i has width d // k**i"),
    "adaptive_tie_projections": script_flag(
        "tie each adaptive band's output projection to its input projection too (else only the band rows)"
    ),
}


def flag_of(config_field: dataclasses.Field) -> dict | None:
    """``config_field``'s description as a flag (its own ``script_flag`` metadata, else ``FIELD_FLAGS``'), or None
    for a field that is no flag."""
    return dict(config_field.metadata) if "help" in config_field.metadata else FIELD_FLAGS.get(config_field.name)


__all__ = ["FIELD_FLAGS", "flag_of", "script_flag"]
