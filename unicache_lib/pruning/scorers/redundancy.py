"""High similarity to another head of the same layer (a near-duplicate) = prunable."""
from .base import HeadScorer, head_statistics, register


@register
class Redundancy(HeadScorer):
    name, needs = "redundancy", "records"
    description = "prune heads whose map most resembles another head's in the same layer"

    def score(self, ctx):
        return -head_statistics(ctx)["max_sim"]
