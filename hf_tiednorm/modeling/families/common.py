"""What the model families add to their HF parent: building and initializing the normalized tied head (and Press &
Wolf's projection P), on top of the head's host (``families/head_host.py``), the loss (``loss/model_loss.py``) and the
tie
(``families/tie_topology.py``). The head math itself lives in ``head/layer.py``, the embeddings in
``families/embeddings.py``, the
outputs in ``families/outputs.py``."""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from ..auto_map import code_reference
from ..head.adaptive import AdaptiveSoftmaxHead
from ..head.layer import TiedNormEmbedding, TiedNormHead
from ..head.options import HeadOptions
from ..head.peft_guard import refuse_bypassed_head
from ..loss.model_loss import TiedNormLossMixin
from ..loss.regularizers import OutputProjection
from .head_host import TiedNormHeadHostMixin
from .tie_topology import TiedEmbeddingsMixin


def build_head(config, hidden_size: int, vocab_size: int) -> TiedNormHead | AdaptiveSoftmaxHead:
    """The normalized tied head; an adaptive softmax returning log-probabilities when adaptive_cutoffs is set."""
    options = HeadOptions.from_config(config)
    if config.adaptive_cutoffs is not None:
        return AdaptiveSoftmaxHead(
            hidden_size, vocab_size, config.adaptive_cutoffs, div_value=config.adaptive_div_value, options=options
        )
    return TiedNormHead(hidden_size, vocab_size, options=options)


def build_output_projection(config, hidden_size: int) -> OutputProjection | None:
    """Press & Wolf's projection P before the tied head, when ``config.projection_regularization`` is set."""
    return None if config.projection_regularization is None else OutputProjection(hidden_size)


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

    def _extra_auto_map(self) -> dict[str, str]:
        # register_for_auto_class maps one Auto class per model class; map AutoModel to the bare model (same code
        # file) too, so that AutoModel.from_pretrained(folder, trust_remote_code=True) also works.
        return {"AutoModel": code_reference(type(self.model))}
