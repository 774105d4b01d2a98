"""Model families: one adapter per family of vision-language models (see :mod:`.base`)."""
from . import gemma3, idefics3, internvl, llava, mllama, paligemma, qwen2_vl  # noqa: F401  (registers them)
from .base import FAMILIES, HOW_TO_ADD, Shape, Site, UnsupportedModelError, VLMFamily, family_for_type, family_of, supported

__all__ = ["FAMILIES", "HOW_TO_ADD", "Shape", "Site", "UnsupportedModelError", "VLMFamily", "family_for_type", "family_of",
           "supported"]
