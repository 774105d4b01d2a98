"""The study's static schedule: reuse only in the last third of the steps (every other step)."""
from .base import ReusePolicy, register


@register
class StaticLastThird(ReusePolicy):
    name, description = "static_last_third", "in the last third, compute every other step and reuse in between"

    def decide(self, step, n_steps, similarity, key=None):
        start = n_steps - n_steps // 3
        return "reuse" if step >= start and (step - start) % 2 == 1 else "compute"
