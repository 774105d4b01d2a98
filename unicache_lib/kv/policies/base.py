"""The eviction-policy interface and its registry.

A policy picks, for every layer, which *image* positions of the context keep their keys and
values; non-image context positions are always kept. ``budget`` is the fraction of image
positions kept, the same count in every layer (a transformers cache is rectangular across
layers: one causal mask serves them all).
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import numpy as np
import torch

from ...core.errors import ContractError, InputError
from ...core.registry import Registry, registrar
from ...inputs import check_fraction

POLICIES: dict[str, type["EvictionPolicy"]] = Registry("eviction policy")
register = registrar(POLICIES, "policy")


@dataclass
class EvictionContext:
    """What a policy may look at.

    ``seq_len``: length C of the image-holding cache layers; ``image_positions [n_image]`` in them;
    ``n_layers``: how many layers hold image KV (policy layer ``i`` is cache layer
    ``cache_layers[i]``, all cache layers by default); ``attentions``: per such layer ``[H, Cq, C]``
    float32 prefill attention (empty if not captured); ``future``: per such layer ``[C]`` attention mass
    the question's queries put on each key (oracle only); ``keep_always``: positions every policy keeps
    (default: every non-image position); ``grid``: indices into the image block of the tokens that tile the
    picture row by row (None: the family's image tokens form no single grid); ``kv``: per such layer a
    zero-argument callable returning that layer's cached ``(keys, values)``, each ``[H_kv, C, D]`` (read
    lazily: a 7B model's float32 copies of every layer would not fit beside it); ``features``: ``[n_image, D]``
    the image embeddings the language model receives (prefill-stage policies only); ``encode``: ``(rows, cols) ->
    [rows * cols, D]``, the picture re-encoded at a coarser patch grid by the family's vision tower (the
    downsampled-image control; :meth:`~unicache_lib.families.base.VLMFamily.image_features_at`); ``first_keys``:
    ``(embeddings [n, hidden]) -> [n, H_kv * D]``, the keys the first language-model layer computes for them
    (:meth:`~unicache_lib.families.base.VLMFamily.first_layer_keys`).
    """

    seq_len: int
    image_positions: torch.Tensor
    n_layers: int
    attentions: list
    seed: int = 0
    future: list | None = None
    cache_layers: list | None = None
    n_cache_layers: int | None = None
    keep_always: torch.Tensor | None = None
    grid: torch.Tensor | None = None
    kv: list | None = None
    features: torch.Tensor | None = None
    encode: object = None
    first_keys: object = None

    @property
    def n_image(self) -> int:
        return len(self.image_positions)

    def k(self, budget: float) -> int:
        """Image positions kept at ``budget`` (a fraction of the image tokens in [0, 1]; a string or a
        count is refused by :func:`~unicache_lib.inputs.check_fraction`)."""
        budget = check_fraction(budget, "budget", meaning="of the image tokens kept")
        return int(round(budget * self.n_image))

    def assemble(self, chosen: list) -> list:
        """Per cache layer: the always-kept positions plus the chosen image positions (indices into
        the image block, 0..n_image-1), as sorted cache positions; None for cache layers that hold no
        image KV (left as they are)."""
        img = self.image_positions
        other = non_image(self.seq_len, img) if self.keep_always is None else self.keep_always
        per = [torch.cat([other, img[torch.as_tensor(np.asarray(ch), dtype=torch.long).reshape(-1)]]).sort().values
               for ch in chosen]
        if self.cache_layers is None or list(self.cache_layers) == list(range(self.n_cache_layers or len(per))):
            return per
        out: list = [None] * self.n_cache_layers
        for li, keep in zip(self.cache_layers, per):
            out[li] = keep
        return out

    def image_reads(self, layer: int) -> torch.Tensor:
        """``[n_image]``: attention each image key receives from all context queries, mean over heads."""
        if not self.attentions:
            raise InputError("this policy needs the prefill attention: prefill(..., attentions=True) on an eager model")
        return self.attentions[layer].mean(0).sum(0)[self.image_positions]

    def image_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of the image positions in policy layer ``layer``, each ``[H_kv, n_image, D]``
        float32 (keys after the rotary embedding, as cached)."""
        if not self.kv:
            raise InputError("this policy reads the cached keys and values: build the context with Prefill.context()")
        k, v = self.kv[layer]()
        idx = self.image_positions.to(k.device)
        return k.index_select(-2, idx).float(), v.index_select(-2, idx).float()


@dataclass(eq=False)
class EvictionPolicy(ABC):
    """Subclasses set ``name`` (and a one-line ``description``) and implement ``choose``.

    ``stage``: ``"cache"`` (default) — the context is prefilled in full and the policy chooses what the cache
    keeps afterwards, per layer; ``"prefill"`` — the policy chooses image tokens from ``ctx.features`` before
    the language model runs, the context is prefilled on the kept tokens only (prefill compute saved too) and
    ``choose`` returns one index list (``ctx.n_layers`` is 1). ``renumber`` (prefill stage): the kept tokens
    get consecutive positions, as when the pruned sequence is fed to the model (else their original ones).
    A prefill-stage ``choose`` may return ``(indices, features [len(indices), D])``: the kept tokens take those
    embeddings (a merge, e.g. pooling); ``exact_budget = False`` lets it keep fewer than the budget allows.
    """

    name = ""
    description = ""
    stage = "cache"
    renumber = True
    exact_budget = True

    def choose(self, ctx: EvictionContext, k: int) -> list:
        """Per layer, ``k`` indices into the image block. Every policy implements it, or overrides :meth:`select`
        instead (``full``, which ignores the budget)."""
        raise ContractError(f"policy {self.name!r} defines neither choose(ctx, k) nor select(ctx, budget): implement "
                            f"choose, returning per layer k indices into the image block")

    depth = None  # a DepthSchedule (policies/depth.py): per-layer counts instead of one budget in every layer

    def with_depth(self, schedule) -> "EvictionPolicy":
        """A copy of this (cache-stage) policy that keeps per layer the counts ``schedule`` gives
        (:mod:`~unicache_lib.kv.policies.depth`), named ``"<name>@<schedule>"``."""
        if not callable(getattr(schedule, "counts", None)):
            raise InputError(f"with_depth takes a DepthSchedule (unicache_lib.kv.policies.depth: pyramid, by_profile, "
                             f"keep_then_drop), got {schedule!r}")
        if self.stage != "cache":
            raise InputError(f"policy {self.name!r} chooses before the language model runs (one token list for every "
                             f"layer): a depth schedule needs a cache-stage policy such as key_coverage")
        new = copy.copy(self)
        new.depth, new.name = schedule, f"{self.name}@{schedule.name}"
        return new

    def layer_counts(self, ctx: EvictionContext, budget: float) -> list[int]:
        """Per policy layer, the image positions kept at ``budget``: ``ctx.k(budget)`` in each, or the depth
        schedule's counts."""
        k = ctx.k(budget)
        return [k] * ctx.n_layers if self.depth is None else self.depth.counts(ctx.n_layers, ctx.n_image, k)

    def select(self, ctx: EvictionContext, budget: float) -> list[torch.Tensor]:
        """Per cache layer, the positions kept when ``budget`` (a fraction in [0, 1]) of the image
        tokens stays (see :meth:`EvictionContext.assemble`); with a depth schedule, layer ``l`` keeps its own count,
        chosen by the policy's own ``choose`` at that count."""
        counts = self.layer_counts(ctx, budget)
        by_k = {k: self.choose(ctx, k) for k in sorted(set(counts))}
        for per_layer in by_k.values():
            if len(per_layer) != ctx.n_layers:
                raise ContractError(f"policy {self.name!r} chose for {len(per_layer)} layers, the model has {ctx.n_layers}")
        chosen = [by_k[k][li] for li, k in enumerate(counts)]
        for c, k in zip(chosen, counts):
            if len(set(np.asarray(c).tolist())) != k:
                raise ContractError(f"policy {self.name!r} kept {len(c)} image positions, budget allows {k}")
        return ctx.assemble(chosen)

    def token_picker(self, ctx: EvictionContext, budget: float):
        """Prefill-stage policies: the ``choose(features [n_image, D]) -> indices`` callable that
        :func:`~unicache_lib.kv.cache.prefill_pruned` takes, keeping ``budget`` of the image tokens and checking
        that the policy returned one list of that many distinct indices."""
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


class ScorerPolicy(EvictionPolicy):
    """Score, then keep the ``k`` best: subclasses implement ``score(ctx, layer) -> [n_image]`` (high = keep).
    ``per_layer = False``: one ranking (``score(ctx, 0)``) for every layer. kvpress factors its presses alike
    (``ScorerPress``)."""

    per_layer = True

    @abstractmethod
    def score(self, ctx, layer: int):
        """``[n_image]`` scores of layer ``layer``'s image positions, high = keep."""

    def choose(self, ctx, k):
        if not self.per_layer:
            return [top_k(self.score(ctx, 0), k)] * ctx.n_layers
        return [top_k(self.score(ctx, li), k) for li in range(ctx.n_layers)]


def non_image(n: int, img: torch.Tensor) -> torch.Tensor:
    """The positions ``0..n-1`` not in ``img``, sorted."""
    return torch.tensor(sorted(set(range(n)) - set(img.tolist())), dtype=torch.long)


def copy_layers(cache):
    """A shallow copy of ``cache`` with its own layer objects (tensors shared), so keys and values can be reassigned."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    return new


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
