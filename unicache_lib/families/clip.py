"""CLIP: two towers that never attend to each other. The text tower (causal, pooled at its end token) and the
image tower (a class token plus patches, pooled at the class token) meet only in the similarity of their
projected, normalised embeddings (``logits_per_image``).

Captured parts: ``language`` = the text tower, ``vision`` = the image tower (class token at position 0,
then the patch grid). There are no image keys in the text tower, so its four-block statistics are all
text; what the study asks of a dual tower (key-region focus, A4) is read from the image tower's
class-token row (:func:`unicache_lib.analysis.architectures.cls_focus`).
"""
from __future__ import annotations

import torch

from ..core.compat import transformers
from ..core.modality import TEXT, Spans
from ..zoo.tiny_llava import build_tokenizer
from .base import PatchGridImages, Shape, UnsupportedModelError, VLMFamily, register, vit_dims


@register
class Clip(PatchGridImages, VLMFamily):
    """CLIP (``openai/clip-vit-base-patch32``: 7 x 7 patches + class token, 77-token text)."""

    name = "CLIP"
    model_types = ("clip",)
    model_class = "CLIPModel"
    image_marker = None
    special_tokens = ()
    token_fields = ()
    layout = "{question}"
    grid_offset = 1  # the image tower's class token, then the patch grid

    def language_model(self, model):
        return model.text_model.encoder

    def vision_model(self, model):
        return model.vision_model

    def projector(self, model):
        return model.visual_projection

    def image_token_id(self, config):
        raise UnsupportedModelError("CLIP has no image token: the image goes to its own tower")

    def spans(self, config, input_ids, inputs=None):
        """The text tower's sequence: text only."""
        return Spans((TEXT,) * torch.as_tensor(input_ids).shape[-1])

    def config(self, tok, shape: Shape):
        proj = shape.extra.get("projection_dim", shape.hidden)
        text = dict(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                    num_hidden_layers=shape.layers, num_attention_heads=shape.heads, max_position_embeddings=32,
                    pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                    projection_dim=proj)
        return transformers.CLIPConfig(text_config=text, vision_config=vit_dims(shape, projection_dim=proj),
                                       projection_dim=proj)

    def tokenizer(self):
        """The world tokenizer closing every text with ``</s>``, where the text tower pools."""
        tok = build_tokenizer(close=True)
        tok.padding_side = "right"
        return tok

    def processor(self, tok, shape: Shape):
        s = shape.image_size
        ip = transformers.CLIPImageProcessor(size={"shortest_edge": s}, crop_size={"height": s, "width": s},
                                             image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return transformers.CLIPProcessor(image_processor=ip, tokenizer=tok)
