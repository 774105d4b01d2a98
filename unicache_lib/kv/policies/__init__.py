"""Eviction policies, one per module, all registered in :data:`POLICIES` on import."""
from . import (  # noqa: F401  # noqa: F401  (controls and ablations, listed after the methods)
    ablations,
    divprune,
    fastv,
    full,
    h2o,
    key_coverage,
    oracle,
    pooling,
    random_policy,
    snapkv,
    streaming,
    unicache,
)
from .base import POLICIES, EvictionContext, EvictionPolicy

__all__ = ["POLICIES", "EvictionContext", "EvictionPolicy"]
