"""PaliGemma: SigLIP image tokens first, then ``<bos>``, the prompt and a newline; a *prefix-LM*
mask lets the image and the prompt attend to each other bidirectionally (``token_type_ids``: 0 for the
prefix, 1 for the answer), so neither ``is_causal`` nor a causal mask describes what is applied."""
from __future__ import annotations

import torch

from .base import VLMFamily, register, transformers


@register
class PaliGemma(VLMFamily):
    name = "PaliGemma"
    model_types = ("paligemma",)
    model_class = "PaliGemmaForConditionalGeneration"
    layout = "{image}{question}"  # the processor expands the marker and puts <bos> after the image

    def expected_image_tokens(self, config, inputs):
        pv = inputs.get("pixel_values")
        return None if pv is None else int(pv.shape[0]) * self.image_tokens_per_picture(config)

    def image_tokens_per_picture(self, config):
        v = config.vision_config
        return (v.image_size // v.patch_size) ** 2

    def image_grid(self, config, inputs):
        v = config.vision_config
        side = v.image_size // v.patch_size
        return (side, side)

    def position_ids(self, model, input_ids, inputs):
        """PaliGemma numbers positions from 1 (``cache_position + 1``)."""
        S = torch.as_tensor(input_ids).shape[-1]
        return torch.arange(1, S + 1, device=torch.as_tensor(input_ids).device)[None]

    def context_note(self):
        return ("PaliGemma's prefix-LM mask lets image tokens read the prompt that follows them. With the image "
                "cached before the question arrives they cannot, so answers on the full cache differ from a one-pass "
                "forward; every policy is compared with the full-cache answer, which shares that setting.")

    def config(self, tok, shape):
        text = transformers.GemmaConfig(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                           num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                           num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        vc = transformers.SiglipVisionConfig(hidden_size=shape.vision_hidden, intermediate_size=4 * shape.vision_hidden,
                                num_hidden_layers=shape.vision_layers, num_attention_heads=shape.vision_heads,
                                image_size=shape.image_size, patch_size=shape.patch, projection_dim=shape.hidden)
        return transformers.PaliGemmaConfig(vision_config=vc, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                               projection_dim=shape.hidden, hidden_size=shape.hidden)

    def processor(self, tok, shape):
        ip = transformers.SiglipImageProcessor(size={"height": shape.image_size, "width": shape.image_size})
        ip.image_seq_length = (shape.image_size // shape.patch) ** 2
        return transformers.PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
