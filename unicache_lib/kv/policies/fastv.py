"""FastV (Chen et al., 2024): after layer K, drop the image tokens the last position attends least.

As KV eviction: one ranking, from layer ``K - 1``'s attention of the last context position, applied
to every layer (FastV keeps all tokens below K; a rectangular cache cannot, so the budget binds
everywhere)."""
from .base import ScorerPolicy, register


@register
class FastV(ScorerPolicy):
    name = "fastv"
    description = "rank image tokens by the last position's attention at layer K-1 (K=2)"
    K = 2
    per_layer = False

    def score(self, ctx, layer):
        return ctx.attentions[min(self.K - 1, ctx.n_layers - 1)][:, -1, ctx.image_positions].mean(0)
