"""What both encoder-decoder families share: the body (``TiedNormSeq2SeqModelMixin``) and the LM
(``TiedNormSeq2SeqLMMixin``). Token embeddings tied per ``config.tie_topology``, the normalized tied head and no
``final_logits_bias`` (the distance mode derives its bias from W), the loss with ``config.label_smoothing`` and its
terms, Marian's resize rules. Attention, layers, positions, KV cache and generation are the parent's
(families/seq2seq.py: Marian; families/bart.py: BART).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.marian.modeling_marian import MarianMTModel, shift_tokens_right
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from ..head.scoring_guard import own_scoring
from ..load_checks import DeviceMapAtLoadMixin, WeightChecksMixin, check_loaded_body
from ..weight_checks import check_resize_keeps_special_tokens
from .common import TiedNormLMMixin, build_head, build_output_projection
from .configuration_encoder_decoder import TieTopologyConfigMixin
from .embeddings import build_embedding
from .head_host import start_resized_tokens
from .outputs import CACHE_FIELD, TiedNormSeq2SeqLMOutput
from .tie_topology import TiedEmbeddingsMixin, alias_tied_modules


class TiedNormSeq2SeqModelMixin(DeviceMapAtLoadMixin, TiedEmbeddingsMixin):
    """The encoder-decoder body of both families: token embeddings from ``build_embedding``, tied per
    ``config.tie_topology`` (``families/tie_topology.py``), with Marian's embedding accessors so that one set of resize
    rules serves both."""

    def __init__(self, config: TieTopologyConfigMixin):
        super().__init__(config)
        scale = self.lookup_scale(config)
        if config.share_encoder_decoder_embeddings:
            # One module for the three-way tie: the encoder and decoder look up through model.shared itself.
            self.shared = build_embedding(config, config.vocab_size, config.d_model, scale)
            alias_tied_modules(self)
        else:
            if hasattr(self, "shared"):  # BART's body always builds one
                del self.shared
            self.encoder.embed_tokens = build_embedding(config, config.vocab_size, config.d_model, scale)
            self.decoder.embed_tokens = build_embedding(config, config.decoder_vocab_size, config.d_model, scale)
        self.post_init()

    def lookup_scale(self, config: TieTopologyConfigMixin) -> float | None:
        """Factor the embedding module multiplies its lookups by; None where the body scales them itself (Marian)."""
        return None

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        # transformers' hook on the loading report: a tensor missing from the weights (the shared embedding, which
        # transformers' tie logic would leave on the meta device unreported) is refused by name (load_checks.py).
        super()._adjust_missing_and_unexpected_keys(loading_info)
        check_loaded_body(self, loading_info)

    def get_input_embeddings(self):
        return self.encoder.embed_tokens  # the shared embedding when three-way tied

    def set_input_embeddings(self, value) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value
        else:
            self.encoder.embed_tokens = value

    def get_decoder_input_embeddings(self):
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError("with tie_topology='three_way' the decoder input embedding is get_input_embeddings()")
        return self.decoder.embed_tokens

    def set_decoder_input_embeddings(self, value) -> None:
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError("with tie_topology='three_way' set the decoder input embedding with set_input_embeddings")
        self.decoder.embed_tokens = value


class TiedNormSeq2SeqLMMixin(WeightChecksMixin, TiedNormLMMixin):
    """An encoder-decoder LM with the normalized tied head: tying, resizing, loss and generation inputs, loading
    checked; a family names its body class in ``model_class``."""

    model_class: type[PreTrainedModel]
    base_model_prefix = "model"

    def __init__(self, config: TieTopologyConfigMixin):
        super().__init__(config)
        self.model = self.model_class(config)
        self.output_projection = build_output_projection(config, config.d_model)  # Press & Wolf's P, or None
        self.lm_head = build_head(config, config.d_model, config.decoder_vocab_size)
        self.post_init()

    # Marian's rule for the decoder's own vocabulary (tie topology "decoder" / "untied"), used as written: it
    # resizes the decoder input embedding (and an untied output layer), updates config.decoder_vocab_size and re-ties;
    # where Marian then resizes its final_logits_bias, our head, which has none, follows the new vocabulary. New
    # tokens of a lossless-started model start by its mode's lossless map, as resize_token_embeddings starts them.
    def resize_decoder_token_embeddings(self, new_num_tokens: int) -> None:
        check_resize_keeps_special_tokens(self, new_num_tokens)  # the decoder starts, pads and ends with them
        first_new = self.config.decoder_vocab_size
        MarianMTModel.resize_decoder_token_embeddings(self, new_num_tokens)
        start_resized_tokens(self, first_new)

    def _resize_final_logits_bias(self, new_num_tokens: int) -> None:
        self.lm_head.match_vocab_size()

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        # Marian's rule for resize_token_embeddings: the encoder's vocabulary, and the decoder's and the output
        # layer's with it only when three-way tied. Written out because MarianMTModel._resize_token_embeddings
        # drops mean_resizing.
        embeddings = self._get_resized_embeddings(self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of,
                                                  mean_resizing)
        self.model.set_input_embeddings(embeddings)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = embeddings.num_embeddings
        return self.get_input_embeddings()

    @own_scoring  # scores with the model's own head: what the scoring guard lets run (head/scoring_guard.py)
    @can_return_tuple  # return_dict=False (argument or config) gives the output's tuple, as HF's LMs do
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool | None = None,  # the Trainer's: a fused loss may serve evaluation too
        **kwargs: Unpack[TransformersKwargs],
    ) -> TiedNormSeq2SeqLMOutput:
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_attention_mask=decoder_attention_mask,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs | {"return_dict": True},  # the body's output object; can_return_tuple makes the tuple
        )
        hidden_states = outputs.last_hidden_state  # (batch, target_len, d)
        # (batch, len, V); None when a fused loss computed the loss
        logits, loss, loss_terms = self.score_and_loss(hidden_states, labels, num_items_in_batch, skip_logits)
        return TiedNormSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            **loss_terms,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        # Marian's shift_tokens_right is BART's too.
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = ["TiedNormSeq2SeqLMMixin", "TiedNormSeq2SeqModelMixin"]
