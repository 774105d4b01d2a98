"""The cross-step reuse-policy interface and its registry.

At each denoising step and for each attention module, a policy answers: compute the attention
afresh, or hand on the output cached at the last computed step? Decisions may use only what is
cheap at that point (step index, and a similarity signal computed from the module's *input*, never
from the attention it would skip).
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ...core.errors import UnsupportedError
from ...core.registry import Registry, registrar

REUSE_POLICIES: dict[str, type["ReusePolicy"]] = Registry("reuse policy")
register = registrar(REUSE_POLICIES, "reuse policy")


@dataclass(eq=False)
class ReusePolicy(ABC):
    """``decide(step, n_steps, similarity, key) -> "compute" | "reuse" | "reuse_text"``.

    ``similarity``: cosine between this step's input to the module and its input at the last computed step (NaN
    at step 0, and unless the policy sets ``uses_similarity``). ``key``: the attention module's name, for policies
    that keep per-module state. ``reuse_text`` reuses only the text side (joint attention: the text stream's
    output; cross-attention: the text keys and values) and computes the image side.

    ``level``: ``"attention"`` (the default): ``decide`` is asked per attention module and call, as above.
    ``"step"``: ``decide(step, n_steps, nan, key="transformer")`` is asked once per transformer call, and
    ``"reuse"`` skips the whole call; the policy then supplies the stand-in output with
    ``extrapolate(timesteps, outputs, t)`` from the outputs of the computed calls (oldest first; at least
    ``min_history`` of them, else the call is computed).
    """

    name = ""
    description = ""

    uses_similarity = False
    level = "attention"
    min_history = 2

    @abstractmethod
    def decide(self, step: int, n_steps: int, similarity: float, key=None) -> str:
        ...

    def extrapolate(self, timesteps: list[float], outputs: list, t: float):  # pragma: no cover - interface
        """Step-level policies: the model output ``[B, ...]`` standing in for a skipped call at ``t``."""
        raise UnsupportedError(f"{type(self).__name__} is not a step-level policy")
