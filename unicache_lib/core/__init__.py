"""The core layer: what every other layer builds on and nothing in it imports from above -- the error root
(:mod:`.errors`), model plumbing (:mod:`.models`: unwrap, attention-implementation switching), registries
(:mod:`.registry`), modalities and spans (:mod:`.modality`) and similarity measures (:mod:`.similarity`).
``tests/test_layers.py`` checks the layering."""
from .errors import UnicacheError

__all__ = ["UnicacheError"]
