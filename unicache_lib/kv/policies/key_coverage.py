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
Each layer chooses for itself (its keys differ); the budget is the same in every layer. How the design was chosen
(on a design set disjoint from every scored set): docs/CACHING.md and ``benchmarks/tune_key_coverage.py``, a sweep
over :class:`KeyCoverage`'s fields.
"""
from dataclasses import dataclass

import torch

from ...core.errors import InputError
from ...inputs import check_fraction, check_number
from .base import EvictionPolicy, greedy_max_min, register, top_k

POINTS = ("keys", "values", "keys+values", "unit_keys")
METRICS = ("euclidean", "cosine")


def farthest_point(x: torch.Tensor, k: int, start: int) -> list[int]:
    """Greedy k-center: ``x [n, F]`` float32; ``k`` indices, the first ``start``, each next the row farthest
    (Euclidean) from its nearest chosen row."""
    return greedy_max_min(torch.cdist(x, x), k, start)


@register
@dataclass(eq=False)
class KeyCoverage(EvictionPolicy):
    """The cover's design choices, as fields (``benchmarks/tune_key_coverage.py`` sweeps them; the defaults are the
    chosen design). ``points``: what is covered, per image position all heads side by side — ``"keys"``, ``"values"``,
    ``"keys+values"`` or ``"unit_keys"`` (each head's key normalised); ``metric``: ``"euclidean"``, or ``"cosine"``
    (the points normalised first); ``anchors``: the share of the budget first given to the most-read positions (the
    cover always starts at the most-read one); ``alpha``: the farthest-point distances weighted by
    ``(reads / max reads) ** alpha`` (0: unweighted)."""

    name = "key_coverage"
    description = "per layer, a k-center cover of the cached image keys, started at the most-read position"

    points: str = "keys"
    metric: str = "euclidean"
    anchors: float = 0.0
    alpha: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        for what, value, allowed in (("points", self.points, POINTS), ("metric", self.metric, METRICS)):
            if value not in allowed:
                raise InputError(f"key_coverage {what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        check_fraction(self.anchors, "key_coverage anchors", meaning="of the budget given to the most-read positions")
        check_number(self.alpha, "key_coverage alpha (the reads' weight on distances)", 0.0, 16.0)

    def choose(self, ctx, k):
        # points_of: [n_image, F], the layer's image keys, all heads side by side
        return [self.cover(self.points_of(*ctx.image_kv(li)), k, ctx.image_reads(li))
                for li in range(ctx.n_layers)]

    def points_of(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``[n_image, F]``: the points covered, from a layer's image ``keys`` / ``values`` ``[H_kv, n_image, D]``."""
        if self.points == "unit_keys":
            keys = torch.nn.functional.normalize(keys, dim=-1)
        x = {"keys": keys, "unit_keys": keys, "values": values, "keys+values": torch.cat([keys, values], -1)}[self.points]
        x = x.permute(1, 0, 2).reshape(x.shape[1], -1)
        return torch.nn.functional.normalize(x, dim=-1) if self.metric == "cosine" else x

    def cover(self, x: torch.Tensor, k: int, reads: torch.Tensor) -> list[int]:
        """``k`` rows of ``x``: the most-read (``reads [n_image]``) first, then the farthest from those kept so far."""
        m = int(round(self.anchors * k))
        if m == 0 and self.alpha == 0:
            return farthest_point(x, k, int(reads.argmax()))
        chosen = [int(i) for i in top_k(reads, max(1, m))]
        d = torch.cdist(x, x)
        near = d[chosen].min(0).values
        w = (reads / reads.max()) ** self.alpha
        while len(chosen) < k:
            s = near * w
            s[chosen] = -1.0
            j = int(s.argmax())
            chosen.append(j)
            near = torch.minimum(near, d[j])
        return chosen[:k]
