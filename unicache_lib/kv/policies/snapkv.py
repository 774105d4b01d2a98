"""SnapKV (Li et al., 2024): what an observation window at the end of the context reads, pooled."""
import torch

from .base import EvictionPolicy, register, top_k


@register
class SnapKV(EvictionPolicy):
    name = "snapkv"
    description = "attention of the last 8 context queries, average-pooled over 5 keys"
    window, kernel = 8, 5

    def choose(self, ctx, k):
        out = []
        img = ctx.image_positions
        for li in range(ctx.n_layers):
            A = ctx.attentions[li][:, -self.window:, :]  # [H, w, C]
            votes = A.sum(1)[:, img]  # [H, n_image]
            pooled = torch.nn.functional.avg_pool1d(votes[:, None], self.kernel, 1, self.kernel // 2,
                                                    count_include_pad=False)[:, 0]
            out.append(top_k(pooled.mean(0), k))
        return out
