"""Keep everything (the reference; ignores the budget)."""
import numpy as np

from .base import EvictionPolicy, register


@register
class Full(EvictionPolicy):
    name = "full"
    description = "no eviction"

    def select(self, ctx, budget):
        """Every position, whatever ``budget`` (which is still checked: a string is refused)."""
        ctx.k(budget)
        return ctx.assemble([np.arange(ctx.n_image)] * ctx.n_layers)
