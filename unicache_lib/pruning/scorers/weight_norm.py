"""Weight-norm importance: ||W_v[head]|| * ||W_o[:, head]|| (how much the head can write)."""
import numpy as np

from ..heads import _output_weight
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
            o = _output_weight(sp.model, u.name, mod).detach().float()
            group = max(1, u.heads // max(1, v.shape[0] // u.head_dim))  # query heads per value head (GQA)
            for h in range(u.heads):
                sl = slice(h * u.head_dim, (h + 1) * u.head_dim)
                vs = slice((h // group) * u.head_dim, (h // group + 1) * u.head_dim)  # the value head it reads
                out[i, h] = float(v[vs].norm() * o[:, sl].norm())
        return out
