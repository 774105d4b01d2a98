"""Deliberately broken variants of a vision-language model, for testing the neglect detector.

Each is a context manager that restores the model on exit (also on error):
``zero_image_features`` (the projector's output replaced by zeros: image tokens carry nothing),
``zero_image_values`` (from layer ``k`` on, reading an image key returns nothing),
``mask_image_attention`` (from layer ``k`` on, text queries may not attend to image keys: caught
by construction, since it forces the image share of the text queries' reads to 0); a blank image is a change of
input, :func:`blank_image`. :func:`hide_keys` is the general per-layer attention mask underneath.

Which module is the projector and which positions are image tokens come from the model's family
adapter. For a cross-attention VLM (Mllama) the image is read only by the cross-attention layers:
"masking image attention" there gates those layers' output to zero (as for text before the image),
and "zeroing image values" zeroes their value vectors.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from ..capture.vlm import find_attention_modules
from ..core.hooks import forward_hooks
from ..families import family_of


@contextmanager
def zero_image_features(model):
    with forward_hooks([(family_of(model).projector(model), "forward", lambda m, a, k, out: torch.zeros_like(out))]):
        yield model


def blank_image(image: np.ndarray) -> np.ndarray:
    """The image with every pixel set to its mean colour (no objects, same statistics)."""
    return np.broadcast_to(image.reshape(-1, image.shape[-1]).mean(0).astype(image.dtype), image.shape).copy()


def _track_image(model) -> tuple[dict, tuple]:
    """``(state, hook)``: ``hook``, a pre-hook on ``model`` for :func:`~unicache_lib.core.hooks.forward_hooks`, keeps
    each forward's image tokens, bool ``[S]`` of the self-attention sequence, in ``state["img"]`` (None without
    ``input_ids``)."""
    fam = family_of(model)
    state: dict = {}

    def see(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        state["img"] = None if ids is None else torch.as_tensor(fam.spans(model.config, ids[:1], kwargs).array == 1,
                                                                  device=ids.device)

    return state, (model, "forward_pre", see)


@contextmanager
def hide_keys(model, hidden):
    """Hide (query, key) pairs from the language model's self-attention, per layer: ``hidden(layer,
    image [S] bool) -> bool [S, S]`` (True = the query may not read that key) or ``None`` (layer
    untouched). Applies to full forwards (the prompt fed at once), not to cached decode steps."""
    def block(layer, module, args, kwargs):
        img = state.get("img")
        hs = kwargs.get("hidden_states", args[0] if args else None)
        if img is None or hs is None or hs.shape[1] != img.shape[0]:
            return None
        hide = hidden(layer, img)
        if hide is None:
            return None
        m = kwargs.get("attention_mask")
        neg = torch.finfo(hs.dtype).min
        if m is None or m.dim() != 4:
            m = torch.triu(torch.full((hs.shape[1],) * 2, neg, dtype=hs.dtype, device=hs.device), 1)[None, None]
        hide = hide.to(m.device)
        kwargs["attention_mask"] = m & ~hide if m.dtype == torch.bool else m.masked_fill(hide, neg)
        return args, kwargs

    state, track = _track_image(model)
    with forward_hooks([track] + [(mod, "forward_pre", lambda m, a, k, layer=layer: block(layer, m, a, k))
                                  for name, (layer, mod) in find_attention_modules(model, "language").items()
                                  if not name.endswith("cross_attn")]):
        yield model


@contextmanager
def mask_image_attention(model, from_layer: int):
    """Text queries cannot attend to image keys in layers >= ``from_layer`` (eager attention). Caught by
    construction: it forces the image share of the text queries' reads to 0, so a detector of low shares sees it."""
    fam = family_of(model)
    with (_gate_cross_attention(model, fam, from_layer) if fam.cross_attention else
          hide_keys(model, lambda layer, img: None if layer < from_layer else (~img)[:, None] & img[None, :])):
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

    with forward_hooks([(layer, "forward_pre", gate) for i, layer in enumerate(fam.language_model(model).layers)
                        if i >= from_layer and hasattr(layer, "cross_attn")]):
        yield model


@contextmanager
def zero_image_values(model, from_layer: int):
    """From layer ``from_layer`` on, the value vectors of image positions are zero: text still
    *attends* to the image keys at its usual rates, but reading them returns nothing (a modality
    cut-off that attention shares cannot see). Prefill only (a forward that contains the image).
    Cross-attention layers: every key is a vision token, so all their values are zeroed."""
    def zero(module, args, kwargs, out):
        img = state.get("img")
        return None if img is None or out.shape[1] != img.shape[0] else \
            out.masked_fill(img[None, :, None].to(out.device), 0.0)

    state, track = _track_image(model)
    with forward_hooks([track] + [(mod.v_proj, "forward", (lambda m, a, k, out: torch.zeros_like(out))
                                   if name.endswith("cross_attn") else zero)
                                  for name, (layer, mod) in find_attention_modules(model, "language").items()
                                  if layer >= from_layer]):
        yield model
