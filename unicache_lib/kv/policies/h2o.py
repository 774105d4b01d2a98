"""H2O (Zhang et al., 2023): heavy hitters by accumulated attention, plus a recent window."""
from dataclasses import dataclass

import numpy as np

from ...inputs import check_fraction
from .base import EvictionPolicy, register, top_k


@register
@dataclass(eq=False)
class H2O(EvictionPolicy):
    """``recent``: the share of the budget given to the most recent image positions (rounded down); the rest goes to
    the positions the context read most (H2O's heavy hitters; the paper splits the budget in half)."""

    name = "h2o"
    description = "half the budget to the most-read positions, half to the most recent"

    recent: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        check_fraction(self.recent, "H2O recent", meaning="of the budget given to the most recent positions")

    def choose(self, ctx, k):
        n_recent = int(k * self.recent)
        recent = np.arange(ctx.n_image - n_recent, ctx.n_image)
        # the recent positions out of the heavy-hitter ranking
        return [np.r_[recent, top_k(np.where(np.isin(np.arange(ctx.n_image), recent), -np.inf, ctx.image_reads(li).numpy()),
                                    k - n_recent)] for li in range(ctx.n_layers)]
