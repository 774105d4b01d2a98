"""The head-scorer interface and its registry.

A scorer turns a :class:`ScoringContext` into ``[units, heads]`` importances: **higher = keep**.
Each scorer lives in its own module and registers itself once with :func:`register`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ...core.errors import ContractError, InputError
from ...core.registry import Registry, registrar
from ...gen_families import gen_family_of
from ..heads import HeadSpace

SCORERS: dict[str, type["HeadScorer"]] = Registry("head scorer")
register = registrar(SCORERS, "scorer")


@dataclass
class ScoringContext:
    """What scorers may use.

    Args:
        space: the heads to score.
        records: stats-mode capture records (understanding: notebook 02's store; generators:
            notebook 03's), for the attention-statistics scorers.
        loss_fns: closures that run the model and return a scalar loss (for the gradient scorer;
            they run under a :class:`~unicache_lib.pruning.heads.HeadMask`).
        seed: for the random scorer.
    """

    space: HeadSpace
    records: list = field(default_factory=list)
    loss_fns: list[Callable[[], torch.Tensor]] = field(default_factory=list)
    seed: int = 0


@dataclass(eq=False)
class HeadScorer(ABC):
    """Subclasses set ``name``, ``needs`` (``"records"``, ``"loss"`` or ``""``) and ``score``."""

    name = ""
    needs = ""
    description = ""

    @abstractmethod
    def score(self, ctx: ScoringContext) -> np.ndarray:
        ...

    def __call__(self, ctx: ScoringContext) -> np.ndarray:
        if self.needs == "records" and not ctx.records:
            raise InputError(f"scorer {self.name!r} needs stats-mode capture records (ScoringContext.records)")
        if self.needs == "loss" and not ctx.loss_fns:
            raise InputError(f"scorer {self.name!r} needs loss closures (ScoringContext.loss_fns)")
        s = np.asarray(self.score(ctx), dtype=float)
        if s.shape != ctx.space.shape:
            raise ContractError(f"scorer {self.name!r} returned shape {s.shape}, expected {ctx.space.shape}")
        return s


def head_statistics(ctx: ScoringContext) -> dict[str, np.ndarray]:
    """Per-head attention statistics averaged over every record of each unit: ``variance``,
    ``entropy`` (normalised) and ``max_sim`` (largest similarity to another head of the unit), each
    ``[units, heads]`` (NaN beyond a unit's heads). Raises ValueError for a space holding units without a
    softmax map (Sana's linear self-attention, :attr:`~unicache_lib.pruning.heads.Unit.mapped` False)."""
    space = ctx.space
    mapless = [u for u in space.units if not getattr(u, "mapped", True)]
    if mapless:
        why = gen_family_of(space.model).uncaptured.get(mapless[0].part, "it forms no softmax map")
        raise InputError(f"{len(mapless)} units have no attention map to take statistics of "
                         f"({mapless[0].name}: {why}); the attention-statistics scorers cannot score them. Build the "
                         f"space without them, HeadSpace.of(transformer, mapless=False), or use the gradient / "
                         f"weight_norm / random scorers")
    if any(r.meta.get("stats_stride", 1) > 1 for r in ctx.records):
        raise InputError("these records were captured with stats_stride > 1: their head statistics are estimates from "
                         "a sample of query rows (head similarity the least reliable); capture with stats_stride=1 to "
                         "score heads")
    by_unit = {(u.layer, u.part): i for i, u in enumerate(space.units)}
    acc = {k: [[] for _ in space.units] for k in ("variance", "entropy", "max_sim")}
    for r in ctx.records:
        i = by_unit.get((r.layer, r.part))
        if i is None:
            continue
        d = r.data
        ent = d["norm_entropy"].float().nanmean(-1) if "norm_entropy" in d else d["row_entropy"][:, 0].float()
        hs = d["head_sim"].float().clone()
        hs.fill_diagonal_(-1.0)
        acc["variance"][i].append(d["variance"].float().numpy())
        acc["entropy"][i].append(ent.numpy())
        acc["max_sim"][i].append(hs.max(-1).values.numpy())
    out = {}
    for k, per_unit in acc.items():
        arr = np.full(space.shape, np.nan)
        for i, vals in enumerate(per_unit):
            if not vals:
                raise InputError(f"no records for unit {space.units[i].name} (layer {space.units[i].layer}, "
                                 f"part {space.units[i].part}): capture every layer in stats mode first")
            arr[i, : len(vals[0])] = np.mean(vals, 0)
        out[k] = arr
    return out


def rank01(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1] over the non-NaN entries (NaN stays NaN)."""
    out = np.full(x.shape, np.nan)
    ok = ~np.isnan(x)
    out[ok] = x[ok].argsort(kind="stable").argsort(kind="stable") / max(1, ok.sum() - 1)
    return out
