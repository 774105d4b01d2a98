"""Eviction policies, one per module, all registered in :data:`POLICIES` on import."""
from . import divprune, fastv, full, h2o, key_coverage, oracle, random_policy, snapkv, streaming, unicache  # noqa: F401
from . import ablations, pooling  # noqa: F401  (controls and ablations after the methods: this import order is the
#   order of every table and chart that loops over POLICIES, so keep it when adding a policy)
from . import downsample, key_coverage_prefill  # noqa: F401  (added later: keep them last, in this order)
from .base import POLICIES, EvictionContext, EvictionPolicy

__all__ = ["POLICIES", "EvictionContext", "EvictionPolicy"]
