"""A Marian/BART-style encoder-decoder whose output layer is the normalized tied head.

What differs from ``transformers``' Marian:
  * token embeddings are ``TiedNormEmbedding`` (unit rows are looked up in l2 mode);
  * ``lm_head`` is ``TiedNormHead`` (scores in one of five modes) and there is no ``final_logits_bias``:
    the distance mode derives its bias from W;
  * the tie topology (three-way / decoder / untied) comes from ``config.tie_topology``;
  * the loss applies ``config.label_smoothing`` itself.
Attention, layers, positions, KV cache and generation are Marian's.
"""

from __future__ import annotations

import torch
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.models.marian.modeling_marian import MarianModel, MarianPreTrainedModel, shift_tokens_right

from .configuration_tiednorm import TiedNormSeq2SeqConfig
from .modeling_common import TiedNormLMMixin, build_embedding, build_head, token_cross_entropy


class TiedNormSeq2SeqPreTrainedModel(MarianPreTrainedModel):
    config_class = TiedNormSeq2SeqConfig
    config: TiedNormSeq2SeqConfig


class TiedNormSeq2SeqModel(TiedNormSeq2SeqPreTrainedModel, MarianModel):
    """Marian's encoder-decoder body with embeddings that can look up l2-normalized rows."""

    def __init__(self, config: TiedNormSeq2SeqConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = build_embedding(config, config.vocab_size, config.d_model)
        self.encoder.embed_tokens = build_embedding(config, config.vocab_size, config.d_model)
        self.decoder.embed_tokens = build_embedding(config, config.decoder_vocab_size, config.d_model)
        self.post_init()


class TiedNormForConditionalGeneration(TiedNormLMMixin, TiedNormSeq2SeqPreTrainedModel, GenerationMixin):
    base_model_prefix = "model"
    _keys_to_ignore_on_load_missing = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
    _keys_to_ignore_on_save = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
    # Press & Wolf (2017): the decoder's input embedding is the output embedding ({target: source}).
    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: TiedNormSeq2SeqConfig):
        super().__init__(config)
        self.model = TiedNormSeq2SeqModel(config)
        if config.share_encoder_decoder_embeddings:
            # Three-way tying (Press & Wolf, 2017, Section 5): encoder input = decoder input = output.
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
            }
        self.lm_head = build_head(config, config.d_model, config.decoder_vocab_size)
        self.post_init()

    def resize_token_embeddings(self, *args, **kwargs):
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = self.config.vocab_size
        return embeddings

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        # Marian's rule: resize_token_embeddings resizes the encoder's vocabulary, and the output layer only
        # when it shares that vocabulary (three-way); the decoder's own vocabulary has resize_decoder_token_embeddings.
        embeddings = self._get_resized_embeddings(
            self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of, mean_resizing
        )
        self.model.set_input_embeddings(embeddings)
        return self.get_input_embeddings()

    def resize_decoder_token_embeddings(self, new_num_tokens: int):
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "resize_decoder_token_embeddings needs tie_topology 'decoder' or 'untied'; with 'three_way' "
                "use resize_token_embeddings"
            )
        decoder_embeddings = self._get_resized_embeddings(self.model.get_decoder_input_embeddings(), new_num_tokens)
        self.model.set_decoder_input_embeddings(decoder_embeddings)
        if not self.config.tie_word_embeddings:
            self.set_output_embeddings(self._get_resized_lm_head(self.lm_head, new_num_tokens))
        self.config.decoder_vocab_size = new_num_tokens
        self.tie_weights()
        self.lm_head.match_vocab_size()
        return decoder_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
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
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (batch, target_len, V)
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_smoothing, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = ["TiedNormForConditionalGeneration", "TiedNormSeq2SeqModel", "TiedNormSeq2SeqPreTrainedModel"]
