"""Key coverage: per layer, keep image keys that cover the space of that layer's cached image keys.

Designed from the workbook's own measurements. Notebook 02: a question's read of the image piles onto one
object (the most-read positions are a few patches of it), and which object depends on the question, which
has not arrived when the cache is compressed. Notebook 05: attention-score rules (H2O, SnapKV, the study's
rule, even the oracle at 10%) keep several patches of the same object and none of the others; keeping the
*largest*-norm keys beats keeping the smallest. So: a later query can only find what some kept key still
resembles. Per layer, take the cached image keys (after the rotary embedding, all heads concatenated:
``[n_image, H_kv * D]``), start at the position the context reads most (the anchor) and add, greedily, the key
farthest (Euclidean) from every key kept so far — a k-center cover of the key space, in which large-norm,
unusual keys (the objects) come early and one key stands for each cluster of near-identical background keys.
Each layer chooses for itself (its keys differ); the budget is the same in every layer.

Tuned on a design set disjoint from every scored set — ``heldout_set(100, seed=7000)`` of
:mod:`unicache_lib.zoo.train.llava` on ``tiny-llava``, budgets 5/10/25% (``benchmarks/tune_key_coverage.py``
prints the grid): keys alone beat keys+values, values alone, cosine distance, per-head normalised keys, a
larger anchor set and read-weighted distances.
"""
import torch

from .base import EvictionPolicy, greedy_max_min, register


def farthest_point(x: torch.Tensor, k: int, start: int) -> list[int]:
    """Greedy k-center: ``x [n, F]`` float32; ``k`` indices, the first ``start``, each next the row farthest
    (Euclidean) from its nearest chosen row."""
    return greedy_max_min(torch.cdist(x, x), k, start)


@register
class KeyCoverage(EvictionPolicy):
    name = "key_coverage"
    description = "per layer, a k-center cover of the cached image keys, started at the most-read position"

    def choose(self, ctx, k):
        out = []
        for li in range(ctx.n_layers):
            keys, _ = ctx.image_kv(li)  # [H_kv, n_image, D]
            x = keys.permute(1, 0, 2).reshape(ctx.n_image, -1)
            out.append(farthest_point(x, k, int(ctx.image_reads(li).argmax())))
        return out
