"""The study's own rule ("UniCache"): keep visual anchors everywhere; evict by locality in shallow
layers (a spatially even grid covers what local heads need) and by content in deeper layers
(the most-read positions, kept conservatively).

Shallow layers keep a quarter of their budget (``anchors``) as anchors (the positions the shallow layers read
most; they persist upward, claim U3) and the rest as an even grid over the image; middle and deep
layers keep the positions they read most. ``swap_bands=True`` swaps the two rules (grid deep,
content shallow), the control for claim U7. The study also protects what the question's content
words read; with the image cached before the question arrives that is not known yet, so it is
left out here.
"""
from dataclasses import dataclass

import numpy as np

from ...analysis.layers import band_layers
from ...core.errors import InputTypeError
from ...inputs import check_fraction
from .base import EvictionPolicy, register, top_k


@register
@dataclass(eq=False)
class UniCache(EvictionPolicy):
    """``anchors``: the share of a shallow layer's budget kept as anchors (rounded down), the rest an even grid;
    ``swap_bands``: the two rules swapped between the bands (the control for claim U7)."""

    name = "unicache"
    description = "anchors + spatial grid in shallow layers, most-read positions deeper"

    anchors: float = 0.25
    swap_bands: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_fraction(self.anchors, "unicache anchors", meaning="of a shallow layer's budget kept as anchors")
        if not isinstance(self.swap_bands, (bool, np.bool_)):
            raise InputTypeError(f"unicache swap_bands must be True or False, got {self.swap_bands!r}")

    def require_cache(self, use: str) -> None:
        self._one_layer_at_a_time(use, "keeps in every layer the positions the shallow layers read most, together")

    def choose(self, ctx, k):
        bands = band_layers(ctx.n_layers)
        shallow_reads = sum(ctx.image_reads(li) for li in bands["shallow"]).numpy()
        anchors = [int(i) for i in top_k(shallow_reads, int(k * self.anchors))]
        # the picture's token grid in row-major order (tiles, class and newline tokens are not on it)
        rest = [int(i) for i in (ctx.grid if ctx.grid is not None else range(ctx.n_image)) if int(i) not in anchors]
        m = k - len(anchors)
        grid = [rest[int(j)] for j in np.linspace(0, len(rest) - 1, min(m, len(rest))).round()] if m > 0 else []
        if len(grid) < m:  # more budget than grid cells: the rest in sequence order
            grid += [i for i in range(ctx.n_image) if i not in anchors and i not in grid][: m - len(grid)]
        local = np.array(anchors + grid, dtype=int)
        return [local if (li in bands["shallow"]) != self.swap_bands
                else top_k(ctx.image_reads(li).numpy() + 1e-3 * shallow_reads, k) for li in range(ctx.n_layers)]
