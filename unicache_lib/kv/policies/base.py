"""The eviction-policy interface and its registry.

A policy picks, for every layer, which *image* positions of the context keep their keys and
values; non-image context positions are always kept. ``budget`` is the fraction of image
positions kept, the same count in every layer (a transformers cache is rectangular across
layers: one causal mask serves them all), unless a depth schedule moves it between layers.

A policy is a dataclass: its parameters are fields with the published or tuned defaults, checked when it is built
(``SnapKV(window=16)``, ``H2O(recent=0.25)``, ``KeyCoverage(metric="cosine")``). How it acts on a prefilled context
is its own method, :meth:`EvictionPolicy.apply`: a cache-stage policy chooses from the prefilled cache and drops what
it does not keep (``key_coverage_merge`` merges it into what it keeps); a :class:`PrefillStagePolicy` chooses the
image tokens before the language model runs and prefills only those. A press calls
:meth:`EvictionPolicy.compress_layer` on one layer instead.
"""
from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from ...core.errors import ContractError, InputError, InputTypeError
from ...core.registry import Registry, registrar
from ..cache import Compressed, EvictionContext, copy_layers, evict, non_image, prefill_pruned

if TYPE_CHECKING:
    from .depth import DepthSchedule

POLICIES: dict[str, type["EvictionPolicy"]] = Registry("eviction policy")
register = registrar(POLICIES, "policy")

__all__ = ["POLICIES", "EvictionContext", "EvictionPolicy", "PrefillStagePolicy", "ScorerPolicy", "copy_layers",
           "greedy_max_min", "non_image", "register", "top_k"]


@dataclass(eq=False)
class EvictionPolicy(ABC):
    """Subclasses set ``name`` (the registry's) and a one-line ``description``, declare their parameters as dataclass
    fields (checked in ``__post_init__``, which calls this one) and implement ``choose``.

    ``depth`` (keyword only): a :class:`~.depth.DepthSchedule` (:mod:`~.depth`): per-layer counts instead of one
    budget in every layer; the policy is then named ``"<name>@<schedule>"`` (:meth:`with_depth`)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    depth: DepthSchedule | None = field(default=None, kw_only=True)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for flag in ("stage", "merges"):  # the kind flags of an earlier interface: read by nothing any more
            if flag in cls.__dict__:
                raise ContractError(f"policy {cls.__name__}: `{flag}` is no longer read; how a policy acts is its class "
                                    f"and its apply(): subclass PrefillStagePolicy to choose before the prefill, or "
                                    f"override apply / compress_layer (policies/merge.py) to merge")

    def __post_init__(self):
        if self.depth is not None:
            self._set_depth(self.depth)

    def choose(self, ctx: EvictionContext, k: int) -> list:
        """Per layer, ``k`` indices into the image block. Every policy implements it, or overrides :meth:`select`
        instead (``full``, which ignores the budget)."""
        raise ContractError(f"policy {self.name!r} defines neither choose(ctx, k) nor select(ctx, budget): implement "
                            f"choose, returning per layer k indices into the image block")

    def require_cache(self, use: str) -> None:
        """Nothing: a cache-stage policy chooses from a prefilled cache, which ``use`` (a press, a depth schedule)
        needs. :class:`PrefillStagePolicy` refuses, and so does a policy that cannot choose from one layer's cache
        alone when ``use`` is a press (kvpress hands a press one layer at a time): :meth:`_one_layer_at_a_time`."""

    def _one_layer_at_a_time(self, use: str, why: str) -> None:
        if use == "a press":
            raise InputError(f"{self.name!r} {why}; a press sees one layer at a time, so it would keep other positions "
                             f"than the harness (or fail at the first forward): run it with run_eviction")

    def _set_depth(self, schedule) -> None:
        if not callable(getattr(schedule, "counts", None)):
            raise InputError(f"with_depth takes a DepthSchedule (unicache_lib.kv.policies.depth: pyramid, by_profile, "
                             f"keep_then_drop), got {schedule!r}")
        self.require_cache("a depth schedule")
        self.depth, self.name = schedule, f"{type(self).name}@{schedule.name}"

    def with_depth(self, schedule) -> "EvictionPolicy":
        """A copy of this (cache-stage) policy that keeps per layer the counts ``schedule`` gives
        (:mod:`~unicache_lib.kv.policies.depth`), named ``"<name>@<schedule>"``."""
        new = copy.copy(self)
        new._set_depth(schedule)
        return new

    def counts(self, n_layers: int, n_image: int, k: int) -> list[int]:
        """Per policy layer, the image positions kept when the budget allows ``k`` in each: ``k``, or the depth
        schedule's counts (the same total for an equal-bytes schedule)."""
        return [k] * n_layers if self.depth is None else self.depth.counts(n_layers, n_image, k)

    def select(self, ctx: EvictionContext, budget: float) -> list[torch.Tensor]:
        """Per cache layer, the positions kept when ``budget`` (a fraction in [0, 1]) of the image
        tokens stays (see :meth:`EvictionContext.assemble`); with a depth schedule, layer ``l`` keeps its own count,
        chosen by the policy's own ``choose`` at that count."""
        counts = self.counts(ctx.n_layers, ctx.n_image, ctx.k(budget))
        by_k = {k: self.choose(ctx, k) for k in sorted(set(counts))}
        for per_layer in by_k.values():
            if len(per_layer) != ctx.n_layers:
                raise ContractError(f"policy {self.name!r} chose for {len(per_layer)} layers, the model has {ctx.n_layers}")
        chosen = [by_k[k][li] for li, k in enumerate(counts)]
        for c, k in zip(chosen, counts):
            if len(set(np.asarray(c).tolist())) != k:
                raise ContractError(f"policy {self.name!r} kept {len(c)} image positions, budget allows {k}")
        return ctx.assemble(chosen)

    def apply(self, model, pre, ctx: EvictionContext, budget: float) -> Compressed:
        """What this policy leaves of the prefilled context ``pre`` (a :class:`~unicache_lib.kv.cache.Prefill`; ``ctx``
        its :meth:`~unicache_lib.kv.cache.Prefill.context`) at ``budget``: here a copy of the cache holding, per
        layer, the positions :meth:`select` keeps, the rest dropped (``model`` is not needed to drop)."""
        keep = self.select(ctx, budget)
        return Compressed(evict(pre.cache, keep), pre.split, keep)

    def compress_layer(self, keys: torch.Tensor, values: torch.Tensor, img: torch.Tensor, chosen) -> tuple:
        """The same action on one layer inside a press: ``keys`` / ``values`` ``[1, H_kv, S, D]`` of the prompt,
        ``img`` its image positions, ``chosen`` the kept ones (indices into ``img``) -> ``(keys, values, bias)`` with
        the other image positions dropped; ``bias`` (the layer's additive attention term, :attr:`Compressed.bias`)
        None."""
        idx = kept_index(keys.shape[2], img, chosen)
        return keys.index_select(2, idx), values.index_select(2, idx), None


@dataclass(eq=False)
class PrefillStagePolicy(EvictionPolicy):
    """A policy that chooses the image tokens from ``ctx.features`` *before* the language model runs: the context is
    prefilled on the kept tokens only (prefill compute saved too), and ``choose`` returns one index list (``ctx.n_layers``
    is 1), or ``(indices, features [len(indices), D])`` for the kept tokens to take those embeddings (a merge, e.g.
    pooling). ``renumber``: the kept tokens get consecutive positions, as when the pruned sequence is fed to the model
    (else their original ones). ``exact_budget = False`` lets ``choose`` keep fewer than the budget allows."""

    exact_budget: ClassVar[bool] = True
    renumber: bool = True

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.renumber, (bool, np.bool_)):
            raise InputTypeError(f"{self.name}: renumber must be True or False, got {self.renumber!r}")

    def require_cache(self, use: str) -> None:
        raise InputError(f"{use} needs a cache-stage eviction policy (e.g. POLICIES['key_coverage']()), and "
                         f"{self.name!r} is a prefill-stage policy: it chooses before the language model runs (one "
                         f"token list for every layer), where there is no cache to compress")

    def apply(self, model, pre, ctx: EvictionContext, budget: float) -> Compressed:
        """Prune the image tokens before the language model and prefill the kept ones only (timed,
        :func:`~unicache_lib.kv.cache.prefill_pruned`): ``pre`` gives the split and ``ctx`` the picture's grid; its
        cache is not used."""
        t0 = time.perf_counter()
        pp, split, keep = prefill_pruned(model, pre.split, self.token_picker(ctx, budget), renumber=self.renumber)
        return Compressed(pp.cache, split, [keep] * ctx.n_layers, prefill_tokens=len(keep),
                          prefill_ms=1e3 * (time.perf_counter() - t0))

    def token_picker(self, ctx: EvictionContext, budget: float):
        """The ``choose(features [n_image, D]) -> indices`` callable that :func:`~unicache_lib.kv.cache.prefill_pruned`
        takes, keeping ``budget`` of the image tokens and checking that the policy returned one list of that many
        distinct indices."""
        k = ctx.k(budget)

        def pick(features):
            chosen = self.choose(replace(ctx, n_layers=1, attentions=[], kv=None, features=features), k)
            idx = chosen[0][0] if len(chosen) == 1 and isinstance(chosen[0], tuple) else chosen[0] if chosen else []
            n = len(set(np.asarray(idx).tolist()))
            if len(chosen) != 1 or n != len(idx) or (n != k if self.exact_budget else not 0 < n <= k):
                raise ContractError(f"prefill-stage policy {self.name!r} must return one list of "
                                   f"{'' if self.exact_budget else 'at most '}{k} distinct indices")
            return chosen[0]
        return pick


@dataclass(eq=False)
class ScorerPolicy(EvictionPolicy):
    """Score, then keep the ``k`` best: subclasses implement ``score(ctx, layer) -> [n_image]`` (high = keep).
    ``per_layer = False``: one ranking (``score(ctx, 0)``) for every layer. kvpress factors its presses alike
    (``ScorerPress``)."""

    per_layer: ClassVar[bool] = True

    def require_cache(self, use: str) -> None:
        if not self.per_layer:
            self._one_layer_at_a_time(use, "ranks the image keys once, from one layer, for every layer")

    @abstractmethod
    def score(self, ctx, layer: int):
        """``[n_image]`` scores of layer ``layer``'s image positions, high = keep."""

    def choose(self, ctx, k):
        return ([top_k(self.score(ctx, li), k) for li in range(ctx.n_layers)] if self.per_layer  # one ranking per layer
                else [top_k(self.score(ctx, 0), k)] * ctx.n_layers)


def kept_index(n: int, img: torch.Tensor, chosen) -> torch.Tensor:
    """The positions ``0..n-1`` kept when of the image positions ``img`` only ``img[chosen]`` stay, in order."""
    keep = torch.ones(n, dtype=torch.bool, device=img.device)
    keep[img] = False
    keep[img[torch.as_tensor(chosen, device=img.device)]] = True
    return keep.nonzero().flatten()


def top_k(scores, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores (stable: earlier index wins ties)."""
    s = np.asarray(torch.as_tensor(scores).float())
    return np.argsort(-s, kind="stable")[:k]


def greedy_max_min(dist: torch.Tensor, k: int, start: int) -> list[int]:
    """Greedy max-min selection (k-center) on a distance matrix ``dist [n, n]``: ``min(k, n)`` indices, the first
    ``start``, each next the index farthest from its nearest chosen one."""
    if k <= 0:
        return []
    chosen = [int(start)]
    nearest = dist[start].clone()
    nearest[start] = -1.0
    while len(chosen) < min(k, dist.shape[0]):
        j = int(nearest.argmax())
        chosen.append(j)
        nearest = torch.minimum(nearest, dist[j])
        nearest[chosen] = -1.0
    return chosen
