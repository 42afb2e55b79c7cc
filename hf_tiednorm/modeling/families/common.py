"""What the model families add to their HF parent: building and initializing the normalized tied head (and Press &
Wolf's projection P) on top of the head's host, the loss and the tie; ``TiedNormCausalLMMixin`` is the public base of
a causal family's LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from ..head.adaptive import AdaptiveInput, AdaptiveSoftmaxHead
from ..head.layer import TiedNormEmbedding, TiedNormHead
from ..head.peft_guard import refuse_bypassed_head
from ..head.scoring_guard import own_scoring
from ..head.settings import HeadSettings
from ..load_checks import WeightChecksMixin
from ..loss.model_loss import TiedNormLossMixin
from ..loss.regularizers import OutputProjection
from .causal_lm_names import recognise_built_causal_lm
from .embeddings import build_embedding
from .head_host import TiedNormHeadHostMixin
from .outputs import CACHE_FIELD, TiedNormCausalLMOutput
from .tie_topology import TiedEmbeddingsMixin


def build_head(config, hidden_size: int, vocab_size: int) -> TiedNormHead | AdaptiveSoftmaxHead:
    """The normalized tied head; an adaptive softmax returning log-probabilities when adaptive_cutoffs is set."""
    settings = HeadSettings.from_config(config)
    if config.adaptive_cutoffs is not None:
        return AdaptiveSoftmaxHead(
            hidden_size, vocab_size, config.adaptive_cutoffs, div_value=config.adaptive_div_value, settings=settings
        )
    return TiedNormHead(hidden_size, vocab_size, settings=settings)


def build_output_projection(config, hidden_size: int) -> OutputProjection | None:
    """Press & Wolf's projection P before the tied head, when ``config.projection_regularization`` is set."""
    return None if config.projection_regularization is None else OutputProjection(hidden_size)


def body_of(model: nn.Module) -> nn.Module:
    """The HF body of a family's LM (``model.base_model``); ``TypeError`` naming the attribute it must be built under
    when the LM has none."""
    body = model.base_model
    if body is model:
        raise TypeError(
            f"{type(model).__name__} has no body under base_model_prefix={model.base_model_prefix!r}: build the HF "
            f"body there in __init__ (self.{model.base_model_prefix} = ...) before add_tied_norm_head; the forward "
            "of TiedNormCausalLMMixin calls it"
        )
    return body


class TiedNormLMMixin(TiedNormHeadHostMixin, TiedNormLossMixin, TiedEmbeddingsMixin):
    """Methods shared by ``TiedNormForConditionalGeneration`` and ``TiedNormForCausalLM``: hosting the head
    (``families/head_host.py``, shared with the wrapper), the loss (``loss/model_loss.py``) and the tie, declared by
    ``TiedEmbeddingsMixin`` (``families/tie_topology.py``); here the initialization and the PEFT guard."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # PEFT must not bypass the normalized head (head/peft_guard.py): checked at a call after any structural change.
        # Registered once per model here (post_init, which may run twice, is TiedEmbeddingsMixin's alone).
        self.register_forward_pre_hook(refuse_bypassed_head)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, (TiedNormHead, AdaptiveSoftmaxHead)):  # the learned terms at their start values
            for name, start in module.term_starts.items():
                if getattr(module, name, None) is not None:
                    init.constant_(getattr(module, name), start)
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

    def add_tied_norm_head(self, hidden_size: int) -> None:
        """Give the model the normalized tied head (``lm_head``), Press & Wolf's projection P where the config asks
        for it (``output_projection``), and make the body's token embedding a ``TiedNormEmbedding`` (l2 lookups,
        the tie) unless it is one already. Call it in ``__init__`` after building the body, before ``post_init``."""
        config = self.config
        body_of(self)  # refuses a model without its body, by name
        if not isinstance(self.get_input_embeddings(), (TiedNormEmbedding, AdaptiveInput)):
            self.set_input_embeddings(build_embedding(config, config.vocab_size, hidden_size))
        self.output_projection = build_output_projection(config, hidden_size)  # Press & Wolf's P, or None
        self.lm_head = build_head(config, hidden_size, config.vocab_size)


class TiedNormCausalLMMixin(WeightChecksMixin, TiedNormLMMixin):
    """The public base of a causal family's LM, listed before the HF parent's ``PreTrainedModel``: the head, the label
    shift, the loss, the tie, the loading checks, resizing and generation. The family supplies ``config_class`` (with
    ``input_embedding_path``) and an ``__init__`` that builds the HF body under ``base_model_prefix``, then calls
    ``self.add_tied_norm_head(d)`` and ``self.post_init()``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        recognise_built_causal_lm(self)  # the label smoother shifts; TRL reloads the reference

    @own_scoring  # scores with the model's own head: what the scoring guard lets run (scoring_guard.py)
    @can_return_tuple  # return_dict=False (argument or config) gives the output's tuple, as HF's LMs do
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool | None = None,  # the Trainer's: a fused loss may serve evaluation too
        **kwargs: Unpack[TransformersKwargs],
    ) -> TiedNormCausalLMOutput:
        """``labels`` (batch, length) are the input ids (shifted here); ``shift_labels`` in ``kwargs`` (aligned already,
        as HF's ``ForCausalLMLoss`` reads them) replace them (a named argument would be taken for a second label
        column)."""
        shift_labels = kwargs.pop("shift_labels", None)
        outputs = body_of(self)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs | {"return_dict": True},  # the body's output object; can_return_tuple makes the tuple
        )
        # Generation needs only the last position's logits: logits_to_keep=1 skips the rest of the head.
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = outputs.last_hidden_state[:, kept, :]  # (batch, kept, d)
        # labels are input_ids: position t predicts token t+1 (HF convention); the pad marks "no target".
        next_tokens = None if labels is None else F.pad(labels, (0, 1), value=-100)[:, 1:]
        if shift_labels is not None:
            next_tokens = shift_labels
        # (b, kept, V); None when a fused loss computed the loss
        logits, loss, loss_terms = self.score_and_loss(hidden_states, next_tokens, num_items_in_batch, skip_logits)
        return TiedNormCausalLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD, None)},
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
            **loss_terms,
        )
