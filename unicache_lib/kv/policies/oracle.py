"""Oracle upper bound: keep what the question will read (known only after the fact)."""
from ...core.errors import InputError
from .base import ScorerPolicy, register


@register
class Oracle(ScorerPolicy):
    name = "oracle"
    description = "per layer, the image positions the question's queries attend most (uses the future)"

    def require_cache(self, use: str) -> None:
        self._one_layer_at_a_time(use, "reads the question's attention from a full-cache run, known only after it")

    def score(self, ctx, layer):
        if ctx.future is None:
            raise InputError("the oracle needs EvictionContext.future: the question's attention from a full-cache run")
        return ctx.future[layer][ctx.image_positions]
