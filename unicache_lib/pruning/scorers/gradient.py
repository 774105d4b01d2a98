"""Head importance from the masking gradient (Michel et al., 2019, "Are Sixteen Heads Really Better
than One?"): ``I_h = E_x |dL/d mask_h|`` at mask = 1."""
import numpy as np
import torch

from ..heads import HeadMask
from .base import HeadScorer, register


@register
class Gradient(HeadScorer):
    name, needs = "gradient", "loss"
    description = "expected |d loss / d head mask| over the loss batches"

    def score(self, ctx):
        mask = ctx.space.ones().requires_grad_(True)
        total = torch.zeros(ctx.space.shape)
        with torch.enable_grad(), HeadMask(ctx.space, mask):
            for fn in ctx.loss_fns:
                (g,) = torch.autograd.grad(fn(), mask)
                total += g.abs()
        out = (total / len(ctx.loss_fns)).numpy().astype(float)
        for i, u in enumerate(ctx.space.units):
            out[i, u.heads:] = np.nan
        return out
