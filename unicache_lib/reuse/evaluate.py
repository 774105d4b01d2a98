"""Every reuse method on the same prompts and seeds: quality against the no-reuse images, prompt
following, attention work done, whole-transformer FLOPs, and wall-clock measured side by side
(interleaved repeats). Fewer-step sampling, the control, runs as ``steps:N`` methods in the same table
(:mod:`unicache_lib.reuse.control`)."""
import contextlib
import time
import warnings

import numpy as np
import pandas as pd

from ..core.errors import InputError
from ..intervals import (MIN_TIMING_REPEATS, difference_interval, extreme_of, interleaved_timings, mean_interval,
                         speedup_interval)
from ..progress import bar
from ..quality import PSNR_CAP, psnr, ssim
from ..runtime.sampling import sample, to_uint8
from ..world.segment import score_object
from .cache import AttentionCallCounter, ReuseCache
from .control import PREFIX, fewer_steps_methods
from .flops import TransformerFlops
from .peers import PEERS, DiffusersCache, PeerUnsupported, magcache_ratios
from .policies import REUSE_POLICIES


def methods_for(gen, steps: int, guidance: float, calibration_prompts: list[str], peers=PEERS,
                scored_prompts: list[str] | None = None, fewer_steps=()) -> dict:
    """label -> zero-argument factory of a context manager that is also a sampling callback.

    Every registered reuse policy (attention-level and step-level alike), each diffusers cache in ``peers``,
    and a ``steps:N`` fewer-step control for each ``N`` in ``fewer_steps``.

    ``calibration_prompts``: MagCache's calibration run. They must be held out from the prompts the
    methods are scored on (pass those as ``scored_prompts`` to have that checked): calibrating on the
    scored prompts would fit the skip schedule to the very images it is judged on."""
    if scored_prompts is not None:
        shared = sorted(set(calibration_prompts) & set(scored_prompts))
        if shared:
            raise InputError(f"MagCache calibration prompts overlap the scored prompts ({len(shared)}, e.g. {shared[0]!r}): "
                             "calibrate on held-out prompts, e.g. prompt_set(n + 4, 0, seed)[n:]")
    out = {name: (lambda cls=cls: ReuseCache(gen.transformer, cls(), steps)) for name, cls in REUSE_POLICIES.items()}
    peers = tuple(peers)
    ratios = magcache_ratios(gen, calibration_prompts, steps, guidance) if "magcache" in peers else None
    return (out | {f"diffusers:{p}": (lambda p=p: DiffusersCache(gen, p, steps, guidance, calibration=ratios)) for p in peers}
            | fewer_steps_methods(fewer_steps))


def _run(gen, make, prompts, steps, guidance, seed, count=True):
    """(images ``[B, H, W, 3]`` uint8, seconds, attention work in batch rows, transformer FLOPs). A method
    with ``sample_steps`` (the fewer-step control) samples with that many steps instead of ``steps``.
    ``count=False``: no counters (the timed runs), work and FLOPs NaN."""
    with make() as m:
        n = getattr(m, "sample_steps", steps)
        if not count:
            t0 = time.perf_counter()
            x = sample(gen, prompts, n, guidance, seed=seed, callbacks=[m])
            return to_uint8(x), time.perf_counter() - t0, float("nan"), float("nan")
        with AttentionCallCounter(gen.transformer) as counter, TransformerFlops(gen.transformer) as fl:
            t0 = time.perf_counter()
            x = sample(gen, prompts, n, guidance, seed=seed, callbacks=[m])
            dt = time.perf_counter() - t0
    # attention work in batch rows: a half-batch call (FasterCache skipping the unconditional half)
    # counts half; a ReuseCache call that reused its output counts what its policy says it computed (a
    # step-level policy's skipped calls never reach the processors: the counter already misses them)
    work = m.processor_fraction * counter.rows if isinstance(m, ReuseCache) else counter.rows
    return to_uint8(x), dt, work, fl.flops


def run_reuse(gen, methods: dict, prompts, objects, steps=20, guidance=3.0, seed=0, timing_prompts: int = 8,
              repeats: int = MIN_TIMING_REPEATS, progress: bool | None = None) -> pd.DataFrame:
    """One row per method: psnr, ssim (means vs the ``none`` method's images; per prompt in
    ``psnr_per_prompt`` / ``ssim_per_prompt``, arrays ``[n_prompts]``), colour / position / shape rates,
    ``computed`` (attention work in batch rows / the no-reuse run's), ``flops`` (FLOPs the transformer
    executed over the whole scored run, every layer counted: :class:`~unicache_lib.reuse.flops.TransformerFlops`
    / the no-reuse run's; counted during the scored run itself, on all prompts), and wall-clock for a batch of
    ``timing_prompts``: ``repeats`` interleaved rounds, every method once per round in a shuffled order
    (``seconds``, ``[repeats]``), ``median_s``, ``iqr_s``, ``speedup`` (median over rounds of
    none's time / this method's time in the same round) with its bootstrap interval over rounds
    (``speedup_lo``, ``speedup_hi``; NaN with fewer than 2 repeats). Methods that cannot run on this
    model get a row with the reason in ``note``. The two halves are :func:`score_methods` and
    :func:`time_methods` (``make evaluate-reuse`` runs them apart: scoring sharded, timing on a quiet machine)."""
    rows, usable, _ = score_methods(gen, methods, prompts, objects, steps, guidance, seed, progress)
    for label, cols in time_methods(gen, usable, prompts[:timing_prompts], steps, guidance, seed, repeats).items():
        rows[label].update(cols)
    return pd.DataFrame(list(rows.values())).set_index("method")


def _judged_mean(values) -> float:
    """Mean over the prompts the detector could judge (NaN for the others: your prompts without one known object)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v[np.isfinite(v)].mean()) if np.isfinite(v).any() else float("nan")


def score_methods(gen, methods: dict, prompts, objects, steps=20, guidance=3.0, seed: int | list[int] = 0,
                  progress: bool | None = None) -> tuple[dict, dict, dict]:
    """The quality half of :func:`run_reuse`: ``(rows, usable, counts)`` -- ``rows[label]`` its row without the
    timing columns, ``usable`` the methods that ran, ``counts[label] = (attention work, transformer FLOPs)`` of
    this run (``counts["reference"]``: the no-reuse reference run's), so that runs over disjoint prompt chunks can
    be summed. ``seed``: one int (prompt ``i`` uses ``seed + i``) or one seed per prompt."""
    if "none" not in methods:
        raise InputError("methods must include 'none' (the reference)")
    ref, _, ref_work, ref_flops = _run(gen, methods["none"], prompts, steps, guidance, seed)
    rows, usable, counts = {}, {}, {"reference": (ref_work, ref_flops)}
    for label, make in bar(methods.items(), progress, desc="reuse methods"):
        try:
            imgs, _, work, flops = _run(gen, make, prompts, steps, guidance, seed)
        except PeerUnsupported as e:
            rows[label] = {"method": label, "note": str(e)}
            continue
        sc = [score_object(im, o) for im, o in zip(imgs, objects)]
        p, s = np.minimum(psnr(imgs, ref), PSNR_CAP), np.asarray(ssim(imgs, ref), dtype=np.float64)
        rows[label] = {"method": label, "psnr": float(np.mean(p)), "ssim": float(np.mean(s)),
                       **{k: _judged_mean([x[k] for x in sc]) for k in ("colour", "position", "shape")},
                       "computed": work / ref_work, "flops": flops / ref_flops, "n": len(prompts), "note": "",
                       "psnr_per_prompt": p, "ssim_per_prompt": s}
        usable[label], counts[label] = make, (work, flops)
    return rows, usable, counts


def time_methods(gen, methods: dict, prompts, steps=20, guidance=3.0, seed: int | list[int] = 0,
                 repeats: int = MIN_TIMING_REPEATS, order_seed: int | None = None) -> dict[str, dict]:
    """The timing half of :func:`run_reuse`: label -> its timing columns (``seconds``, ``median_s``, ``iqr_s``,
    ``speedup`` with ``speedup_lo`` / ``speedup_hi``, ``repeats``), every method once per round over ``repeats``
    rounds in an order shuffled by ``order_seed`` (default: ``seed``)."""

    def timed(make):
        def go():
            with contextlib.redirect_stdout(None):
                _run(gen, make, prompts, steps, guidance, seed, count=False)
        return go

    times = interleaved_timings({k: timed(m) for k, m in methods.items()}, repeats,
                                seed if order_seed is None else order_seed)
    ivs = {label: speedup_interval(times["none"], ts, min_repeats=2) if repeats >= 2 else None
           for label, ts in times.items()}
    return {label: {"seconds": ts, "median_s": float(np.median(ts)), "iqr_s": float(np.subtract(*np.percentile(ts, [75, 25]))),
                    "speedup": ivs[label].value if ivs[label] else float(np.median(times["none"] / ts)),
                    "speedup_lo": ivs[label].lo if ivs[label] else float("nan"),
                    "speedup_hi": ivs[label].hi if ivs[label] else float("nan"), "repeats": repeats}
            for label, ts in times.items()}


def attention_share(gen, prompts, steps: int = 20, guidance: float = 3.0, seed: int = 0, repeats: int = 3) -> dict:
    """How much of a sampling run the attention processors take: ``{"share", "cap", "step_s"}``, medians
    over ``repeats`` runs after a warm-up. ``share`` = seconds inside the attention processors / seconds of
    the whole run (text encoding and decoding included); ``cap`` = ``1 / (1 - share)``, the largest
    speed-up any attention-only reuse can reach (skipping every attention call, nothing else)."""
    shares, totals = [], []
    sample(gen, prompts, steps, guidance, seed=seed)  # warm-up
    for _ in range(repeats):
        with AttentionCallCounter(gen.transformer) as c:
            t0 = time.perf_counter()
            sample(gen, prompts, steps, guidance, seed=seed)
            total = time.perf_counter() - t0
        shares.append(c.seconds / total)
        totals.append(total)
    share = float(np.median(shares))
    return {"share": share, "cap": 1.0 / max(1e-9, 1.0 - share), "step_s": float(np.median(totals)) / steps}


def _ran(df: pd.DataFrame, methods: list[str]) -> list[str]:
    """The ``methods`` that ran on this table (a row with a PSNR; a peer that could not run has only a note)."""
    return [m for m in methods if m in df.index and np.isfinite(df.loc[m].get("psnr", np.nan))]


def _per_prompt(df: pd.DataFrame, method: str, column: str = "psnr_per_prompt") -> np.ndarray:
    return np.asarray(df.loc[method, column], float)


def _psnr_gap(df: pd.DataFrame, a: str, b: str):
    """PSNR of ``a`` minus ``b`` (dB), mean over prompts, with its paired 95% interval over prompts."""
    return difference_interval(_per_prompt(df, a), _per_prompt(df, b), "prompts")


def versus(df: pd.DataFrame, method: str, others: list[str]) -> pd.DataFrame:
    """``method`` against each of ``others`` on one generator's :func:`run_reuse` table, one row per other method:
    ``psnr_diff`` (method - other, dB, mean over prompts) with its paired 95% interval over prompts
    (``psnr_lo`` / ``psnr_hi``); ``speed_ratio`` (the other's time / the method's, median over the interleaved
    rounds, >1: the method is faster) with its interval over rounds; ``flops_ratio`` (the method's FLOPs / the
    other's, a count); ``dominates``: ahead on PSNR and on speed, both intervals excluding a tie, and no more
    FLOPs. Others that did not run (a ``note``) are left out."""
    m = df.loc[method]
    rows = []
    for o in _ran(df, others):
        r = df.loc[o]
        p = _psnr_gap(df, method, o)
        s = speedup_interval(np.asarray(r.seconds, float), np.asarray(m.seconds, float), min_repeats=2)
        rows.append({"other": o, "psnr_diff": p.value, "psnr_lo": p.lo, "psnr_hi": p.hi, "speed_ratio": s.value,
                     "speed_lo": s.lo, "speed_hi": s.hi, "flops_ratio": float(m.flops / r.flops),
                     "dominates": bool(p.lo > 0 and s.lo > 1 and m.flops <= r.flops)})
    return pd.DataFrame(rows).set_index("other") if rows else pd.DataFrame()


def pareto_check(df: pd.DataFrame, ours: list[str], others: list[str], by: str = "speedup") -> pd.DataFrame:
    """Is every point of ``others`` beaten by one of ``ours``? For each other method: among ``ours`` that save at
    least as much (``by="speedup"``: a median speed-up at least the other's; ``by="flops"``: no more FLOPs), the
    one with the best PSNR, and the paired PSNR difference (ours - other, dB) with its 95% interval over prompts.
    ``match`` is None (difference NaN) where none of ours saves as much. Others that did not run are left out."""
    if by not in ("speedup", "flops"):
        raise InputError(f"by must be 'speedup' or 'flops', got {by!r}")
    rows = []
    for o in _ran(df, others):
        r = df.loc[o]
        ok = [m for m in ours if m in df.index and (df.loc[m, by] >= r[by] if by == "speedup" else df.loc[m, by] <= r[by])]
        m = max(ok, key=lambda x: df.loc[x, "psnr"]) if ok else None
        iv = _psnr_gap(df, m, o) if ok else None
        rows.append({"other": o, "match": m, "psnr_diff": iv.value if ok else np.nan, "lo": iv.lo if ok else np.nan,
                     "hi": iv.hi if ok else np.nan})
    return pd.DataFrame(rows).set_index("other") if rows else pd.DataFrame()


def readings(df: pd.DataFrame) -> pd.Series:
    """Per method of one generator's :func:`run_reuse` table, what its row *is*, for a ``reading`` column:
    ``"reference"`` (``none``), ``"control (fewer steps)"`` (``steps:N``), ``"no-op on this family: bit-identical
    to no reuse ..., an exact cache saving X% of FLOPs"`` (every prompt's PSNR at the cap while fewer FLOPs ran: the
    method changed no pixel, e.g. text-side reuse on a cross-attention DiT, whose text keys and values do not change
    across steps), ``"reuses nothing at these settings: bit-identical ..."`` (at the cap with all FLOPs run, e.g. a
    schedule with too few steps to skip any), ``"did not run: ..."`` (a ``note``), else ``""``. Every reading of a
    bit-identical row contains ``"bit-identical"``."""
    out = {}
    for m, r in df.iterrows():
        pp = r.get("psnr_per_prompt")
        if m == "none":
            out[m] = "reference"
        elif str(m).startswith(PREFIX):
            out[m] = "control (fewer steps)"
        elif isinstance(r.get("note"), str) and r.get("note"):
            out[m] = f"did not run: {r.note}"
        elif pp is not None and np.size(pp) and bool(np.all(np.asarray(pp, float) >= PSNR_CAP)):
            out[m] = (f"no-op on this family: bit-identical to no reuse (PSNR capped at {PSNR_CAP:.0f}), an exact cache "
                      f"saving {1 - r.flops:.0%} of FLOPs" if r.flops < 1 - 1e-9 else
                      "reuses nothing at these settings: bit-identical to no reuse (too few steps for its schedule?)")
        else:
            out[m] = ""
    return pd.Series(out, name="reading")


def worst_pareto_gap(tables: dict, pareto: dict):
    """R3's statistic over several generators. ``tables``: generator -> :func:`run_reuse` table; ``pareto``:
    generator -> :func:`pareto_check` table of the same criterion. Over every (generator, other method) cell with a
    match, the paired per-prompt PSNR difference (match - other, dB): returns ``(interval, worst, unmatched)`` —
    the interval of the *smallest* cell mean, from each cell's interval over prompts (None when no cell has a
    match), the worst cell ``(generator, other, match, mean difference)`` and the ``"other on
    generator"`` cells no setting of ours saves as much as. Prompts must be the same on every generator."""
    cells = [(g, o, r.match) for g, p in pareto.items() for o, r in p.iterrows() if r.match is not None]
    unmatched = [f"{o} on {g}" for g, p in pareto.items() for o, r in p.iterrows() if r.match is None]
    if not cells:
        return None, None, unmatched
    pp = {c: _per_prompt(tables[c[0]], c[2]) - _per_prompt(tables[c[0]], c[1]) for c in cells}
    n = {len(v) for v in pp.values()}
    if len(n) != 1:
        raise InputError(f"per-prompt PSNRs of different lengths {sorted(n)}: score every generator on the same prompts")
    worst = min(cells, key=lambda c: pp[c].mean())
    return extreme_of([mean_interval(pp[c], "prompts") for c in cells]), (*worst, float(pp[worst].mean())), unmatched


def worst_generator(tables: dict, method: str, column: str = "ssim_per_prompt", minus: str | None = None):
    """The lower of the generators' mean ``column`` (per prompt, e.g. SSIM) of ``method`` — or of ``method`` minus
    ``minus``, paired per prompt — with its interval from each generator's interval over prompts. ``tables``:
    generator -> :func:`run_reuse` table, scored on the same prompts."""
    vals = {g: _per_prompt(df, method, column) - _per_prompt(df, minus, column) if minus else _per_prompt(df, method, column)
            for g, df in tables.items()}
    n = {len(v) for v in vals.values()}
    if len(n) != 1:
        raise InputError(f"{column} of different lengths {sorted(n)}: score every generator on the same prompts")
    return extreme_of([mean_interval(v, "prompts") for v in vals.values()])


def schedule_of(method) -> list[bool] | None:
    """Which of its steps a method runs the transformer on, from the object its factory builds: a step-level
    :class:`ReuseCache` its policy's schedule, the fewer-step control all of its own (shorter) steps, no reuse all;
    None where the method decides per block or per call inside a step (attention-level schedules, diffusers
    caches), where a per-step strip would mislead."""
    n = getattr(method, "sample_steps", None)
    if n is not None:
        return [True] * int(n)
    if isinstance(method, ReuseCache):
        if method.level == "step" and hasattr(method.policy, "schedule"):
            return list(method.policy.schedule(method.n_steps))
        if method.policy.name == "none":
            return [True] * method.n_steps
    return None


def gallery(gen, methods: dict, prompt: str, steps: int = 20, guidance: float = 3.0, seed: int = 0) -> dict:
    """One prompt sampled under each method (``methods``: name -> factory, as :func:`methods_for` builds them; must
    hold ``none``). Returns name -> ``{"image": [H, W, 3] uint8, "psnr": dB against ``none`` (capped at
    :data:`PSNR_CAP`), "schedule": :func:`schedule_of`}``: the lesson's first picture of cross-step reuse. A diffusers
    cache that cannot run on this model (:class:`PeerUnsupported`) is left out with a warning naming why, as
    :func:`run_reuse` leaves it out of its table."""
    if "none" not in methods:
        raise InputError("methods must include 'none' (the reference)")
    out = {}
    for name, make in methods.items():
        try:
            imgs, _, _, _ = _run(gen, make, [prompt], steps, guidance, seed, count=False)
        except PeerUnsupported as e:
            warnings.warn(f"{name} left out of the picture: {e}", stacklevel=2)
            continue
        out[name] = {"image": imgs[0], "schedule": schedule_of(make())}
    ref = out["none"]["image"][None]
    for v in out.values():
        v["psnr"] = float(min(psnr(v["image"][None], ref)[0], PSNR_CAP))
    return out
