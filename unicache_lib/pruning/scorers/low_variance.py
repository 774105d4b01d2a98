"""Low within-row variance (near-uniform rows) = prunable."""
from .base import HeadScorer, head_statistics, register


@register
class LowVariance(HeadScorer):
    name, needs = "low_variance", "records"
    description = "keep heads whose rows vary most; prune near-uniform ones"

    def score(self, ctx):
        return head_statistics(ctx)["variance"]
