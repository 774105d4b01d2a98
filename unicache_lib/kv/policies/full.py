"""Keep everything (the reference; ignores the budget)."""
import numpy as np

from ...core.errors import InputError
from .base import EvictionPolicy, register


@register
class Full(EvictionPolicy):
    name = "full"
    description = "no eviction"

    def require_cache(self, use: str) -> None:
        if use == "a depth schedule":
            raise InputError("full keeps every position whatever the budget: a depth schedule would change nothing "
                             "(apply it to a policy that evicts, e.g. POLICIES['key_coverage_merge']())")
        self._one_layer_at_a_time(use, "keeps every position, whatever compression_ratio asks")

    def select(self, ctx, budget):
        """Every position, whatever ``budget`` (which is still checked: a string is refused)."""
        ctx.k(budget)
        return ctx.assemble([np.arange(ctx.n_image)] * ctx.n_layers)
