"""Oracle upper bound: keep what the question will read (known only after the fact)."""
from ...core.errors import InputError
from .base import EvictionPolicy, register, top_k


@register
class Oracle(EvictionPolicy):
    name = "oracle"
    description = "per layer, the image positions the question's queries attend most (uses the future)"

    def choose(self, ctx, k):
        if ctx.future is None:
            raise InputError("the oracle needs EvictionContext.future: the question's attention from a full-cache run")
        return [top_k(ctx.future[li][ctx.image_positions], k) for li in range(ctx.n_layers)]
