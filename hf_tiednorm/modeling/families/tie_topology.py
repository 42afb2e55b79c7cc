"""Which modules hold the tied embedding matrix, declared once and used by every family: one owner module (the input
embedding), the paths where that same module is registered again (aliases, so FSDP2 groups it once), and the output
layer sharing its parameters; ``_tied_weights_keys`` follow from it. (docs/code_notes.md)"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..head.adaptive import AdaptiveInput, AdaptiveSoftmaxHead
from ..head.layer import TiedNormEmbedding


@dataclass(frozen=True)
class EmbeddingTie:
    """One tied matrix, by module path from the LM (``TiedNormForCausalLM`` / ``...ForConditionalGeneration``)."""

    owner: str  # the input embedding owning the parameters
    aliases: tuple[str, ...]  # paths where the owner module itself is registered again
    head: str | None  # the output layer sharing the owner's parameters; None when the output layer is untied
    # Parameter names of the owner (relative to it) shared by the aliases, and by the head.
    owner_params: tuple[str, ...]
    head_params: tuple[str, ...]

    def holders(self) -> tuple[str, ...]:
        """Distinct modules holding the tied parameters (aliases are the owner itself)."""
        return (self.owner,) if self.head is None else (self.owner, self.head)

    def tied_weights_keys(self, prefix: str = "") -> dict[str, str]:
        """``_tied_weights_keys`` ({target: source}) of the model at ``prefix`` (``"model"``: the bare body)."""
        pairs = [(f"{alias}.{name}", f"{self.owner}.{name}") for alias in self.aliases for name in self.owner_params]
        if self.head is not None:
            pairs += [(f"{self.head}.{name}", f"{self.owner}.{name}") for name in self.head_params]
        start = f"{prefix}." if prefix else ""
        return {target.removeprefix(start): source.removeprefix(start) for target, source in pairs
                if target.startswith(start) and source.startswith(start)}  # fmt: skip


def embedding_tie(config) -> EmbeddingTie | None:
    """The tie of a model with this config, None when nothing is tied. The module paths are the config class's
    (``input_embedding_path``; ``shared_embedding_path``, ``stack_embedding_paths``); an encoder-decoder ties per
    ``tie_topology``; adaptive embeddings tie every band row and, with ``adaptive_tie_projections``, projection."""
    aliases: tuple[str, ...] = ()
    if not config.is_encoder_decoder:
        owner = getattr(type(config), "input_embedding_path", None)
        if not isinstance(owner, str):
            raise AttributeError(f"{type(config).__name__} declares no input_embedding_path: a causal family's config "
                                 "class names its token embedding's module path from the LM (input_embedding_path = "
                                 "'model.embed_tokens', GPT-2's 'transformer.wte'), the matrix the head ties to")
    elif config.share_encoder_decoder_embeddings:
        owner, aliases = config.shared_embedding_path, tuple(config.stack_embedding_paths)
    else:
        owner = config.stack_embedding_paths[1]
    head = "lm_head" if config.tie_word_embeddings else None
    if head is None and not aliases:
        return None
    if config.adaptive_cutoffs is None:
        owner_params = head_params = ("weight",)
    else:
        num_bands = len(config.adaptive_cutoffs) + 1
        owner_params = tuple(AdaptiveSoftmaxHead.tied_parameter_names(num_bands, tie_projections=True))
        head_params = tuple(AdaptiveSoftmaxHead.tied_parameter_names(num_bands, config.adaptive_tie_projections))
    return EmbeddingTie(owner, aliases, head, owner_params, head_params)


def _prefix_of(model: nn.Module) -> str:
    # A bare body (its base_model is itself) sits under base_model_prefix ("model") in the LM.
    return model.base_model_prefix if model.base_model is model else ""


class TiedEmbeddingsMixin:
    """Declares ``_tied_weights_keys`` from ``embedding_tie`` right before HF's ``post_init`` reads it, for the LM
    and for the bare body alike (their keys differ by the ``model.`` prefix)."""

    def post_init(self) -> None:
        # A tie flag set on the config after it was built (config.tie_word_embeddings = False) that contradicts its
        # tie_topology is refused here, before a model is built tied while its config says untied.
        implied = getattr(self.config, "_implied_tie_flags", dict)()
        if any(getattr(self.config, name) != value for name, value in implied.items()):
            self.config.validate_tie_topology()  # raises, naming the flag and tie_topology
        tie = embedding_tie(self.config)
        prefix = _prefix_of(self)
        # The HF parent's __init__ (MarianModel, BartModel) calls post_init before the family has built its own
        # embeddings: its placeholder modules, replaced right after, are tied to nothing.
        owner = None if tie is None else self.get_submodule(tie.owner.removeprefix(f"{prefix}."))
        built = isinstance(owner, (TiedNormEmbedding, AdaptiveInput))
        self._tied_weights_keys = tie.tied_weights_keys(prefix) if built else None
        super().post_init()
        self.finish_head_hosting()

    def finish_head_hosting(self) -> None:
        """Nothing for a bare body; ``TiedNormHeadHostMixin`` (before this class in an LM's bases) hosts the head."""


def alias_tied_modules(body: nn.Module) -> None:
    """Register the owner module of the tie under its aliases in the bare body (three-way: encoder and decoder
    ``embed_tokens`` become ``shared`` itself)."""
    tie = embedding_tie(body.config)
    if tie is None:
        return
    prefix = f"{_prefix_of(body)}."
    owner = body.get_submodule(tie.owner.removeprefix(prefix))
    for alias in tie.aliases:
        body.set_submodule(alias.removeprefix(prefix), owner)


__all__ = [
    "EmbeddingTie",
    "TiedEmbeddingsMixin",
    "alias_tied_modules",
    "embedding_tie",
]
