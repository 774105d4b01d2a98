"""Head scorers, one per module, all registered in :data:`SCORERS` on import (a new scorer is one new file)."""
from ...core.registry import discover
from .base import SCORERS, HeadScorer, ScoringContext, head_statistics

discover(__name__, __path__)

__all__ = ["SCORERS", "HeadScorer", "ScoringContext", "head_statistics"]
