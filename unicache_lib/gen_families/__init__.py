"""Generator families: one adapter per family of diffusion transformers (see :mod:`.base`).

Every module of this package is imported here, so a new family file registers itself."""
import importlib
import pkgutil

from .base import (GEN_FAMILIES, HOW_TO_ADD, GenFamily, GenSite, UnsupportedModelError, gen_family_for, gen_family_of,
                   processor_probs, register, restore_processors, supported)

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    importlib.import_module(f"{__name__}.{_m}")

__all__ = ["GEN_FAMILIES", "HOW_TO_ADD", "GenFamily", "GenSite", "UnsupportedModelError", "gen_family_for", "gen_family_of",
           "processor_probs", "register", "restore_processors", "supported"]
