"""What the model families add to their HF parent: building, initializing, re-attaching and training the
normalized tied head. The head math itself lives in ``normalized_head.py``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput

from .adaptive import AdaptiveInput, AdaptiveSoftmaxHead
from .chunked_loss import chunked_head_cross_entropy
from .normalized_head import TiedNormEmbedding, TiedNormHead
from .peft_guard import check_head_not_bypassed, refuse_bypassed_head
from .pipeline_translation import add_translation_pipeline
from .regularizers import LossTerms, OutputProjection, projection_penalty, weight_norm_penalty
from .tie_topology import TiedEmbeddingsMixin
from .token_loss import token_count, token_cross_entropy


class ScaledLookupMixin:
    """Multiplies the lookup by a constant ``embed_scale`` inside the embedding module, as BART's
    ``BartScaledWordEmbedding`` does (Marian multiplies in its encoder/decoder instead). In l2 mode the unit rows
    ŵ_i are scaled, just as Marian scales them."""

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed_scale = embed_scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale:.6g}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


class TokenEmbedding(TiedNormEmbedding):
    """The token embedding the families build: a ``TiedNormEmbedding`` under a name without "Norm", because
    accelerate's FSDP2 wrapping takes the last child of the body whose class name contains "Norm" for the final
    norm and groups it with the input embedding: the encoder-decoders' ``model.shared`` would be listed twice."""


class ScaledTokenEmbedding(ScaledLookupMixin, TokenEmbedding):
    """``TokenEmbedding`` whose lookups are multiplied by ``embed_scale``."""


class ScaledAdaptiveInput(ScaledLookupMixin, AdaptiveInput):
    """``AdaptiveInput`` whose lookups are multiplied by ``embed_scale``."""


def build_embedding(
    config, num_embeddings: int, embedding_dim: int, embed_scale: float | None = None
) -> TiedNormEmbedding | AdaptiveInput:
    """Token embedding that looks up unit rows in l2 mode (Liu et al. eq. 19) and plain rows otherwise;
    an adaptive input (Baevski & Auli, 2019) when ``config.adaptive_cutoffs`` is set. With ``embed_scale`` the
    module multiplies its lookups by it (``ScaledLookupMixin``)."""
    common = {"normalize": config.head_mode == "l2", "norm_eps": config.norm_eps}
    if embed_scale is not None:
        common["embed_scale"] = embed_scale
    if config.adaptive_cutoffs is not None:
        adaptive = AdaptiveInput if embed_scale is None else ScaledAdaptiveInput
        return adaptive(
            num_embeddings,
            embedding_dim,
            config.adaptive_cutoffs,
            div_value=config.adaptive_div_value,
            padding_idx=config.pad_token_id,
            **common,
        )
    plain = TokenEmbedding if embed_scale is None else ScaledTokenEmbedding
    return plain(num_embeddings, embedding_dim, config.pad_token_id, **common)


def build_head(config, hidden_size: int, vocab_size: int) -> TiedNormHead | AdaptiveSoftmaxHead:
    """The normalized tied head; an adaptive softmax returning log-probabilities when adaptive_cutoffs is set."""
    if config.adaptive_cutoffs is not None:
        return AdaptiveSoftmaxHead(
            hidden_size,
            vocab_size,
            config.adaptive_cutoffs,
            div_value=config.adaptive_div_value,
            head_mode=config.head_mode,
            logit_scale=config.logit_scale,
            logit_scale_init=config.logit_scale_init,
            norm_eps=config.norm_eps,
            logit_bias=config.logit_bias,
        )
    return TiedNormHead(
        hidden_size,
        vocab_size,
        head_mode=config.head_mode,
        logit_scale=config.logit_scale,
        logit_scale_init=config.logit_scale_init,
        norm_eps=config.norm_eps,
        logit_bias=config.logit_bias,
    )


def build_output_projection(config, hidden_size: int) -> OutputProjection | None:
    """Press & Wolf's projection P before the tied head, when ``config.projection_regularization`` is set."""
    return None if config.projection_regularization is None else OutputProjection(hidden_size)


# The loss terms come first among the bases so that their fields come last: to_tuple() still starts with loss, logits.
@dataclass
class TiedNormCausalLMOutput(LossTerms, CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus the terms of ``loss`` (``regularizers.LossTerms``), when labels are given."""


@dataclass
class TiedNormSeq2SeqLMOutput(LossTerms, Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus the terms of ``loss`` (``regularizers.LossTerms``), when labels are given."""


# The KV cache's name in forward arguments and model outputs: transformers 5.24 renamed ``past_key_values`` to
# ``cache`` (the old name stays a deprecated alias until 5.40). The families pass the cache on through ``**kwargs``
# and return it under the installed version's name, so either version's generate() finds it, without a warning.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


class TiedNormLMMixin(TiedEmbeddingsMixin):
    """Methods shared by ``TiedNormForConditionalGeneration`` and ``TiedNormForCausalLM``; the tie itself is
    declared by ``TiedEmbeddingsMixin`` (``tie_topology.py``)."""

    def post_init(self) -> None:
        super().post_init()
        # PEFT must not bypass the normalized head (peft_guard.py); checked at every call. post_init may run twice.
        if refuse_bypassed_head not in self._forward_pre_hooks.values():
            self.register_forward_pre_hook(refuse_bypassed_head)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, (TiedNormHead, AdaptiveSoftmaxHead)) and module.logit_scale is not None:
            init.constant_(module.logit_scale, module.logit_scale_init)
        if isinstance(module, (TiedNormHead, AdaptiveSoftmaxHead)) and module.logit_bias is not None:
            init.zeros_(module.logit_bias)
        if isinstance(module, OutputProjection):
            init.eye_(module.weight)  # P = I: a fresh model scores as if there were no projection
        std = getattr(self.config, "embedding_init_std", None)
        if isinstance(module, TiedNormHead) and std is not None:
            # HF initializes the head after the body it reads from (children first), and skips the model itself:
            # N(0, std) for every token embedding and the output matrix (tied: one tensor); init.* skips loaded weights.
            embeddings = [m for m in self.modules() if isinstance(m, TiedNormEmbedding)]
            for weight in {id(w): w for w in [*(m.weight for m in embeddings), self.lm_head.weight]}.values():
                init.normal_(weight, mean=0.0, std=std)
            for embedding in embeddings:
                if embedding.padding_idx is not None and not getattr(embedding.weight, "_is_hf_initialized", False):
                    init.zeros_(embedding.weight[embedding.padding_idx])

    def output_embedding_weights(self) -> list[torch.Tensor]:
        """The matrices whose rows are the output embedding w_k, in token-id order: the head's weight (V, d), or
        one (n_i, d_i) matrix per band of an adaptive softmax. Tied models share them with the input embedding."""
        if isinstance(self.lm_head, AdaptiveSoftmaxHead):
            return [band.weight for band in self.lm_head.bands]
        return [self.lm_head.weight]

    def score_and_loss(
        self, hidden_states: torch.Tensor, targets: torch.Tensor | None, num_items_in_batch=None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
        """The one loss path of every family: Press & Wolf's projection P, the normalized head, the token
        cross-entropy and the regularizer terms.

        Args:
            hidden_states: (batch, length, d), the decoder's last hidden states.
            targets: (batch, length) token ids aligned with ``hidden_states`` (already shifted), -100 = no target;
                None for inference.
            num_items_in_batch: target tokens of the whole accumulated batch (passed by the Trainer).

        Returns:
            logits (batch, length, V) — None when the opt-in chunked loss (``config.loss_chunk_size``, training with
            targets) never materializes them —, the loss (None without targets) and its terms by name.
        """
        if self.output_projection is not None:
            hidden_states = self.output_projection(hidden_states)  # P·h (Press & Wolf, 2017)
        chunked = targets is not None and self.training and self.config.loss_chunk_size is not None
        logits = None if chunked else self.lm_head(hidden_states)
        if targets is None:
            return logits, None, {}
        smoothing = self.config.label_smoothing
        if chunked:
            cross_entropy = chunked_head_cross_entropy(
                self.lm_head, hidden_states, targets, self.config.loss_chunk_size, smoothing, num_items_in_batch
            )
        else:
            cross_entropy = token_cross_entropy(logits, targets, smoothing, num_items_in_batch)
        loss, terms = self.compose_loss(cross_entropy, targets, num_items_in_batch)
        return logits, loss, terms

    def compose_loss(
        self,
        cross_entropy: torch.Tensor,
        targets: torch.Tensor,
        num_items_in_batch: int | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss (cross-entropy + enabled regularizers) and its terms, keyed by ``LOSS_TERMS`` names.

        Under gradient accumulation (``num_items_in_batch``: target tokens of the accumulated batch) each micro-batch
        adds its token share of the penalties, so they count once per optimizer step, as the cross-entropy does.
        """
        share = 1.0
        if num_items_in_batch is not None:
            share = (targets != -100).sum().to(cross_entropy.device) / token_count(targets, num_items_in_batch)
        terms = {"cross_entropy": cross_entropy, **self.penalty_terms(share)}
        return sum(terms.values()), terms

    def penalty_terms(self, share: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """The enabled regularizers at the current weights (``projection_penalty``, ``weight_norm_penalty``; they
        depend on the weights only), each times ``share``: a micro-batch's token share of the accumulated batch, 1
        for a whole batch (an evaluation loss)."""
        config = self.config
        terms = {}
        if config.projection_regularization:
            terms["projection_penalty"] = share * projection_penalty(
                self.output_projection.weight, config.projection_regularization
            )
        if config.weight_norm_regularization:
            terms["weight_norm_penalty"] = share * weight_norm_penalty(
                self.output_embedding_weights(), config.weight_norm_regularization, config.weight_norm_target
            )
        return terms

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        if isinstance(new_embeddings, TiedNormHead):
            self.lm_head = new_embeddings
            return
        # HF's resize builds a plain nn.Linear for an untied head: adopt its weight and keep the scoring mode.
        self.lm_head.weight = new_embeddings.weight
        self.lm_head.match_vocab_size()

    def generate(self, *args, **kwargs):
        check_head_not_bypassed(self)  # before lm_head is used here: PEFT may have wrapped it
        # The weights cannot change while one generation runs: compute the head's norms once for all its steps.
        with self.lm_head.frozen_column_terms():
            return super().generate(*args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        # register_for_auto_class maps one Auto class per model class; map AutoModel to the bare model (same code
        # file) too, so that AutoModel.from_pretrained(folder, trust_remote_code=True) also works.
        base_model = type(self.model)
        module = base_model.__module__.rsplit(".", 1)[-1]
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        self.config.auto_map = {**auto_map, "AutoModel": f"{module}.{base_model.__name__}"}
        if self.config.is_encoder_decoder:  # the folder alone serves pipeline("tiednorm-translation", ...)
            add_translation_pipeline(self.config)
        super().save_pretrained(save_directory, *args, **kwargs)

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        if self.config.adaptive_cutoffs is not None:
            raise ValueError(
                "resize_token_embeddings is not supported with adaptive_cutoffs: the bands are tied to the "
                "frequency order of the vocabulary; build a new model with a new vocabulary and cutoffs"
            )
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        self.lm_head.match_vocab_size()  # the tied weight was resized in place; resize the per-token scale too
        return embeddings
