"""Head scorers, one per module, all registered in :data:`SCORERS` on import."""
from . import attention_combined, gradient, high_entropy, low_variance, random_baseline, redundancy, weight_norm  # noqa: F401
from .base import SCORERS, HeadScorer, ScoringContext, head_statistics

__all__ = ["SCORERS", "HeadScorer", "ScoringContext", "head_statistics"]
