"""The study's combination: low variance, high entropy and redundancy, averaged as ranks."""
import numpy as np

from .base import HeadScorer, head_statistics, rank01, register


@register
class AttentionCombined(HeadScorer):
    name, needs = "attention_combined", "records"
    description = "mean rank of variance, -entropy and -max similarity"

    def score(self, ctx):
        s = head_statistics(ctx)
        return np.mean([rank01(s["variance"]), rank01(-s["entropy"]), rank01(-s["max_sim"])], 0)
