"""Eviction policies, one per module, all registered in :data:`POLICIES` on import (a new policy is one new file).

The import order is the order of every table and chart that loops over POLICIES: the methods, then the controls
and ablations, then the pooling and downsampling baselines and the prefill cover, then any new file in name order."""
from ...core.registry import discover
from .base import POLICIES, EvictionContext, EvictionPolicy, PrefillStagePolicy, ScorerPolicy

discover(__name__, __path__, first=("divprune", "fastv", "full", "h2o", "key_coverage", "oracle", "random_policy",
                                    "snapkv", "streaming", "unicache", "ablations", "pooling", "downsample",
                                    "key_coverage_prefill"))

__all__ = ["POLICIES", "EvictionContext", "EvictionPolicy", "PrefillStagePolicy", "ScorerPolicy"]
