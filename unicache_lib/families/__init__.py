"""Model families: one adapter per family of vision-language models (see :mod:`.base`).

Every module of this package is imported here, so a new family file registers itself."""
from ..core.registry import discover
from .base import FAMILIES, HOW_TO_ADD, Shape, Site, UnsupportedModelError, VLMFamily, family_for_type, family_of, supported

discover(__name__, __path__)

__all__ = ["FAMILIES", "HOW_TO_ADD", "Shape", "Site", "UnsupportedModelError", "VLMFamily", "family_for_type", "family_of",
           "supported"]
