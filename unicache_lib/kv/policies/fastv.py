"""FastV (Chen et al., 2024): after layer K, drop the image tokens the last position attends least.

As KV eviction: one ranking, from layer ``K - 1``'s attention of the last context position, applied
to every layer (FastV keeps all tokens below K; a rectangular cache cannot, so the budget binds
everywhere)."""
from dataclasses import dataclass

from ...inputs import check_count
from .base import ScorerPolicy, register


@register
@dataclass(eq=False)
class FastV(ScorerPolicy):
    """``K``: the layer after which FastV prunes (the ranking is layer ``K - 1``'s; the paper's K = 2; a model with
    fewer layers ranks at its last)."""

    name = "fastv"
    description = "rank image tokens by the last position's attention at layer K-1 (K=2)"
    per_layer = False

    K: int = 2

    def __post_init__(self):
        super().__post_init__()
        check_count(self.K, "FastV K (the layer after which it prunes)")

    def score(self, ctx, layer):
        return ctx.attentions[min(self.K - 1, ctx.n_layers - 1)][:, -1, ctx.image_positions].mean(0)
