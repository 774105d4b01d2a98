"""The study's adaptive rule: reuse while the module's input stays similar to its input at the last
computed step (the signal costs one cosine over the input, not the attention it would skip);
at most ``max_run`` reuses in a row."""
import math
from dataclasses import dataclass, field

from .base import ReusePolicy, register


@register
@dataclass(eq=False)
class Adaptive(ReusePolicy):
    name, description = "adaptive", "reuse when the input's cosine to the last computed step >= threshold"
    uses_similarity = True

    threshold: float = 0.995
    max_run: int = 2
    _run: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # reuses in a row, per module

    def decide(self, step, n_steps, similarity, key=None):
        run = self._run.get(key, 0)
        if step > 0 and not math.isnan(similarity) and similarity >= self.threshold and run < self.max_run:
            self._run[key] = run + 1
            return "reuse"
        self._run[key] = 0
        return "compute"
