"""Random importances (seeded): the baseline every other scorer must beat."""
import numpy as np

from .base import HeadScorer, register


@register
class Random(HeadScorer):
    name, needs = "random", ""
    description = "uniform random, from ScoringContext.seed"

    def score(self, ctx):
        s = np.random.default_rng(ctx.seed).random(ctx.space.shape)
        for i, u in enumerate(ctx.space.units):
            s[i, u.heads:] = np.nan
        return s
