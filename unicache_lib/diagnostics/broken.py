"""Deliberately broken variants of a vision-language model, for testing the neglect detector.

Each is a context manager that restores the model on exit (also on error):
``zero_image_features`` (the projector's output replaced by zeros), ``mask_image_attention``
(from layer ``k`` on, text queries may not attend to image keys; for a cross-attention VLM, the
cross-attention layers from ``k`` on are cut off: their output is gated to zero); a blank image is a
change of input, :func:`blank_image`. Which module is the projector and where the image sits come
from the model's family adapter.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import numpy as np
import torch

from ..capture.vlm import find_attention_modules


@contextmanager
def zero_image_features(model):
    from ..families import family_of

    proj = family_of(model).projector(model)
    h = proj.register_forward_hook(lambda m, a, out: torch.zeros_like(out))
    try:
        yield model
    finally:
        h.remove()


def blank_image(image: np.ndarray) -> np.ndarray:
    """The image with every pixel set to its mean colour (no objects, same statistics)."""
    return np.broadcast_to(image.reshape(-1, image.shape[-1]).mean(0).astype(image.dtype), image.shape).copy()


@contextmanager
def mask_image_attention(model, from_layer: int):
    """Text queries cannot attend to image keys in layers >= ``from_layer`` (eager attention)."""
    from ..families import family_of

    fam = family_of(model)
    if fam.cross_attention:
        with _gate_cross_attention(model, fam, from_layer):
            yield model
        return
    state = {}

    def see_ids(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        state["img"] = None if ids is None else torch.as_tensor(
            fam.spans(model.config, ids[:1], kwargs).array == 1, device=ids.device)

    def block(module, args, kwargs):
        img = state.get("img")
        hs = kwargs.get("hidden_states", args[0] if args else None)
        if img is None or hs is None or hs.shape[1] != img.shape[0]:
            return None
        S = hs.shape[1]
        m = kwargs.get("attention_mask")
        neg = torch.finfo(hs.dtype).min
        if m is None or m.dim() != 4:
            m = torch.triu(torch.full((S, S), neg, dtype=hs.dtype, device=hs.device), 1)[None, None]
        m = m.clone()
        text_rows = ~img
        m[..., text_rows.nonzero().flatten()[:, None], img.nonzero().flatten()[None, :]] = (
            False if m.dtype == torch.bool else neg)
        kwargs["attention_mask"] = m
        return args, kwargs

    with ExitStack() as stack:
        stack.callback(model.register_forward_pre_hook(see_ids, with_kwargs=True).remove)
        for name, (layer, mod) in find_attention_modules(model, "language").items():
            if layer >= from_layer:
                stack.callback(mod.register_forward_pre_hook(block, with_kwargs=True).remove)
        yield model


@contextmanager
def _gate_cross_attention(model, fam, from_layer: int):
    """A cross-attention VLM's cut-off: every cross-attention layer from ``from_layer`` on reads the
    image for no token (its row gate is zero, as for text before the image)."""
    def gate(module, args, kwargs):
        g = kwargs.get("full_text_row_masked_out_mask")
        if g is not None:
            kwargs["full_text_row_masked_out_mask"] = torch.zeros_like(g)
        return args, kwargs

    with ExitStack() as stack:
        for i, layer in enumerate(fam.language_model(model).layers):
            if i >= from_layer and hasattr(layer, "cross_attn"):
                stack.callback(layer.register_forward_pre_hook(gate, with_kwargs=True).remove)
        yield model
