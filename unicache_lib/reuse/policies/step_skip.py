"""Skip whole transformer calls on chosen denoising steps; stand in for each skipped call with a damped
polynomial extrapolation of the model output from the last computed steps (a step-level policy,
``level = "step"``: :class:`~unicache_lib.reuse.cache.ReuseCache` hooks the transformer's forward).

Order 1 (the default): with ``(t0, o0)``, ``(t1, o1)`` the last two computed steps (timestep units, as the
sampling loop reports them) and ``t`` this step's timestep,

    out = o1 + w * (o1 - o0) * (t - t1) / (t1 - t0)

Order 2: the quadratic through the last three computed points, damped the same way
(``out = o_last + w * (P(t) - o_last)``); with only two computed points so far, order 1. Fewer than two
computed points: the call is computed (whatever the schedule says).

Schedule, relative to ``n_steps`` so it works for any step count: the first ``head`` share of the steps
(at least two) and the last ``tail`` share (at least one) are computed, and in between every
``stride``-th step; everything else is extrapolated.

How the defaults were chosen and what they give: docs/CACHING.md (``step_skip``) and ``benchmarks/tune_step_skip.py``.
"""
import math
from dataclasses import dataclass

import torch

from ...core.errors import InputError
from ...inputs import check_count, check_fraction, check_number
from .base import ReusePolicy, register


def step_schedule(n_steps: int, head: float, tail: float, stride: int) -> list[bool]:
    """``[n_steps]`` booleans, True where the transformer is called: the first ``max(2, round(head * n))``
    steps (two computed points before any extrapolation), the last ``max(1, round(tail * n))``, and every
    ``stride``-th step (``step % stride == 0``) in between."""
    n_steps, stride = check_count(n_steps, "n_steps", 1), check_count(stride, "stride", 1)
    h = min(n_steps, max(2, round(head * n_steps)))
    k = min(n_steps, max(1, round(tail * n_steps)))
    return [i < h or i >= n_steps - k or i % stride == 0 for i in range(n_steps)]


def extrapolate(ts: list[float], outs: list[torch.Tensor], t: float, weight: float) -> torch.Tensor:
    """Damped polynomial extrapolation to ``t`` through the points ``(ts[i], outs[i])`` (order
    ``len(ts) - 1``; outputs all of one shape ``[B, ...]``): ``outs[-1] + weight * (P(t) - outs[-1])``,
    with ``P`` the Lagrange polynomial. Arithmetic in float32 (returned in the outputs' dtype); equal
    timesteps raise (the points give no slope)."""
    if len(ts) != len(outs) or len(ts) < 2:
        raise InputError(f"need >= 2 points with one output each, got {len(ts)} timesteps and {len(outs)} outputs")
    if len(set(ts)) != len(ts):
        raise InputError(f"extrapolation points share a timestep ({ts}): no slope to extrapolate")
    last = outs[-1].float()
    # P(t): each output times its Lagrange basis polynomial at t, summed in order from zero
    p = sum((math.prod((t - tj) / (ti - tj) for j, tj in enumerate(ts) if j != i) * oi.float()
             for i, (ti, oi) in enumerate(zip(ts, outs))), torch.zeros_like(last))
    return (last + weight * (p - last)).to(outs[-1].dtype)


MAX_STRIDE = 50  # past it nearly every step is extrapolated from the first few: no schedule any lesson tunes


@register
@dataclass(eq=False)  # instances stay hashable, compared by identity
class StepSkip(ReusePolicy):
    name, description = "step_skip", "skip whole transformer calls mid-run; damped linear extrapolation of the output"
    level = "step"

    head: float = 0.1
    tail: float = 0.05
    stride: int = 3
    weight: float = 0.5
    order: int = 1

    def __post_init__(self):
        """Every field checked on construction (a typo never runs a schedule with no reuse in it, or NaN images)."""
        check_fraction(self.head, "head", upper_inclusive=False, meaning="the share of first steps always computed")
        check_fraction(self.tail, "tail", upper_inclusive=False, meaning="the share of last steps always computed")
        if self.head + self.tail > 1:  # (exactly 1 is a schedule that reuses nothing: notebook 03 may advise it)
            raise InputError(f"head + tail = {self.head + self.tail:g} > 1: the two always-computed ends overlap; keep "
                             f"head + tail at most 1 (the tuned values: head=0.1, tail=0.05)")
        if check_count(self.stride, "stride", 1, MAX_STRIDE) == 1:  # (the tuning searched strides 3..12)
            raise InputError("stride=1 computes every step: a schedule with no reuse; pass stride >= 2 (the tuned "
                             "value is 3), or run without a reuse policy for the reference")
        check_number(self.weight, "weight", 0.0, 2.0)  # the damping of the extrapolation (0: reuse the last output)
        if isinstance(self.order, bool) or self.order not in (1, 2):
            raise InputError(f"order must be 1 or 2, got {self.order!r}")

    def schedule(self, n_steps: int) -> list[bool]:
        self.__post_init__()  # a field set since it was made (pol.stride = 1) is checked too
        return step_schedule(n_steps, self.head, self.tail, self.stride)

    def decide(self, step, n_steps, similarity, key="transformer"):
        sched = self.schedule(n_steps)
        return "compute" if step >= len(sched) or sched[step] else "reuse"

    def extrapolate(self, ts: list[float], outs: list[torch.Tensor], t: float) -> torch.Tensor:
        """The stand-in output for a skipped call from the computed history (oldest first)."""
        n = self.order + 1
        return extrapolate(ts[-n:], outs[-n:], t, self.weight)
