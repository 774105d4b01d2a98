"""Merge, don't only drop: ``key_coverage``'s kept image positions, with every evicted image key and value folded into
the kept one it is closest to, as token merging does (Bolya et al., ToMe, ICLR 2023).

Per layer, after the cover has chosen the ``k`` positions to keep: each evicted image key goes to its nearest kept key
(Euclidean, all key heads side by side: the geometry the cover chose in), and each kept position becomes the
size-weighted mean of its group (keys and values alike; every token starts with size 1, so the mean of the group)
with its size carried. A later query's attention to a merged key gets ``+ log(size)`` on its logit (ToMe's
proportional attention): a group of ``m`` identical keys and values then draws exactly the attention its ``m``
copies drew (tested), so merging loses nothing where the evicted keys repeat the kept ones, and otherwise stands in
for them with their mean. The correction is an additive term on each layer's attention mask, added by a forward
pre-hook on the language model's attention modules (:func:`log_size_bias`) for the question's forwards, and removed
on exit.

Its dropping twin is ``key_coverage`` itself: the same positions kept, the evicted ones dropped. The harness
(``run_eviction``) merges after it evicts, for a policy with ``merges = True``; the kvpress form is
``PolicyPress(policy=POLICIES["key_coverage_merge"]())``, which merges in kvpress's compress and applies the
correction in the forwards that follow inside its ``with`` block.
"""
from __future__ import annotations

import contextlib

import torch

from ...core.errors import InputError
from ...core.hooks import forward_hooks
from ...families import family_of
from .base import copy_layers, register
from .key_coverage import KeyCoverage


def merge_groups(keys: torch.Tensor, values: torch.Tensor, kept) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``keys`` / ``values`` ``[H_kv, n, D]`` of the image positions, ``kept`` (``k`` indices into them) ->
    ``(keys [H_kv, k, D], values [H_kv, k, D], sizes [k])``: each index not kept joins the kept one nearest to it
    (Euclidean over the heads' keys side by side; ties to the earlier kept index), each kept position the mean of its
    group, ``sizes`` how many positions each group holds (they add up to ``n``). float32 arithmetic, returned in the
    inputs' dtype."""
    h, n, d = keys.shape
    kept = torch.as_tensor(kept, dtype=torch.long, device=keys.device).reshape(-1)
    x = keys.float().permute(1, 0, 2).reshape(n, h * d)
    group = torch.cdist(x, x[kept]).argmin(1)  # [n]: the kept slot each position joins
    group[kept] = torch.arange(len(kept), device=keys.device)  # a kept position is its own group's seed
    sizes = torch.zeros(len(kept), device=keys.device).index_add_(0, group, torch.ones(n, device=keys.device))

    def mean(t):
        s = torch.zeros(h, len(kept), d, device=t.device).index_add_(1, group, t.float())
        return (s / sizes[None, :, None]).to(t.dtype)
    return mean(keys), mean(values), sizes


def merge_cache(ctx, cache, keep: list) -> tuple[object, dict[int, torch.Tensor]]:
    """The evicted ``cache`` (``evict(pre.cache, keep)``) with each layer's kept image keys and values replaced by their
    groups' means (:func:`merge_groups` over the context's image KV, ``ctx``), and per cache layer the additive
    attention term over its positions: ``log(size)`` at each kept image position, 0 elsewhere. The cache is a copy."""
    img = ctx.image_positions
    new = copy_layers(cache)
    bias = {}
    layers = ctx.cache_layers if ctx.cache_layers is not None else list(range(ctx.n_layers))
    for li, cl in enumerate(layers):
        k_pos = torch.as_tensor(keep[cl], dtype=torch.long).sort().values
        is_img = torch.isin(k_pos, img)
        chosen = torch.searchsorted(img, k_pos[is_img])  # kept image positions as indices into the image block
        merged = merge_groups(*ctx.image_kv(li), chosen)
        layer = new.layers[cl]
        at = is_img.nonzero().flatten().to(layer.keys.device)  # where they sit in the evicted layer
        layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        bias[cl] = place_merged(layer.keys, layer.values, at, merged)
    return new, bias


def place_merged(keys: torch.Tensor, values: torch.Tensor, at: torch.Tensor, merged: tuple) -> torch.Tensor:
    """Write :func:`merge_groups`' ``merged`` keys and values at positions ``at`` of a layer's ``keys`` / ``values``
    ``[1, H_kv, C, D]`` (in place); returns that layer's attention term ``[C]``: ``log(size)`` at ``at``, 0 elsewhere."""
    mk, mv, sizes = merged
    keys[0, :, at], values[0, :, at] = mk.to(keys.dtype), mv.to(values.dtype)
    bias = torch.zeros(keys.shape[-2])
    bias[at.cpu()] = sizes.log().cpu()
    return bias


@contextlib.contextmanager
def layer_masks(model, bias: dict[int, torch.Tensor] | None = None, every_layer: bool = False):
    """While open, the language model's self-attention in layer ``l`` gets a mask of its own: sized to the keys *that
    layer* holds (a cache whose layers keep different counts, :mod:`~.depth`: the model builds one mask for the first
    layer's length, so a layer of another length gets its own causal mask; batch 1, no padding), plus
    ``bias[l]`` (``[C]`` or ``[B, C]``: one term per cached position, the first ``C`` keys; keys beyond get 0; read at
    each call). A layer is touched when it has a term, or always with ``every_layer``. A missing mask (sdpa without
    padding) is made causal first, a boolean one additive. The hooks are removed on exit, even on error."""
    bias = {} if bias is None else bias
    sites = {s.layer: s.module for s in family_of(model).sites(model, ("language",))}
    missing = sorted(set(bias) - set(sites))
    if missing:
        raise InputError(f"log_size_bias: no self-attention module in layers {missing}")

    def hook_for(layer):
        def pre(module, args, kwargs):
            if layer not in bias and not every_layer:  # read at call time: a press fills it while its prefill runs
                return args, kwargs
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            q = hidden.shape[1]
            cache = kwargs.get("past_key_values")
            keys = getattr(cache.layers[layer], "keys", None) if cache is not None and len(cache.layers) > layer else None
            held = 0 if keys is None else keys.shape[-2]  # (a layer not yet filled holds nothing)
            mask = kwargs.get("attention_mask")
            dtype = hidden.dtype
            low = torch.finfo(dtype).min
            if mask is None or mask.shape[-1] != held + q:  # none, or built for another layer's length (ragged)
                if mask is not None and mask.shape[0] > 1:
                    raise InputError(f"layer {layer} holds {held} positions but the batch's mask covers "
                                     f"{mask.shape[-1] - q}: caches of different lengths per layer run one at a time")
                kv = held + q
                allowed = torch.arange(kv, device=hidden.device)[None, :] <= held + torch.arange(q, device=hidden.device)[:, None]
                mask = torch.zeros(1, 1, q, kv, dtype=dtype, device=hidden.device).masked_fill(~allowed, low)
            elif mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, low)
            if layer in bias:
                b = bias[layer].to(mask.device, mask.dtype)
                b = b.reshape(-1, 1, 1, b.shape[-1])
                if b.shape[-1] > mask.shape[-1]:
                    raise InputError(f"log_size_bias: layer {layer} has a term for {b.shape[-1]} positions but attends "
                                     f"over {mask.shape[-1]}")
                pad = torch.zeros(b.shape[0], 1, 1, mask.shape[-1] - b.shape[-1], dtype=mask.dtype, device=mask.device)
                mask = mask + torch.cat([b, pad], -1)
            kwargs["attention_mask"] = mask
            return args, kwargs
        return pre

    with forward_hooks([(m, "forward_pre", hook_for(li)) for li, m in sites.items()]):
        yield


def log_size_bias(model, bias: dict[int, torch.Tensor]):
    """:func:`layer_masks` with the merge's ``log(size)`` terms (ToMe's proportional attention) on the layers in
    ``bias``."""
    return layer_masks(model, bias)


@register
class KeyCoverageMerge(KeyCoverage):
    name = "key_coverage_merge"
    description = ("key_coverage's kept positions, each evicted image key/value merged into its nearest kept one "
                   "(size-weighted mean, log-size attention)")
    merges = True
