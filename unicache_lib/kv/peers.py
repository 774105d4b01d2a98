"""NVIDIA kvpress presses as peers, run on the same model, questions and budgets.

A press compresses the cache while the context is prefilled (``with press(model)``); the
question is then answered on that cache by the same decode loop as the workbench's own policies.

Configured as their authors intend on *this* context:

- **SnapKV / AdaKV** score keys with the attention of an observation window of the last queries of
  the prefill (kvpress default 64, meant for prompts of thousands of tokens whose window is the
  question). Here the image is cached before the question arrives, so the only queries that exist at
  eviction time are the context's own; on the shipped 67-position context a 64-query window would
  leave 3 scored keys and tie all 64 image keys (one contiguous block kept, the same in every head).
  The window is sized to the context by the rule the workbench's own ``snapkv`` policy uses
  (:func:`~unicache_lib.kv.policies.snapkv.observation_window`): one eighth of it (the shipped model: the last 8
  context positions, i.e. the bottom row of the 8x8 image grid), at most kvpress's 64. Keys inside the window are
  always kept, as in SnapKV.
- **AdaKV** masks keys per head instead of shrinking the cache: memory stays full (``kv_fraction``
  1.0), so it is labelled :data:`MASKED_LABEL` and must not be read on the same bytes axis as presses
  that free memory. It needs sdpa.
"""
from __future__ import annotations

from contextlib import contextmanager

from ..core.models import language_attention
from ..inputs import check_fraction
from .policies.snapkv import KVPRESS_DEFAULT_WINDOW, observation_window  # one window rule for the policy and the peer

MASKED_LABEL = "masked, full memory"
ADAKV = f"kvpress:adakv_snapkv ({MASKED_LABEL})"
__all__ = ["ADAKV", "KVPRESS_DEFAULT_WINDOW", "MASKED_LABEL", "attention_implementation", "compression_ratio",
           "masks_only", "observation_window", "press_factories"]


def press_factories() -> dict:
    """name -> ``(compression_ratio, n_context) -> press``. AdaKV's name carries :data:`MASKED_LABEL`."""
    import kvpress  # local: optional dependency (the kv extra)

    def snapkv(cr, n):
        return kvpress.SnapKVPress(compression_ratio=cr, window_size=observation_window(n))

    return {
        "kvpress:snapkv": snapkv,
        "kvpress:streaming": lambda cr, n: kvpress.StreamingLLMPress(compression_ratio=cr),
        "kvpress:knorm": lambda cr, n: kvpress.KnormPress(compression_ratio=cr),
        "kvpress:expected_attention": lambda cr, n: kvpress.ExpectedAttentionPress(compression_ratio=cr),
        "kvpress:observed_attention": lambda cr, n: kvpress.ObservedAttentionPress(compression_ratio=cr),
        "kvpress:tova": lambda cr, n: kvpress.TOVAPress(compression_ratio=cr),
        ADAKV: lambda cr, n: kvpress.AdaKVPress(snapkv(cr, n)),
    }


def masks_only(name: str) -> bool:
    """The press masks keys per head and frees no memory (AdaKV); it needs sdpa."""
    return "adakv" in name


@contextmanager
def attention_implementation(model, impl: str):
    """:func:`~unicache_lib.core.models.language_attention` (the language model under ``impl``, restored on exit, also on
    error), then kvpress's per-module head masks cleared so they cannot leak into the next run."""
    try:
        with language_attention(model, impl):
            yield
    finally:
        for m in model.modules():
            if getattr(m, "masked_key_indices", None) is not None:
                m.masked_key_indices = None


def compression_ratio(n_context: int, n_image: int, budget: float) -> float:
    """The kvpress ratio that leaves as many context positions as a policy keeping ``budget`` of the
    image positions and every other context position."""
    budget = check_fraction(budget, "budget", meaning="of the image tokens kept")
    kept = (n_context - n_image) + round(budget * n_image)
    return 1.0 - (kept + 0.5) / n_context  # kvpress keeps int(n * (1 - ratio)) positions
