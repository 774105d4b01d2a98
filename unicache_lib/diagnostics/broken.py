"""Deliberately broken variants of a LLaVA-style model, for testing the neglect detector.

Each is a context manager that restores the model on exit (also on error):
``zero_image_features`` (the projector's output replaced by zeros: image tokens carry nothing),
``zero_image_values`` (from layer ``k`` on, reading an image key returns nothing),
``mask_image_attention`` (from layer ``k`` on, text queries may not attend to image keys: caught
by construction, since it forces the text->image share to 0); a blank image is a change of input,
:func:`blank_image`. :func:`hide_keys` is the general per-layer attention mask underneath.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import numpy as np
import torch

from ..capture.vlm import find_attention_modules


@contextmanager
def zero_image_features(model):
    proj = model.model.multi_modal_projector
    h = proj.register_forward_hook(lambda m, a, out: torch.zeros_like(out))
    try:
        yield model
    finally:
        h.remove()


def blank_image(image: np.ndarray) -> np.ndarray:
    """The image with every pixel set to its mean colour (no objects, same statistics)."""
    return np.broadcast_to(image.reshape(-1, image.shape[-1]).mean(0).astype(image.dtype), image.shape).copy()


@contextmanager
def hide_keys(model, hidden):
    """Hide (query, key) pairs from the language model's eager attention, per layer: ``hidden(layer,
    input_ids [S]) -> bool [S, S]`` (True = the query may not read that key) or ``None`` (layer
    untouched). Applies to full forwards (the prompt fed at once), not to cached decode steps."""
    state = {}

    def see_ids(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        state["ids"] = None if ids is None else ids[0]

    def block(layer, module, args, kwargs):
        ids = state.get("ids")
        hs = kwargs.get("hidden_states", args[0] if args else None)
        if ids is None or hs is None or hs.shape[1] != ids.shape[0]:
            return None
        hide = hidden(layer, ids)
        if hide is None:
            return None
        S = hs.shape[1]
        m = kwargs.get("attention_mask")
        neg = torch.finfo(hs.dtype).min
        if m is None or m.dim() != 4:
            m = torch.triu(torch.full((S, S), neg, dtype=hs.dtype, device=hs.device), 1)[None, None]
        kwargs["attention_mask"] = m.masked_fill(hide.to(m.device), neg)
        return args, kwargs

    with ExitStack() as stack:
        stack.callback(model.register_forward_pre_hook(see_ids, with_kwargs=True).remove)
        for name, (layer, mod) in find_attention_modules(model).items():
            stack.callback(mod.register_forward_pre_hook(lambda m, a, k, layer=layer: block(layer, m, a, k), with_kwargs=True).remove)
        yield model


def mask_image_attention(model, from_layer: int):
    """Text queries cannot attend to image keys in layers >= ``from_layer`` (eager attention).
    Caught by construction: it forces the text->image share to 0, so a detector of low shares sees it."""
    tid = model.config.image_token_id

    def hidden(layer, ids):
        if layer < from_layer:
            return None
        img = ids == tid
        return (~img)[:, None] & img[None, :]

    return hide_keys(model, hidden)


@contextmanager
def zero_image_values(model, from_layer: int):
    """From layer ``from_layer`` on, the value vectors of image positions are zero: text still
    *attends* to the image keys at its usual rates, but reading them returns nothing (a modality
    cut-off that attention shares cannot see). Prefill only (a forward that contains the image)."""
    tid = model.config.image_token_id
    state = {}

    def see_ids(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        state["img"] = None if ids is None else (ids[0] == tid)

    def zero(module, args, out):
        img = state.get("img")
        if img is None or out.shape[1] != img.shape[0]:
            return None
        return out.masked_fill(img[None, :, None].to(out.device), 0.0)

    with ExitStack() as stack:
        stack.callback(model.register_forward_pre_hook(see_ids, with_kwargs=True).remove)
        for name, (layer, mod) in find_attention_modules(model).items():
            if layer >= from_layer:
                stack.callback(mod.v_proj.register_forward_hook(zero).remove)
        yield model
