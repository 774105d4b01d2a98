"""PaliGemma: SigLIP image tokens first, then ``<bos>``, the prompt and a newline; a *prefix-LM*
mask lets the image and the prompt attend to each other bidirectionally (``token_type_ids``: 0 for the
prefix, 1 for the answer), so neither ``is_causal`` nor a causal mask describes what is applied."""
from __future__ import annotations

import torch

from ..core.compat import transformers
from .base import PatchGridImages, VLMFamily, decoder_dims, patch_grid, register, vit_dims


@register
class PaliGemma(PatchGridImages, VLMFamily):
    name = "PaliGemma"
    model_types = ("paligemma",)
    model_class = "PaliGemmaForConditionalGeneration"
    layout = "{image}{question}"  # the processor expands the marker and puts <bos> after the image

    def expected_image_tokens(self, config, inputs):
        pv = inputs.get("pixel_values")
        return None if pv is None else int(pv.shape[0]) * self.image_tokens_per_picture(config)

    def image_tokens_per_picture(self, config):
        rows, cols = patch_grid(config.vision_config)
        return rows * cols

    def position_ids(self, model, input_ids, inputs):
        """PaliGemma numbers positions from 1 (``cache_position + 1``)."""
        ids = torch.as_tensor(input_ids)
        return torch.arange(1, ids.shape[-1] + 1, device=ids.device)[None]

    def context_note(self):
        return ("PaliGemma's prefix-LM mask lets image tokens read the prompt that follows them. With the image "
                "cached before the question arrives they cannot, so answers on the full cache differ from a one-pass "
                "forward; every policy is compared with the full-cache answer, which shares that setting.")

    def config(self, tok, shape):
        return transformers.PaliGemmaConfig(
            vision_config=transformers.SiglipVisionConfig(**vit_dims(shape, projection_dim=shape.hidden)),
            text_config=transformers.GemmaConfig(**decoder_dims(tok, shape)),
            image_token_index=tok.convert_tokens_to_ids("<image>"), projection_dim=shape.hidden, hidden_size=shape.hidden)

    def processor(self, tok, shape):
        ip = transformers.SiglipImageProcessor(size={"height": shape.image_size, "width": shape.image_size})
        ip.image_seq_length = (shape.image_size // shape.patch) ** 2
        return transformers.PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
