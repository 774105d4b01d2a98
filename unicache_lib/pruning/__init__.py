"""Attention-head pruning: head spaces, exact masking, physical slicing, and head scorers.

    space = HeadSpace.of(model)                       # every attention module's heads
    scores = SCORERS["attention_combined"]().score(ctx)   # [units, heads], higher = keep
    keep = space.keep_mask(scores, fraction=0.2)      # prune the lowest-scoring 20%
    with HeadMask(space, keep):
        ...                                           # masked heads contribute exactly nothing
"""
from .heads import HeadMask, HeadSpace, Unit, prune_physically
from .scorers import SCORERS, HeadScorer, ScoringContext

__all__ = ["HeadMask", "HeadScorer", "HeadSpace", "SCORERS", "ScoringContext", "Unit", "prune_physically"]
