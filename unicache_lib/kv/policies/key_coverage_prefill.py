"""Key coverage before the prefill: the cover of :mod:`.key_coverage`, moved in front of the language model.

`key_coverage` chooses after the prefill, from each layer's cached keys, so it pays the full prefill. Here the
image tokens are chosen once, before the language model runs, from the keys its *first* layer would compute for
them (:meth:`~unicache_lib.families.base.VLMFamily.first_layer_keys`: input norm and key projection, no attention):
a Euclidean k-center cover started at the largest-norm key. The prefill then runs on the kept tokens only, at their
original positions (``renumber=False``, as DivPrune runs here: the shipped model was trained on one layout).

Kept as a measured example, not a recommendation: how it was chosen and how it did on held-out questions is in
docs/CACHING.md (``benchmarks/tune_prefill_cover.py``, ``benchmarks/prefill_cover.py``).
"""
from dataclasses import dataclass

import torch

from ...core.errors import ContractError, InputError
from .base import PrefillStagePolicy, register
from .key_coverage import farthest_point

POINTS = ("first_keys", "features", "unit_features")
STARTS = ("norm", "outlier")


@register
@dataclass(eq=False)
class KeyCoveragePrefill(PrefillStagePolicy):
    """The cover's design choices, as fields (``benchmarks/tune_prefill_cover.py`` sweeps them). ``points``: what is
    covered — ``"first_keys"`` (the first layer's keys of the image tokens), ``"features"`` (the projected image
    features) or ``"unit_features"`` (those L2-normalised per token); ``start``: ``"norm"`` (the largest-norm point) or
    ``"outlier"`` (the point farthest from their mean)."""

    name = "key_coverage_prefill"
    description = "key_coverage before the prefill: a k-center cover of the first layer's keys of the image tokens"

    renumber: bool = False
    points: str = "first_keys"
    start: str = "norm"

    def __post_init__(self):
        super().__post_init__()
        for what, value, allowed in (("points", self.points, POINTS), ("start", self.start, STARTS)):
            if value not in allowed:
                raise InputError(f"key_coverage_prefill {what} must be one of {', '.join(map(repr, allowed))}, got "
                                 f"{value!r}")

    def choose(self, ctx, k):
        x = self.points_of(ctx)  # [n_image, F]
        s = x.norm(dim=1) if self.start == "norm" else (x - x.mean(0)).norm(dim=1)
        return [farthest_point(x, k, int(s.argmax()))]

    def points_of(self, ctx) -> torch.Tensor:
        """``[n_image, F]``: the points covered, from the image tokens the language model would receive."""
        if self.points != "first_keys":
            x = ctx.features.float()
            return torch.nn.functional.normalize(x, dim=-1) if self.points == "unit_features" else x
        if ctx.first_keys is None:
            raise ContractError("key_coverage_prefill reads the first layer's keys: build the context with "
                                "prefill(...).context(), which carries the model")
        return ctx.first_keys(ctx.features)  # [n_image, H_kv * D]
