"""High normalised entropy (diffuse attention) = prunable."""
from .base import HeadScorer, head_statistics, register


@register
class HighEntropy(HeadScorer):
    name, needs = "high_entropy", "records"
    description = "prune the heads with the most diffuse rows"

    def score(self, ctx):
        return -head_statistics(ctx)["entropy"]
