"""Cross-step reuse for diffusion transformers: own policies and diffusers' caches as peers."""
from .cache import ReuseCache
from .policies import REUSE_POLICIES, ReusePolicy

__all__ = ["REUSE_POLICIES", "ReuseCache", "ReusePolicy"]
