"""Compute every attention call (the reference)."""
from .base import ReusePolicy, register


@register
class NoReuse(ReusePolicy):
    name, description = "none", "always compute"

    def decide(self, step, n_steps, similarity, key=None):
        return "compute"
