"""Image pooling, a control: average the projected image features over a coarser grid before the prefill.

Visual-token compression benchmarks found that simply downsampling the image beats many published pruning
methods (VTC-Bench, arXiv 2510.07143), so every eviction method here is compared with it at the same token
budget. The ``g x g`` grid of image tokens (the features the language model receives) is average-pooled to
``a x b`` cells with ``a = floor(sqrt(k))``, ``b = floor(k / a)`` (adaptive windows, as
``torch.nn.functional.adaptive_avg_pool2d`` lays them out), so at most ``k`` tokens stay: 2 x 2 pooling of
LLaVA's 24 x 24 grid at 25%, about 3 x 3 at 10%. Each pooled token takes the position of its window's centre
patch (``renumber=False``, as DivPrune runs here; the shipped ``tiny-llava`` does not tolerate shifted
positions). A prefill-stage policy: the prefill runs on the pooled tokens only.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...core.errors import InputError
from .base import PrefillStagePolicy, register


def pooled_grid(side: int, k: int) -> tuple[int, int]:
    """``(rows, cols)`` of the pooled grid: at most ``k`` cells, as square as possible, never finer than ``side``."""
    a = max(1, min(side, math.isqrt(max(k, 1))))
    return a, max(1, min(side, k // a))


def window_centres(side: int, n: int) -> torch.Tensor:
    """``[n]`` centre row (or column) of each of ``n`` adaptive pooling windows over ``side`` cells."""
    # window i spans [floor(i * side / n), ceil((i + 1) * side / n)), as adaptive_avg_pool2d lays it out
    return torch.tensor([((i * side) // n + -((-(i + 1) * side) // n) - 1) // 2 for i in range(n)])


def grid_side(ctx, refusal: Exception) -> int:
    """Side of the square grid the image tokens tile over the picture; ``refusal`` is raised when they form none
    (tiles, newline tokens). Shared by the controls that shrink the picture to a coarser grid."""
    if ctx.grid is None or math.isqrt(len(ctx.grid)) ** 2 != len(ctx.grid):
        raise refusal
    return math.isqrt(len(ctx.grid))


def window_positions(ctx, side: int, a: int, b: int) -> list[int]:
    """Indices into the image block of the centre patch of each of the ``a x b`` windows, row-major."""
    return ctx.grid.cpu()[(window_centres(side, a)[:, None] * side + window_centres(side, b)[None, :]).reshape(-1)].tolist()


@register
@dataclass(eq=False)
class ImagePooling(PrefillStagePolicy):
    name, exact_budget = "pooling", False
    description = "control: average-pool the image features to a coarser grid (at most the budget), before the prefill"

    renumber: bool = False

    def choose(self, ctx, k):
        side = grid_side(ctx, InputError("image pooling needs the image tokens as one square grid over the picture; this "
                                         "family's are not (tiles, newline tokens): pooling is not measurable here"))
        a, b = pooled_grid(side, k)
        feats = ctx.features[ctx.grid.to(ctx.features.device)].float()  # [side * side, D], row-major
        pooled = F.adaptive_avg_pool2d(feats.T.reshape(1, -1, side, side), (a, b))[0].reshape(feats.shape[1], -1).T  # [a * b, D]
        return [(window_positions(ctx, side, a, b), pooled)]
