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

Its dropping twin is ``key_coverage`` itself: the same positions kept, the evicted ones dropped. The policy's own
:meth:`KeyCoverageMerge.apply` merges after it evicts (``run_eviction`` answers with its ``bias``); the kvpress form is
``PolicyPress(policy=POLICIES["key_coverage_merge"]())``, whose compress calls :meth:`KeyCoverageMerge.compress_layer`
and applies the correction in the forwards that follow inside its ``with`` block.
"""
from dataclasses import dataclass

import torch

from ...families import family_of
from ..cache import Compressed, copy_layers, evict
from ..decode import layer_masks
from .base import kept_index, register
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
        # the kept image positions as indices into the image block, merged
        merged = merge_groups(*ctx.image_kv(li), torch.searchsorted(img, k_pos[is_img]))
        layer = new.layers[cl]
        at = is_img.nonzero().flatten().to(layer.keys.device)  # where they sit in the evicted layer
        layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        bias[cl] = place_merged(layer.keys, layer.values, at, merged)
    return new, bias


def place_merged(keys: torch.Tensor, values: torch.Tensor, at: torch.Tensor, merged: tuple) -> torch.Tensor:
    """Write :func:`merge_groups`' ``merged`` keys and values at positions ``at`` of a layer's ``keys`` / ``values``
    ``[1, H_kv, C, D]`` (in place); returns that layer's attention term ``[C]``: ``log(size)`` at ``at``, 0 elsewhere."""
    keys[0, :, at], values[0, :, at] = merged[0].to(keys.dtype), merged[1].to(values.dtype)
    bias = torch.zeros(keys.shape[-2])
    bias[at.cpu()] = merged[2].log().cpu()  # the groups' sizes
    return bias


def log_size_bias(model, bias: dict[int, torch.Tensor]):
    """:func:`~unicache_lib.kv.decode.layer_masks` with the merge's ``log(size)`` terms (ToMe's proportional attention)
    on the layers in ``bias``."""
    return layer_masks(model, family_of(model), bias)


@register
@dataclass(eq=False)
class KeyCoverageMerge(KeyCoverage):
    """``key_coverage`` (the same fields, the same kept positions), merging what it does not keep."""

    name = "key_coverage_merge"
    description = ("key_coverage's kept positions, each evicted image key/value merged into its nearest kept one "
                   "(size-weighted mean, log-size attention)")

    def apply(self, model, pre, ctx, budget) -> Compressed:
        """Evict as ``key_coverage``, then merge each evicted image key and value into its nearest kept one
        (:func:`merge_cache`); the answer adds ``log(size)`` to the merged keys' logits (``bias``)."""
        keep = self.select(ctx, budget)
        cache, bias = merge_cache(ctx, evict(pre.cache, keep), keep)
        return Compressed(cache, pre.split, keep, bias)

    def compress_layer(self, keys, values, img, chosen) -> tuple:
        """In a press: the layer's kept image positions become their groups' means (:func:`merge_groups`), and the
        layer's ``log(size)`` term is returned for the forwards that follow."""
        idx = kept_index(keys.shape[2], img, chosen)
        merged = merge_groups(keys[0].index_select(1, img), values[0].index_select(1, img),
                              torch.as_tensor(sorted(chosen), device=keys.device))
        keys, values = keys.index_select(2, idx), values.index_select(2, idx)
        at = torch.isin(idx, img).nonzero().flatten()  # the kept image positions, in order, in the compressed layer
        return keys, values, place_merged(keys, values, at, merged)
