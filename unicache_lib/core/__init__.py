"""The core layer: what every other layer builds on and nothing in it imports from above -- the error root
(:mod:`.errors`), model plumbing (:mod:`.models`: unwrap, attention-implementation switching), registries
(:mod:`.registry`), modalities and spans (:mod:`.modality`), similarity measures (:mod:`.similarity`) and scoring
(:mod:`.scoring`: an answer token against the expected answer, answer KL, the focused-head threshold).
``tests/test_layers.py`` checks the layering."""
from .errors import UnicacheError

__all__ = ["UnicacheError"]
