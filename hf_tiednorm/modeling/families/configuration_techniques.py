"""The fields of the training techniques the package's own families implement (docs/techniques.md)."""

from dataclasses import dataclass

from transformers.utils.type_validators import interval, positive_int_field

from .config_fields import non_negative_field, positive_finite_field


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormTechniquesConfigMixin:
    """Fields of the techniques the own families implement in their forward and loss; a wrapped model refuses them."""

    # Output fields the Trainer's evaluation does not collect: the KV cache, the loss terms (regularizers.LOSS_TERMS).
    keys_to_ignore_at_inference = ["cache", "past_key_values", "cross_entropy", "projection_penalty",
                                   "weight_norm_penalty"]  # fmt: skip

    # Label smoothing of the model's own cross-entropy (kept beside the regularizer terms, unlike the Trainer's).
    label_smoothing: float | int = interval(min=0, max=1, exclude_max=True)(default=0.0)
    # Tokens per chunk of the chunked loss (it never holds the tokens × V logits); set, "auto" picks it.
    loss_chunk_size: int | None = positive_int_field(default=None)
    # Press & Wolf's projection P between the decoder output and the head, penalty λ·‖P‖_F (None: no P).
    projection_regularization: float | int | None = non_negative_field(default=None)
    # Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² over the output rows (0: off).
    weight_norm_regularization: float | int = non_negative_field(default=0.0)
    # ν, the row norm the weight-norm regularization pulls towards.
    weight_norm_target: float | int = positive_finite_field(default=2.0)
    # Std of a new model's token embeddings (None: the parent's init_std); the padding row stays zero.
    embedding_init_std: float | None = positive_finite_field(default=None)
    # σ of Herold et al.'s weight-norm initialization, recorded once a new model's rows got norm σ·log(count).
    weight_norm_init_sigma: float | int | None = positive_finite_field(default=None)
    # Adaptive input + tied adaptive softmax (Baevski & Auli): increasing token ids c_1 < ... < V splitting the bands.
    adaptive_cutoffs: list[int] | None = None
    # k of the adaptive bands: band i has width d // k**i.
    adaptive_div_value: float | int = interval(min=1)(default=4.0)
    # Tie each adaptive band's output projection to its input projection too (else only the band rows).
    adaptive_tie_projections: bool = True

    def validate_loss_chunk_size(self) -> None:
        # Refused, not ignored: the plain path and the adaptive softmax materialize the logits, never chunk.
        if self.loss_chunk_size is not None and (self.loss_implementation == "plain" or self.adaptive_cutoffs):
            reader = "the adaptive softmax" if self.adaptive_cutoffs else "loss_implementation='plain'"
            raise ValueError(f"loss_chunk_size={self.loss_chunk_size} (the chunks of the chunked loss of the plain "
                             f"head) does not apply to {reader} (which materializes the logits and never chunks): it "
                             "would be ignored; leave loss_chunk_size unset (null), or use loss_implementation "
                             "'chunked' / 'auto' without adaptive_cutoffs")

    def validate_adaptive_cutoffs(self) -> None:
        cutoffs, vocab_size = self.adaptive_cutoffs, self.vocab_size
        if cutoffs is None:
            return
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0 or cutoffs[-1] >= vocab_size:
            raise ValueError("adaptive_cutoffs must be strictly increasing ints in [1, vocab_size - 1] = [1, "
                             f"{vocab_size - 1}] so that the bands [0, c_1), ..., [c_n-1, {vocab_size}) are non-empty "
                             f"and cover the vocabulary exactly; got {cutoffs}")
        if int(self.hidden_size // self.adaptive_div_value ** len(cutoffs)) < 1:
            raise ValueError(f"the last of {len(cutoffs) + 1} adaptive bands would have width {self.hidden_size} // "
                             f"{self.adaptive_div_value}^{len(cutoffs)} < 1; use fewer adaptive_cutoffs or a smaller "
                             "adaptive_div_value")
        if self.adaptive_tie_projections and not self.tie_word_embeddings:
            raise ValueError("adaptive_tie_projections=True ties the output projections to the input ones, but the "
                             "output layer is untied from the input embedding; tie the embeddings or set "
                             "adaptive_tie_projections=False")
        if self.embedding_init_std is not None:
            raise ValueError("embedding_init_std initializes the plain token embedding; the adaptive bands keep their "
                             "own init: leave one of embedding_init_std / adaptive_cutoffs unset")
        if self.loss_implementation in ("fused", "chunked"):
            raise ValueError(f"loss_implementation={self.loss_implementation!r} (a fused loss of the plain head) does "
                             "not apply to the adaptive softmax; set loss_implementation='auto' or 'plain', or leave "
                             "adaptive_cutoffs unset")


__all__ = ["TiedNormTechniquesConfigMixin"]
