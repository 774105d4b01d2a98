"""Reuse policies, one per module, registered in :data:`REUSE_POLICIES` on import."""
from . import adaptive, every_n, none, static_last_third, step_skip, text_side  # noqa: F401
from .base import REUSE_POLICIES, ReusePolicy

__all__ = ["REUSE_POLICIES", "ReusePolicy"]
