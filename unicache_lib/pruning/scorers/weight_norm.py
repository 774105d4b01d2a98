"""Weight-norm importance: ||W_v[head]|| * ||W_o[:, head]|| (how much the head can write)."""
import numpy as np

from ..heads import _out_projections
from .base import HeadScorer, register


@register
class WeightNorm(HeadScorer):
    name, needs = "weight_norm", ""
    description = "product of the head's value and output projection norms"

    def score(self, ctx):
        sp = ctx.space
        out = np.full(sp.shape, np.nan)
        for i, (u, mod) in enumerate(zip(sp.units, sp.modules)):
            v = (mod.v_proj if hasattr(mod, "v_proj") else mod.to_v).weight.detach().float()
            o = _out_projections(mod)[0].weight.detach().float()
            for h in range(u.heads):
                sl = slice(h * u.head_dim, (h + 1) * u.head_dim)
                out[i, h] = float(v[sl].norm() * o[:, sl].norm())
        return out
