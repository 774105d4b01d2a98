"""ViLT: one encoder over the concatenation ``[text tokens | image class token, image patches]``; the two
modalities are told apart only by position and modality-type embeddings (single-stream fusion).

ViLT's own embedding step draws the image patches in a *random order* on every call
(``torch.multinomial`` over the valid patches), so the i-th image position is not the i-th grid cell.
Attention shares per modality do not depend on that order, but anything laid out over the picture does:
:func:`grid_ordered` gives inputs whose image positions are the grid in row-major order (the model's
output is the same up to float rounding, the encoder being permutation-equivariant over them), and
capture refuses a grid for inputs without it.
"""
from __future__ import annotations

import torch

from ..core.compat import transformers
from ..core.errors import InputError
from ..core.modality import IMAGE, TEXT, Spans
from ..world.text import ANSWERS
from .base import Shape, Site, UnsupportedModelError, VLMFamily, module_names, patch_grid, register


def grid_ordered(model, inputs: dict) -> dict:
    """``inputs`` (the processor's: ``input_ids``, ``pixel_values``, ``pixel_mask``, ...) with ``image_embeds``
    ``[B, 1 + patches, d]`` in row-major grid order (class token first) and ``pixel_mask`` ``[B, 1 + patches]``
    in place of the pixels, so position ``n_text + 1 + r * cols + c`` is grid cell ``(r, c)``."""
    emb = _vilt(model).embeddings
    px = inputs["pixel_values"]
    pm = inputs.get("pixel_mask")
    if pm is None:
        pm = torch.ones(px.shape[0], px.shape[-2], px.shape[-1], dtype=torch.long, device=px.device)
    x, x_mask, (patch_index, (h, w)) = emb.visual_embed(px, pm, max_image_length=-1)
    if bool((x_mask == 0).any()):
        raise InputError("grid_ordered: the image has padded patches (pixel_mask zeros); pass one unpadded image per row")
    order = (patch_index[..., 0] * w + patch_index[..., 1]).argsort(-1)  # [B, patches]
    idx = torch.cat([torch.zeros_like(order[:, :1]), order + 1], 1)  # class token first
    x = torch.gather(x, 1, idx[..., None].expand(-1, -1, x.shape[-1]))
    return ({k: v for k, v in inputs.items() if k not in ("pixel_values", "pixel_mask")}
            | {"image_embeds": x, "pixel_mask": torch.ones_like(x_mask)})


def _vilt(model):
    return model.vilt if hasattr(model, "vilt") else model


@register
class Vilt(VLMFamily):
    """ViLT (``dandelin/vilt-b32-finetuned-vqa``): text tokens then 1 + patches image tokens in one BERT-style
    encoder; no decoder, no KV cache. Captured part: ``language`` (the single stream, text and image
    spans); ``vision`` does not exist. ViLT computes attention inside its own module (no attention
    interface), so capture modes are ``stats`` and ``full`` (weights asked for with ``output_attentions``)."""

    name = "ViLT"
    model_types = ("vilt",)
    model_class = "ViltForQuestionAnswering"
    image_marker = None  # the image is not in the text
    special_tokens = ()
    token_fields = ("token_type_ids",)
    layout = "{question}"
    attention_interface = False
    weights_argument = (2, "output_attentions")  # ViltSelfAttention(hidden, mask, output_attentions)
    grid_offset = 1  # the image's class token, then the patches

    def canonical_inputs(self, model, inputs):
        """Grid-ordered image patches (:func:`grid_ordered`), so image position ``1 + r * cols + c`` is cell (r, c)."""
        return grid_ordered(model, inputs) if inputs.get("pixel_values") is not None else inputs

    def language_model(self, model):
        return _vilt(model).encoder

    def vision_model(self, model):
        raise UnsupportedModelError("ViLT has no separate vision tower: image patches are embedded into the one stream")

    def projector(self, model):
        return _vilt(model).embeddings.patch_embeddings

    def sites(self, model, parts=("language",)):
        if not {"language", "cross"} & set(parts) and "vision" in parts:
            raise UnsupportedModelError("ViLT has no vision tower to capture: use part='language' (the single stream)")
        if "language" not in parts:
            return []
        names = module_names(model)
        return [Site(names[id(layer.attention.attention)], i, "language", layer.attention.attention)
                for i, layer in enumerate(self.language_model(model).layer)]

    def image_token_id(self, config):
        raise UnsupportedModelError("ViLT has no image token: the image follows the text in the stream")

    def n_image(self, config, inputs: dict) -> int:
        """Image positions of the stream: the class token plus one per valid patch."""
        if inputs.get("image_embeds") is not None:
            return int(inputs["image_embeds"].shape[1])
        px = inputs.get("pixel_values")
        if px is None:
            raise InputError("ViLT inputs carry neither pixel_values nor image_embeds")
        pm = inputs.get("pixel_mask")
        p = config.patch_size
        return 1 + ((px.shape[-2] // p) * (px.shape[-1] // p) if pm is None else int(torch.nn.functional.interpolate(
            pm[:1, None].float(), size=(px.shape[-2] // p, px.shape[-1] // p)).sum()))

    def spans(self, config, input_ids, inputs=None):
        """``[text tokens | image class token, patches]``."""
        return Spans((TEXT,) * torch.as_tensor(input_ids).shape[-1] + (IMAGE,) * self.n_image(config, inputs or {}))

    def image_grid(self, config, inputs):
        px = inputs.get("pixel_values")
        return patch_grid(config) if px is None else (px.shape[-2] // config.patch_size, px.shape[-1] // config.patch_size)

    def grid_tokens(self, config, inputs):
        """The grid cells within the image span (after its class token), only for grid-ordered inputs: ViLT's own
        embedding draws its patches in random order."""
        if inputs.get("image_embeds") is None:
            raise InputError("ViLT draws its image patches in a random order on every forward, so image position i is "
                             "not grid cell i: run the model on unicache_lib.families.vilt.grid_ordered(model, inputs) "
                             "to lay attention over the picture")
        return super().grid_tokens(config, inputs)

    def config(self, tok, shape: Shape):
        labels = shape.extra.get("labels") or sorted({a for v in ANSWERS.values() for a in v})
        return transformers.ViltConfig(vocab_size=len(tok), hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                                       num_attention_heads=shape.heads, intermediate_size=4 * shape.hidden,
                                       image_size=shape.image_size, patch_size=shape.patch, max_position_embeddings=40,
                                       max_image_length=-1, pad_token_id=tok.pad_token_id, num_labels=len(labels),
                                       id2label=dict(enumerate(labels)), label2id={a: i for i, a in enumerate(labels)})

    def processor(self, tok, shape: Shape):
        ip = transformers.ViltImageProcessor(size={"shortest_edge": shape.image_size}, size_divisor=shape.patch,
                                             image_mean=[0.5] * 3, image_std=[0.5] * 3)
        tok.padding_side = "right"
        return transformers.ViltProcessor(image_processor=ip, tokenizer=tok)
