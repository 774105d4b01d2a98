"""Compute every N-th step, reuse in between (a fixed-rate baseline, e.g. DeepCache-style)."""
from .base import ReusePolicy, register


@register
class EveryN(ReusePolicy):
    name, description = "every_2", "compute on even steps, reuse on odd ones"
    n = 2

    def decide(self, step, n_steps, similarity, key=None):
        return "compute" if step % self.n == 0 or step == n_steps - 1 else "reuse"
