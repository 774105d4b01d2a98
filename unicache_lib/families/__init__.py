"""Model families: one adapter per family of vision-language models (see :mod:`.base`).

Every module of this package is imported here, so a new family file registers itself."""
import importlib
import pkgutil

from .base import FAMILIES, HOW_TO_ADD, Shape, Site, UnsupportedModelError, VLMFamily, family_for_type, family_of, supported

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    importlib.import_module(f"{__name__}.{_m}")

__all__ = ["FAMILIES", "HOW_TO_ADD", "Shape", "Site", "UnsupportedModelError", "VLMFamily", "family_for_type", "family_of",
           "supported"]
