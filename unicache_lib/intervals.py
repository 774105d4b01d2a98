"""Uncertainty: 95% intervals for what a scoreboard row measures, right at the edges.

Each interval is over a *stated unit* (samples, questions, prompts, layers, timing repeats) and uses
the method that keeps its coverage where this workbook's numbers sit (accuracies near 1):

- a share of 0/1 outcomes: the Wilson score interval (30 of 30 gives [0.886, 1], not [1, 1]);
- a difference or ratio of two shares (0/1 outcomes on both sides): Newcombe's score method (MOVER
  with Wilson limits; paired units carry their phi correlation), the ratio by inverting it;
- anything else (means, ratios of means, medians, any statistic of a list of units): the BCa
  bootstrap (``scipy.stats.bootstrap``), ``n_boot`` resamples with a fixed seed.

Arithmetic is float64 numpy (never below fp32). Fewer than 2 units raise a :class:`ValueError`.
``Interval.method`` names the method used; an interval has zero width only when every unit (or every
resample) is identical, and its method says so.

    mean_interval(x, "samples")                      # x [n]
    difference_interval(a, b, "questions")           # paired: a, b [n] on the same units
    difference_interval(a, b, "prompts", paired=False)   # a [n_a], b [n_b] independent groups
    ratio_interval(a, b, "samples")                  # mean(a) / mean(b)
    proportion_interval(ok, "questions")             # per-unit 0/1 outcomes
    bootstrap(units, statistic, "prompts")           # anything: statistic(list of units) -> float
    extreme_of([iv_a, iv_b], min)                    # the weakest of several cells, from their own intervals
    speedup_interval(base_s, method_s)               # paired timing repeats -> speed-up
    interleaved_timings({"a": f, "b": g}, repeats=10)    # shuffled order in every repeat

Where BCa is undefined (a statistic that is not finite on some resamples, or whose jackknife is
flat) the interval falls back to the bootstrap percentile interval and its method says so.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import optimize, stats

from .core.errors import InputError

LEVEL = 0.95
N_BOOT = 2000
SEED = 0
MIN_TIMING_REPEATS = 10
BCA = "BCa bootstrap"
IDENTICAL = "every unit identical"


@dataclass(frozen=True)
class Interval:
    """A point value with its interval. ``se`` is a standard error (bootstrap s.d. of the resampled
    statistic, or the binomial one for shares), used to estimate how many units would settle a verdict."""

    value: float
    lo: float
    hi: float
    n: int
    unit: str
    se: float = float("nan")
    method: str = BCA

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}] (n = {self.n} {self.unit})"


def _check_n(n: int, unit: str) -> None:
    if not unit:
        raise InputError("name the unit the interval is over (samples, questions, prompts, layers, repeats)")
    if n < 2:
        raise InputError(f"an interval needs at least 2 {unit}, got {n}: measure more {unit} "
                         "(one unit has no spread to resample)")


def _as_1d(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise InputError(f"{name} must be one value per unit, shape [n]; got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InputError(f"{name} has {int((~np.isfinite(a)).sum())} non-finite values: drop or fix those units first")
    return a


def _binary(*xs: np.ndarray) -> bool:
    return all(np.isin(x, (0.0, 1.0)).all() for x in xs)


def _result(value: float, lo: float, hi: float, n: int, unit: str, se: float, method: str) -> Interval:
    # the point value always lies inside its own interval (a resampled interval of a skewed statistic
    # can miss it by rounding); widen rather than report an interval that excludes it
    lo, hi = min(float(lo), float(value)), max(float(hi), float(value))
    return Interval(float(value), lo, hi, int(n), unit, float(se), method)


def _expanded(level: float, n: int) -> float:
    """The level whose normal quantile is ``sqrt(n / (n - 1)) * t[n-1]`` at ``level``: a resampling interval
    uses the plug-in spread and normal quantiles, and so is too narrow on few units (Hesterberg's expanded
    interval; 0.95 becomes 0.9625 at n = 30 and 0.9526 at n = 150)."""
    return float(2 * stats.norm.cdf(np.sqrt(n / (n - 1)) * stats.t.ppf(0.5 + level / 2, n - 1)) - 1)


def _bca(data: tuple, statistic: Callable, value: float, n: int, unit: str, level: float, n_boot: int, seed: int,
         paired: bool = False, vectorized: bool = True) -> Interval:
    """``scipy.stats.bootstrap`` (BCa) of ``statistic(*data)``; percentile where BCa is undefined."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(data, statistic, n_resamples=n_boot, confidence_level=_expanded(level, n), method="BCa",
                              paired=paired, vectorized=vectorized, rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    finite = dist[np.isfinite(dist)]
    if len(finite) == 0:
        raise InputError(f"the statistic was not finite on any resample of the {n} {unit}")
    if finite.min() == finite.max() == value:
        return Interval(float(value), float(value), float(value), int(n), unit, 0.0, "every resample identical")
    lo, hi = res.confidence_interval
    if np.isfinite(lo) and np.isfinite(hi):
        return _result(value, lo, hi, n, unit, finite.std(), BCA)
    a = (1 - _expanded(level, n)) / 2
    lo, hi = np.quantile(finite, [a, 1 - a])
    return _result(value, lo, hi, n, unit, finite.std(), "expanded bootstrap percentile (BCa undefined here)")


def mean_interval(x, unit: str, n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL) -> Interval:
    """Mean of ``x [n]`` (one value per unit) with its BCa interval over the units (Wilson when every
    value is 0 or 1: then it is a share)."""
    x = _as_1d(x, "x")
    _check_n(len(x), unit)
    if _binary(x):
        return proportion_interval(x, unit, level=level)
    return (Interval(float(x[0]), float(x[0]), float(x[0]), len(x), unit, 0.0, IDENTICAL) if x.min() == x.max()
            else _bca((x,), np.mean, float(x.mean()), len(x), unit, level, n_boot, seed))


def _wilson(k: int, n: int, level: float) -> tuple[float, float]:
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def proportion_interval(outcomes, unit: str, n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL) -> Interval:
    """Share of 1s among per-unit 0/1 outcomes ``[n]`` (bool or 0/1), with its Wilson score interval
    (``n_boot`` and ``seed`` are accepted for a uniform signature and unused)."""
    x = _as_1d(np.asarray(outcomes, dtype=np.float64), "outcomes")
    if not _binary(x):
        raise InputError("outcomes must be 0/1 (or bool) per unit; use mean_interval for other values")
    _check_n(len(x), unit)
    k, n = int(x.sum()), len(x)
    lo, hi = _wilson(k, n, level)
    p = k / n
    return _result(p, lo, hi, n, unit, np.sqrt(max(p * (1 - p), 0.25 / n) / n), "Wilson score")


def _phi(a: np.ndarray, b: np.ndarray) -> float:
    """Phi correlation of paired 0/1 outcomes (0 when a margin is empty), as Newcombe's method 10 uses."""
    both, only_a = float(np.sum((a == 1) & (b == 1))), float(np.sum((a == 1) & (b == 0)))
    only_b, neither = float(np.sum((a == 0) & (b == 1))), float(np.sum((a == 0) & (b == 0)))
    den = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    return 0.0 if den == 0 else (both * neither - only_a * only_b) / np.sqrt(den)


def _mover(p1, l1, u1, p2, l2, u2, r: float, c: float = 1.0) -> tuple[float, float]:
    """MOVER limits of ``p1 - c * p2`` from each share's Wilson limits and their correlation ``r``
    (Newcombe 1998, method 10, at ``c = 1``)."""
    d = p1 - c * p2
    lo = d - np.sqrt(max((p1 - l1) ** 2 - 2 * r * (p1 - l1) * c * (u2 - p2) + (c * (u2 - p2)) ** 2, 0.0))
    hi = d + np.sqrt(max((u1 - p1) ** 2 - 2 * r * (u1 - p1) * c * (p2 - l2) + (c * (p2 - l2)) ** 2, 0.0))
    return lo, hi


def _shares(a: np.ndarray, b: np.ndarray, paired: bool, level: float):
    (l1, u1), (l2, u2) = _wilson(a.sum(), len(a), level), _wilson(b.sum(), len(b), level)
    return a.mean(), l1, u1, b.mean(), l2, u2, (_phi(a, b) if paired else 0.0)


def _pair_n(a, b, paired: bool, unit: str, what: str) -> int:
    """The number of units of a two-sided interval (paired: the pairs; unpaired: the smaller group), checked."""
    if paired and len(a) != len(b):
        raise InputError(f"paired {what} needs the same units on both sides, got {len(a)} and {len(b)}; "
                         "pass paired=False for independent groups")
    n = len(a) if paired else min(len(a), len(b))
    _check_n(n, unit)
    return n


def difference_interval(a, b, unit: str, paired: bool = True, n_boot: int = N_BOOT, seed: int = SEED,
                        level: float = LEVEL) -> Interval:
    """``mean(a) - mean(b)``. Paired (``a, b [n]`` measured on the same units, e.g. the same questions
    under two methods) or unpaired (``a [n_a]``, ``b [n_b]``, independent groups; ``n`` is the smaller).
    0/1 outcomes on both sides: Newcombe's score interval (paired: method 10, with the pairs' phi
    correlation); otherwise the BCa bootstrap (paired: of the per-unit differences)."""
    a, b = _as_1d(a, "a"), _as_1d(b, "b")
    n = _pair_n(a, b, paired, unit, "difference")
    if _binary(a, b):
        lo, hi = _mover(*_shares(a, b, paired, level))
        se = (a - b).std() / np.sqrt(n) if paired else np.sqrt(a.var() / len(a) + b.var() / len(b))
        return _result(a.mean() - b.mean(), lo, hi, n, unit, se,
                       "Newcombe score, paired" if paired else "Newcombe score")
    return mean_interval(a - b, unit, n_boot, seed, level) if paired else \
        _bca((a, b), lambda x, y, axis=-1: x.mean(axis) - y.mean(axis), float(a.mean() - b.mean()), n, unit, level,
             n_boot, seed)


def _ratio_of_shares(a: np.ndarray, b: np.ndarray, paired: bool, level: float) -> tuple[float, float]:
    """Interval of ``mean(a) / mean(b)`` for 0/1 outcomes: the ratios ``c`` at which the score interval of
    ``mean(a) - c * mean(b)`` (:func:`_mover`) just reaches 0."""
    sh = _shares(a, b, paired, level)
    est = sh[0] / sh[3]
    low, high = (lambda c: _mover(*sh, c)[0]), (lambda c: _mover(*sh, c)[1])
    # the numerator share's Wilson limit is 0: so is the ratio's
    lo = 0.0 if sh[1] <= 0 else optimize.brentq(low, 0.0, est) if low(est) < 0 else est
    top = max(est, 1e-12) * 2
    while high(top) > 0 and top < 1e9:
        top *= 2
    return lo, (optimize.brentq(high, est, top) if high(est) > 0 else est)


def ratio_interval(a, b, unit: str, paired: bool = True, n_boot: int = N_BOOT, seed: int = SEED,
                   level: float = LEVEL) -> Interval:
    """``mean(a) / mean(b)`` (a ratio of means, not a mean of ratios), paired or not as in
    :func:`difference_interval`: 0/1 outcomes on both sides by inverting Newcombe's score interval,
    otherwise the BCa bootstrap. ``mean(b)`` must not be 0."""
    a, b = _as_1d(a, "a"), _as_1d(b, "b")
    if b.mean() == 0:
        raise InputError("ratio_interval: mean(b) is 0, the ratio is undefined; compare a difference instead")
    n = _pair_n(a, b, paired, unit, "ratio")
    value = float(a.mean() / b.mean())
    if _binary(a, b):
        lo, hi = _ratio_of_shares(a, b, paired, level)
        return _result(value, lo, hi, n, unit, (hi - lo) / (2 * stats.norm.ppf(0.5 + level / 2)),
                       "Newcombe score ratio, paired" if paired else "Newcombe score ratio")
    if paired and (a == a[0]).all() and (b == b[0]).all():
        return Interval(value, value, value, n, unit, 0.0, IDENTICAL)

    def ratio(x, y, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            return x.mean(axis) / y.mean(axis)
    return _bca((a, b), ratio, value, n, unit, level, n_boot, seed, paired=paired)


def bootstrap(units: Sequence, statistic: Callable[[list], float], unit: str, n_boot: int = N_BOOT,
              seed: int = SEED, level: float = LEVEL) -> Interval:
    """Any statistic of a list of units (each unit any object: a sample's rows, a prompt's per-layer
    curve ...): ``statistic(units)`` is the value; its BCa interval comes from ``n_boot`` resamples with
    replacement and the ``n`` leave-one-out jackknife values."""
    units = list(units)
    _check_n(len(units), unit)
    value = float(statistic(units))
    if not np.isfinite(value):
        raise InputError(f"the statistic is not finite on the {len(units)} {unit} themselves")
    return _bca((np.arange(len(units)),), lambda idx: float(statistic([units[int(i)] for i in idx])), value,
                len(units), unit, level, n_boot, seed, vectorized=False)


def grouped(values: dict, unit: str, statistic: Callable[[dict], float], n_boot: int = N_BOOT, seed: int = SEED,
            level: float = LEVEL) -> Interval:
    """Independent groups resampled separately (stratified BCa bootstrap): ``values`` maps group ->
    sequence of its units; ``statistic`` gets the same mapping with each group resampled. ``n`` is the
    smallest group. E.g. same-colour vs different-colour prompts, or two models' prompt sets."""
    keys = list(values)
    seqs = {k: list(values[k]) for k in keys}
    n = min(len(s) for s in seqs.values())
    _check_n(n, unit)
    value = float(statistic(seqs))

    def stat(*idx):
        return float(statistic({k: [seqs[k][int(i)] for i in ix] for k, ix in zip(keys, idx)}))
    return _bca(tuple(np.arange(len(seqs[k])) for k in keys), stat, value, n, unit, level, n_boot, seed,
                vectorized=False)


def extreme_of(cells, reduce=min) -> Interval:
    """The smallest (``reduce=min``) or largest (``reduce=max``) of several cells' values — the weakest model, the
    worst (budget, peer) cell — with its interval built from the cells' own intervals: ``[reduce(lo), reduce(hi)]``.
    Read against a threshold this is the intersection-union rule: "every cell above t" holds exactly when every
    cell's interval clears t, and does not hold when some cell's whole interval is below it. (A bootstrap of the
    minimum itself is biased — every resample's noise lowers it — and no bootstrap interval is reliable for it.)
    ``cells``: Intervals (a list, or a dict name -> Interval); nested use composes (the largest of minima)."""
    if not (ivs := list(cells.values()) if isinstance(cells, dict) else list(cells)):
        raise InputError("extreme_of needs at least one cell")
    if reduce not in (min, max):
        raise InputError("reduce must be min or max")
    units = {i.unit for i in ivs}
    return Interval(float(reduce(i.value for i in ivs)), float(reduce(i.lo for i in ivs)), float(reduce(i.hi for i in ivs)),
                    min(i.n for i in ivs), units.pop() if len(units) == 1 else " / ".join(sorted(units)),
                    method=f"{reduce.__name__} of {len(ivs)} cells' intervals (intersection-union)")


def speedup_interval(base_seconds, method_seconds, n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL,
                     min_repeats: int = MIN_TIMING_REPEATS) -> Interval:
    """Speed-up of a method over a baseline from paired timing repeats ``[n]`` (repeat ``i`` of both
    ran in the same interleaved round): the median of the per-repeat ratios ``base_i / method_i``, with
    a BCa interval over repeats. Fewer than ``min_repeats`` repeats raise: a wall-clock verdict
    needs them (pass ``min_repeats=2`` for a smoke run, and do not decide anything on it)."""
    b, m = _as_1d(base_seconds, "base_seconds"), _as_1d(method_seconds, "method_seconds")
    if len(b) != len(m):
        raise InputError(f"paired repeats needed: {len(b)} baseline vs {len(m)} method timings")
    if len(b) < min_repeats:
        raise InputError(f"a timing interval needs >= {min_repeats} interleaved repeats, got {len(b)}: raise the repeat count")
    _check_n(len(b), "repeats")
    if (m <= 0).any() or (b <= 0).any():
        raise InputError("timings must be positive seconds")
    r = b / m
    if r.min() == r.max():
        return Interval(float(r[0]), float(r[0]), float(r[0]), len(r), "repeats", 0.0, IDENTICAL)
    iv = _bca((r,), lambda x, axis=-1: np.median(x, axis=axis), float(np.median(r)), len(r), "repeats", level,
              n_boot, seed)
    return Interval(iv.value, iv.lo, iv.hi, iv.n, iv.unit, iv.se, iv.method + " of the median paired ratio")


def interleaved_timings(fns: dict[str, Callable[[], object]], repeats: int = MIN_TIMING_REPEATS, seed: int = SEED,
                        before: Callable[[], object] | None = None) -> dict[str, np.ndarray]:
    """Wall-clock seconds of every ``fns[label]()`` over ``repeats`` rounds; within a round each function
    runs once, in an order shuffled afresh each round (so drift and warm-up spread over all labels).
    ``before`` (optional) runs untimed before each call (e.g. to reset a cache's state).
    Returns label -> ``[repeats]`` seconds, repeat ``i`` of every label from the same round."""
    if repeats < 1:
        raise InputError("repeats must be >= 1")
    rng = np.random.default_rng(seed)
    labels = list(fns)
    out = {k: np.zeros(repeats) for k in labels}
    for i in range(repeats):
        for j in rng.permutation(len(labels)):
            if before is not None:
                before()
            t0 = time.perf_counter()
            fns[labels[j]]()
            out[labels[j]][i] = time.perf_counter() - t0
    return out


def n_to_settle(iv: Interval, threshold: float) -> float:
    """Rough number of units that would put the interval wholly on one side of ``threshold`` if the
    value stayed where it is. An interval's half-width shrinks as 1/sqrt(n), so with ``w`` the
    distance from the value to the interval's end on the threshold's side (``z * se`` of a normal
    interval) it takes ``n * (w / |value - threshold|)^2`` units. ``inf`` when the value sits on the
    threshold. Rough: it ignores that the value itself moves with more data."""
    if (gap := abs(iv.value - threshold)) == 0:
        return float("inf")
    w = (iv.hi - iv.value) if threshold > iv.value else (iv.value - iv.lo)
    if not w > 0:
        w = 1.96 * iv.se if np.isfinite(iv.se) else 0.0
    return float(max(iv.n, np.ceil(iv.n * (w / gap) ** 2)))
