"""Gemma 3: SigLIP tower pooled to a fixed number of soft tokens per image; the language model lets
the image tokens attend to each other *bidirectionally* (``token_type_ids``) and mixes
sliding-window with global layers, so the causal mask is not the mask applied."""
from __future__ import annotations

import math

from ..core.compat import transformers
from .base import VLMFamily, chat_template, decoder_dims, register, vit_dims


@register
class Gemma3(VLMFamily):
    name = "Gemma 3"
    model_types = ("gemma3",)
    model_class = "Gemma3ForConditionalGeneration"
    image_marker = "<start_of_image>"
    special_tokens = ("<start_of_turn>", "<end_of_turn>")
    named_tokens = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    layout = "<start_of_turn> user {image} {question} <end_of_turn> <start_of_turn> model"

    def expected_image_tokens(self, config, inputs):
        pv = inputs.get("pixel_values")
        return None if pv is None else int(pv.shape[0]) * self.image_tokens_per_picture(config)

    def image_tokens_per_picture(self, config):
        return int(config.mm_tokens_per_image)

    def image_grid(self, config, inputs):
        side = math.isqrt(int(config.mm_tokens_per_image))
        return (side, side)

    def config(self, tok, shape):
        types = [("sliding_attention" if (i + 1) % 2 else "full_attention") for i in range(shape.layers)]
        text = transformers.Gemma3TextConfig(**decoder_dims(
            tok, shape, query_pre_attn_scalar=shape.head_dim, sliding_window=shape.sliding_window or 4096,
            layer_types=types, max_position_embeddings=4096))
        return transformers.Gemma3Config(text_config=text, vision_config=transformers.SiglipVisionConfig(**vit_dims(shape)),
                                         mm_tokens_per_image=self._tokens(shape),
                                         boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                                         eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
                                         image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"))

    @staticmethod
    def _tokens(shape) -> int:
        """Soft tokens per image: ``extra["mm_tokens_per_image"]``, else the patch grid pooled 2 x 2."""
        return shape.extra.get("mm_tokens_per_image", (shape.image_size // shape.patch // 2) ** 2)

    def processor(self, tok, shape):
        ip = transformers.Gemma3ImageProcessor(size={"height": shape.image_size, "width": shape.image_size},
                                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return transformers.Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=self._tokens(shape),
                                            chat_template=chat_template(self.layout, self.image_marker))
