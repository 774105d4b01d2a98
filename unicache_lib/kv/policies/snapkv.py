"""SnapKV (Li et al., 2024): what an observation window at the end of the context reads, pooled."""
import torch

from .base import ScorerPolicy, register


@register
class SnapKV(ScorerPolicy):
    name = "snapkv"
    description = "attention of the last 8 context queries, average-pooled over 5 keys"
    window, kernel = 8, 5

    def score(self, ctx, layer):
        A = ctx.attentions[layer][:, -self.window:, :]  # [H, w, C]
        votes = A.sum(1)[:, ctx.image_positions]  # [H, n_image]
        pooled = torch.nn.functional.avg_pool1d(votes[:, None], self.kernel, 1, self.kernel // 2,
                                                count_include_pad=False)[:, 0]
        return pooled.mean(0)
