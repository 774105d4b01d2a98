"""NVIDIA kvpress presses as peers, run on the same model, questions and budgets.

A press compresses the cache while the context is prefilled (``with press(model)``); the
question is then answered on that cache by the same decode loop as the workbench's own policies.
AdaKV masks keys per head instead of shrinking the cache (it needs sdpa; bytes held stay full).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager


def press_factories() -> dict:
    """name -> ``compression_ratio -> press``."""
    import kvpress

    logging.getLogger("kvpress").setLevel(logging.ERROR)  # "model not tested" for LLaVA, once per call
    return {
        "kvpress:snapkv": lambda cr: kvpress.SnapKVPress(compression_ratio=cr),
        "kvpress:streaming": lambda cr: kvpress.StreamingLLMPress(compression_ratio=cr),
        "kvpress:knorm": lambda cr: kvpress.KnormPress(compression_ratio=cr),
        "kvpress:expected_attention": lambda cr: kvpress.ExpectedAttentionPress(compression_ratio=cr),
        "kvpress:observed_attention": lambda cr: kvpress.ObservedAttentionPress(compression_ratio=cr),
        "kvpress:tova": lambda cr: kvpress.TOVAPress(compression_ratio=cr),
        "kvpress:adakv_snapkv": lambda cr: kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=cr)),
    }


def needs_sdpa(name: str) -> bool:
    return "adakv" in name


@contextmanager
def attention_implementation(model, impl: str):
    """Temporarily switch the attention implementation (restored on exit, also on error); clears
    kvpress's per-module head masks afterwards so they cannot leak into the next run."""
    from ..capture.vlm import attn_implementations, set_attn_implementations

    old = attn_implementations(model)
    set_attn_implementations(model, {**old, "text_config": impl} if isinstance(old, dict) else impl)
    try:
        yield
    finally:
        set_attn_implementations(model, old)
        for m in model.modules():
            if getattr(m, "masked_key_indices", None) is not None:
                m.masked_key_indices = None


def compression_ratio(n_context: int, n_image: int, budget: float) -> float:
    """The kvpress ratio that leaves as many context positions as a policy keeping ``budget`` of the
    image positions and every other context position."""
    kept = (n_context - n_image) + round(budget * n_image)
    return 1.0 - (kept + 0.5) / n_context  # kvpress keeps int(n * (1 - ratio)) positions
