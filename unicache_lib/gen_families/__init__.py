"""Generator families: one adapter per family of diffusion transformers (see :mod:`.base`).

Every module of this package is imported here, so a new family file registers itself."""
from ..core.registry import discover
from .base import (GEN_FAMILIES, HOW_TO_ADD, GenFamily, GenSite, UnsupportedModelError, gen_family_for, gen_family_of,
                   processor_probs, register, restore_processors, supported)

discover(__name__, __path__)

__all__ = ["GEN_FAMILIES", "HOW_TO_ADD", "GenFamily", "GenSite", "UnsupportedModelError", "gen_family_for", "gen_family_of",
           "processor_probs", "register", "restore_processors", "supported"]
