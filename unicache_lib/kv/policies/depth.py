"""Budgets by depth: how many image positions each layer keeps, for any cache-stage policy.

A uniform budget keeps ``k`` image positions in every one of the ``L`` image-KV layers. A depth schedule keeps
``k_l`` in layer ``l`` instead, and an equal-bytes schedule keeps the same total (``sum(k_l) == L * k``, checked),
so the cache holds exactly as many bytes as the uniform one; it only moves them between layers.

    from unicache_lib.kv.policies import POLICIES
    from unicache_lib.kv.policies.depth import by_profile, pyramid

    policy = POLICIES["key_coverage_merge"]().with_depth(pyramid())     # PyramidKV's linear shape
    policy = POLICIES["key_coverage_merge"]().with_depth(by_profile(widths, gamma=1.0))

The schedules:

- :func:`by_profile` — from a per-layer measurement: weights ``width_l ** gamma`` where ``width_l`` is how many image
  keys the layer's question reads (``exp`` of the entropy of its reading over the image; notebook 05 measures it on a
  design split, :func:`reading_widths`). ``gamma = 0`` is uniform; a layer that spreads its reading gets more.
- :func:`pyramid` — PyramidKV's shape (Cai et al. 2024, as kvpress's ``PyramidKVPress`` computes it): linear from
  ``2 * k - k / beta`` in the first layer down to ``k / beta`` in the last (``beta = 20``, the authors' default).
- :func:`keep_then_drop` — DIPrune's shape: every image position in the first ``layers`` layers, ``k`` after. It
  cannot hold the uniform bytes (the first layers alone hold more), so it is the one schedule that is *not*
  equal-bytes: its rows report their own, larger, ``kv_fraction``.

The transformers cache then holds layers of different lengths; :func:`~unicache_lib.kv.decode.answer` gives every
layer its own attention mask (:func:`~unicache_lib.kv.decode.layer_masks`). One prompt at a time (batch 1).
"""
from dataclasses import dataclass

import numpy as np
import torch

from ...core.errors import InputError


@dataclass(frozen=True)
class DepthSchedule:
    """``counts(n_layers, n_image, k)`` -> per layer the image positions kept. ``weights``: relative shares per layer
    (equal-bytes: the counts add up to ``n_layers * k``), or None with ``keep_all`` first layers kept whole."""

    name: str
    weights: tuple | None = None
    keep_all: int = 0

    def counts(self, n_layers: int, n_image: int, k: int) -> list[int]:
        _check_k(n_image, k)
        if self.weights is None:  # keep-then-drop
            if not 0 < self.keep_all < n_layers:
                raise InputError(f"keep_then_drop: layers must be in 1..{n_layers - 1} on a model with {n_layers} "
                                 f"image-KV layers, got {self.keep_all}")
            return [n_image] * self.keep_all + [k] * (n_layers - self.keep_all)
        if len(self.weights) != n_layers:
            raise InputError(f"depth schedule {self.name!r} has {len(self.weights)} layer weights for a model with "
                             f"{n_layers} image-KV layers: derive it on this model (reading_widths)")
        return equal_bytes_counts(np.asarray(self.weights, float), n_image, k)

    @property
    def equal_bytes(self) -> bool:
        return self.weights is not None


def equal_bytes_counts(weights, n_image: int, k: int) -> list[int]:
    """Integer counts proportional to ``weights`` (finite, >= 0, not all 0), each in ``[1, n_image]``, adding up to
    ``len(weights) * k`` exactly: a layer whose share falls outside ``[1, n_image]`` is clamped and the others share
    what is left (water-filling), then the largest remainders round."""
    w = _weights(weights)
    _check_k(n_image, k)
    L, total = len(w), len(w) * k
    # the schedule depends on the weights' ratios only, whatever their scale; a zero weight still takes what the
    # capped layers cannot
    w = w / w.max() + 1e-12
    lo, hi = 0.0, 1.0
    while np.clip(hi * w, 1, n_image).sum() < total:  # water level: sum(clip(level * w, 1, n_image)) == total
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.clip(mid * w, 1, n_image).sum() < total else (lo, mid)
    share = np.clip(hi * w, 1, n_image)
    share *= total / share.sum()
    counts = np.clip(np.floor(share + 1e-9).astype(int), 1, n_image)
    order = [i for i in np.argsort(-(share - counts), kind="stable") if counts[i] < n_image]
    counts[order[: total - counts.sum()]] += 1  # distinct indices: one each
    if counts.sum() != total:
        raise InputError(f"no counts in [1, {n_image}] for weights {w.tolist()} add up to {total}")
    return [int(c) for c in counts]


def _weights(weights) -> np.ndarray:
    """One finite, non-negative weight per layer, not all zero (a bool is not a weight)."""
    try:
        w = np.asarray(weights, float)
    except (TypeError, ValueError):
        raise InputError(f"depth weights must be numbers, one per layer, got {weights!r}") from None
    if w.ndim != 1 or not len(w) or np.asarray(weights).dtype == bool or not np.all(np.isfinite(w)) or (w < 0).any() \
            or w.sum() <= 0:
        raise InputError(f"depth weights must be one finite, non-negative number per layer, not all zero, got "
                         f"{w.tolist() if w.ndim else weights!r}")
    return w


def _check_k(n_image, k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_image:
        raise InputError(f"a depth schedule needs a whole number 1 <= k <= {n_image} of image positions per layer "
                         f"(the budget), got {k!r}")


def _number(name: str, v, lo: float, hi: float) -> float:
    """A real number in [lo, hi] (not a bool, not a string), or a one-line InputError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v) \
            or not lo <= v <= hi:
        raise InputError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def uniform(n_layers: int) -> DepthSchedule:
    """Every layer the same share (the counts equal the uniform budget's; a control for the schedule machinery)."""
    return DepthSchedule("uniform", (1.0,) * n_layers)


def pyramid(n_layers: int, beta: float = 20.0) -> DepthSchedule:
    """PyramidKV's linear schedule: layer ``l`` weighs ``max - l * (max - min) / (L - 1)`` with ``min = 1 / beta``
    and ``max = 2 - 1 / beta`` (kvpress's ``PyramidKVPress.get_layer_budget``, in units of the mean budget)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer)) or n_layers < 1:
        raise InputError(f"pyramid: n_layers must be the model's number of image-KV layers (an integer >= 1), got "
                         f"{n_layers!r}")
    beta = _number("pyramid: beta (kvpress asserts >= 1)", beta, 1.0, 1e6)
    lo, hi = 1.0 / beta, 2.0 - 1.0 / beta
    w = [hi - i * (hi - lo) / (n_layers - 1) for i in range(n_layers)] if n_layers > 1 else [1.0]
    return DepthSchedule(f"pyramid(beta={beta:g})", tuple(w))


def keep_then_drop(layers: int) -> DepthSchedule:
    """DIPrune's shape: the first ``layers`` layers keep every image position, the rest the budget (more bytes)."""
    if isinstance(layers, bool) or not isinstance(layers, (int, np.integer)) or layers < 1:
        raise InputError(f"keep_then_drop: layers must be a positive integer, got {layers!r}")
    return DepthSchedule(f"keep_then_drop({layers})", None, int(layers))


def by_profile(widths, gamma: float = 1.0, label: str = "profile") -> DepthSchedule:
    """Weights ``widths ** gamma`` per layer (``widths``: :func:`reading_widths`); ``gamma = 0`` is uniform."""
    w = _weights(widths)
    if (w <= 0).any():
        raise InputError(f"by_profile: widths must be positive (keys read per layer), got {w.tolist()}")
    gamma = _number("by_profile: gamma", gamma, -8.0, 8.0)
    w = np.exp(gamma * (np.log(w) - np.log(w).max()))  # widths ** gamma over its largest: no overflow at any scale
    return DepthSchedule(f"{label}(gamma={gamma:g})", tuple(float(x) for x in w))


def reading_width(future: torch.Tensor, image_positions: torch.Tensor) -> float:
    """``exp`` of the entropy of one layer's question reading (``future``: ``[C]`` attention on each context key,
    mean over heads and question tokens) restricted to the image keys and renormalised: how many image keys the
    question reads, in tokens (``n_image`` for an even reading, 1 for one key). float32."""
    if len(image_positions) == 0:
        raise InputError("reading_width needs the image positions of the context: none were given, so there is no "
                         "image reading to measure (pass ctx.image_positions of a prompt that holds an image)")
    p = future.float()[image_positions]
    if not bool(torch.isfinite(p).all()) or float(p.sum()) <= 0:
        raise InputError(f"reading_width: the attention on the image keys is {'not finite' if not bool(torch.isfinite(p).all()) else 'zero'}, "
                         f"so no reading width can be measured from it")
    p = p / p.sum().clamp_min(1e-30)
    return float((-(p * p.clamp_min(1e-30).log()).sum()).exp())


def reading_widths(futures: list) -> np.ndarray:
    """``[n_layers]`` mean over questions of :func:`reading_width` per layer; ``futures``: per question
    ``(per layer [C] reading, image_positions)``."""
    if not futures:
        raise InputError("reading_widths needs at least one question")
    return np.mean([[reading_width(f, img) for f in per_layer] for per_layer, img in futures], 0)
