"""H2O (Zhang et al., 2023): heavy hitters by accumulated attention, plus a recent window."""
import numpy as np

from .base import EvictionPolicy, register, top_k


@register
class H2O(EvictionPolicy):
    name = "h2o"
    description = "half the budget to the most-read positions, half to the most recent"

    def choose(self, ctx, k):
        out = []
        n_recent = k // 2
        recent = np.arange(ctx.n_image - n_recent, ctx.n_image)
        for li in range(ctx.n_layers):
            reads = ctx.image_reads(li).numpy().copy()
            reads[recent] = -np.inf
            out.append(np.r_[recent, top_k(reads, k - n_recent)])
        return out
