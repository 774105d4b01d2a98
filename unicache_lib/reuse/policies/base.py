"""The cross-step reuse-policy interface and its registry.

At each denoising step and for each attention module, a policy answers: compute the attention
afresh, or hand on the output cached at the last computed step? Decisions may use only what is
cheap at that point (step index, and a similarity signal computed from the module's *input*, never
from the attention it would skip).
"""
from __future__ import annotations

REUSE_POLICIES: dict[str, type["ReusePolicy"]] = {}


def register(cls):
    if cls.name in REUSE_POLICIES:
        raise KeyError(f"reuse policy {cls.name!r} registered twice")
    REUSE_POLICIES[cls.name] = cls
    return cls


class ReusePolicy:
    """``decide(step, n_steps, similarity) -> "compute" | "reuse" | "reuse_text"``.

    ``similarity``: cosine between this step's input to the module and its input at the last
    computed step (NaN at step 0). ``reuse_text`` reuses only the text side (joint attention: the
    text stream's output; cross-attention: the text keys and values) and computes the image side.
    """

    name = ""
    description = ""

    def decide(self, step: int, n_steps: int, similarity: float) -> str:  # pragma: no cover - interface
        raise NotImplementedError
