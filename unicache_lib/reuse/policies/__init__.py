"""Reuse policies, one per module, registered in :data:`REUSE_POLICIES` on import (a new policy is one new file)."""
from ...core.registry import discover
from .base import REUSE_POLICIES, ReusePolicy

discover(__name__, __path__)

__all__ = ["REUSE_POLICIES", "ReusePolicy"]
