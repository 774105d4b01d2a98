"""A seeded random subset of image positions, the same in every layer."""
import numpy as np

from .base import EvictionPolicy, register


@register
class RandomEviction(EvictionPolicy):
    name = "random"
    description = "uniform random image positions"

    def choose(self, ctx, k):
        keep = np.random.default_rng(ctx.seed).permutation(ctx.n_image)[:k]
        return [keep] * ctx.n_layers
