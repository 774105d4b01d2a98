"""Step-evolution analysis of diffusion captures: tidy tables, phases, knees, word->region maps.

Inputs are records of :class:`~unicache_lib.capture.diffusion.DiffusionCapture` (from its result or
read back from a store); outputs are pandas tables and numpy arrays for plots and the scoreboard.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..core.errors import InputError, UnknownNameError
from ..core.modality import BLOCKS
from ..stats import mean_offdiag

PHASES: tuple[str, ...] = ("early", "middle", "late")
_BLK = {"image->image": "ii", "text->text": "tt", "image->text": "it", "text->image": "ti"}


def phase_of(step: int, n_steps: int) -> str:
    """The study's phases: first 20% of the steps early, 20-60% middle, last 40% late."""
    if not 0 <= step < n_steps:
        raise InputError(f"step {step} outside 0..{n_steps - 1}")
    f = step / n_steps
    return "early" if f < 0.2 else ("middle" if f < 0.6 else "late")


def stats_stride_of(records) -> int:
    """The one ``stats_stride`` of ``records`` (1: exact statistics). Records of different strides are refused:
    an average over exact values and estimates from every k-th query row would be neither."""
    strides = {int(r.meta.get("stats_stride", 1)) for r in records}
    if len(strides) > 1:
        raise InputError(
            f"these records mix statistics captured with stats_stride {sorted(strides)} (1 = exact; k > 1 = estimated "
            f"from every k-th query row): analyse one capture setting at a time, e.g. "
            f"[r for r in records if r.meta.get('stats_stride', 1) == 1]")
    return strides.pop() if strides else 1


def step_table(records) -> pd.DataFrame:
    """One row per (sample, part, layer, step): head means of every scalar statistic.

    Columns: ``img_entropy`` / ``txt_entropy`` (normalised entropy of image / text query rows),
    ``img_max``, ``text_share``, ``text_entropy``, ``share_<blk>`` and ``entropy_<blk>`` for the four
    blocks (``ii``, ``tt``, ``it``, ``ti``; X->Y as in :mod:`~unicache_lib.core.modality`), ``sim`` (adjacent-
    step cosine of the whole map), ``sim_<blk>``, ``out_sim_img`` / ``out_sim_txt``, ``redundancy``
    (mean pairwise head similarity), ``phase``, ``timestep``, the record meta's ``kind`` / ``pair`` and
    ``stats_stride`` (1: exact; k > 1: estimated from every k-th query row; one value per table, mixed
    records are refused).
    """
    records = list(records)
    stride = stats_stride_of(records)
    rows = []
    n_steps = {r.sample: r.step + 1 for r in sorted(records, key=lambda r: r.step)}  # the last step wins
    with warnings.catch_warnings():  # blocks a part does not have: NaN, said once by the table, not per record
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        for r in records:
            d = r.data
            nm = lambda k: np.nanmean(d[k].numpy(), 0)  # noqa: E731 - head mean
            re, mw, sp, be, sh = nm("row_entropy"), nm("max_weight"), nm("sim_prev"), nm("block_entropy"), nm("blocks")
            rows.append({"sample": r.sample, "part": r.part, "layer": r.layer, "step": r.step,
                   "phase": phase_of(r.step, n_steps[r.sample]), "timestep": r.meta.get("timestep"),
                   "kind": r.meta.get("kind", ""), "pair": r.meta.get("pair", ""), "stats_stride": stride,
                   "img_entropy": re[0], "txt_entropy": re[1], "img_max": mw[0],
                   "text_share": float(d["text_share"].mean()), "text_entropy": float(np.nanmean(d["text_entropy"].numpy())),
                   "sim": float(np.nanmean(d["sim_prev_all"].numpy())) if r.step > 0 else np.nan,
                   "out_sim_img": float(d["out_sim_prev"][0]), "out_sim_txt": float(d["out_sim_prev"][1]),
                   "redundancy": float(mean_offdiag(d["head_sim"]))}
                        | {f"{name}_{_BLK[b]}": v[i] for i, b in enumerate(BLOCKS)
                           for name, v in (("share", sh), ("entropy", be), ("sim", sp))})
    if not rows:
        raise InputError("no records: capture a sampling run first")
    return pd.DataFrame(rows)


def knee(sim, threshold: float = 0.7) -> int | None:
    """First step ``s >= 1`` from which the adjacent-step similarity stays ``>= threshold``
    (``sim[s]`` compares step s with s-1; ``sim[0]`` is ignored). None if it never settles."""
    sim = np.asarray(sim, dtype=float)
    return next((s for s in range(1, len(sim)) if np.all(sim[s:] >= threshold)), None)


def knee_table(steps: pd.DataFrame, thresholds=(0.7,), by=("model", "part", "layer")) -> pd.DataFrame:
    """Knees per layer at each threshold, of the map (``sim``) and output (``out_sim_img``) curves.

    Args:
        steps: a :func:`step_table` (rows of one step count), with the ``by`` columns.
        thresholds: adjacent-step cosines that count as "alike".
    Returns:
        One row per ``by`` group: ``knee (maps) @t`` / ``knee (outputs) @t`` for each threshold ``t``
        (NaN: the curve never settles), ``min sim`` (lowest map cosine after step 0) and ``n_steps``.
    """
    rows = []
    for key, d in steps.groupby(list(by)):
        curve_map = d.groupby("step").sim.mean().to_numpy()
        curve_out = d.groupby("step").out_sim_img.mean().to_numpy()
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)))
                    | {f"knee ({name}) @{t:g}": np.nan if (k := knee(c, t)) is None else k
                       for t in thresholds for name, c in (("maps", curve_map), ("outputs", curve_out))}
                    | {"min sim": float(np.nanmin(curve_map[1:])) if len(curve_map) > 1 else np.nan,
                       "n_steps": len(curve_map)})
    return pd.DataFrame(rows).set_index(list(by))


def reuse_window(knees, n_steps: int) -> dict:
    """The reuse a set of per-layer knees (one model, one threshold) allows for whole-step reuse.

    A step can be skipped as a whole only once *every* layer has settled: the window starts at the latest
    knee. Returns ``start`` (None if some layer never settles), ``reusable`` (steps from ``start`` on, the
    last one always computed: ``n_steps - start - 1``) and ``head``: the share of the steps computed before
    reuse may begin, ``start / n_steps`` (notebook 06's ``step_skip`` policy's ``head`` argument).
    """
    k = np.asarray(knees, dtype=float)
    if k.size == 0:
        raise InputError("no knees: pass one knee per layer (knee_table's column for one model)")
    if n_steps < 2:
        raise InputError(f"n_steps must be >= 2 for adjacent steps, got {n_steps}")
    if np.isnan(k).any():
        return {"start": None, "reusable": 0, "head": 1.0}
    start = int(k.max())
    return {"start": start, "reusable": max(0, n_steps - start - 1), "head": round(start / n_steps, 3)}


def word_positions(tokens: list[str], word: str) -> list[int]:
    """Indices of ``word`` in a prompt's tokens (in order of appearance)."""
    return [i for i, t in enumerate(tokens) if t == word]


def word_maps(records, sample: str, steps=None, layers=None) -> np.ndarray:
    """``[T_real, S_image]``: each real text token's attention from the image queries, averaged over
    heads (already in the record), the chosen steps and layers (None = all)."""
    mine = [r for r in records if r.sample == sample
            and (steps is None or r.step in steps) and (layers is None or r.layer in layers)]
    sampled = sorted({r.meta["stats_stride"] for r in mine if r.meta.get("stats_stride", 1) > 1})
    if sampled:
        raise InputError(f"sample {sample!r} was captured with stats_stride={sampled[0]}: its statistics are estimated "
                         f"from every {sampled[0]}-th query row and it holds no word maps (a word map needs every "
                         f"image query); capture again with stats_stride=1")
    maps = [r.data["word_map"].numpy() for r in mine if "word_map" in r.data and r.data["word_map"].shape[-1] > 0]
    if not maps:
        raise UnknownNameError(f"no word maps for sample {sample!r}: capture cross or joint attention with text tokens")
    return np.mean(maps, 0).T


def top_region(weights, k: int) -> np.ndarray:
    """Boolean mask of the ``k`` largest entries (ties broken by position; ``k`` clipped to size)."""
    w = np.asarray(weights, dtype=float).ravel()
    k = int(np.clip(k, 0, w.size))
    out = np.zeros(w.size, bool)
    out[np.argsort(-w, kind="stable")[:k]] = True
    return out


def iou(a, b) -> float:
    a, b = np.asarray(a, bool).ravel(), np.asarray(b, bool).ravel()
    u = (a | b).sum()
    return float((a & b).sum() / u) if u else float("nan")


def chance_iou(k: int, n: int) -> float:
    """Expected IoU of a random ``k``-subset of ``n`` positions with a fixed ``k``-subset."""
    if not 0 < k <= n:
        return float("nan")
    inter = k * k / n
    return inter / (2 * k - inter)


def head_redundancy(records) -> pd.DataFrame:
    """Mean pairwise head-map similarity per (sample, layer) for records that hold ``head_sim``
    (diffusion or understanding captures alike)."""
    records = list(records)
    stats_stride_of(records)
    rows = [{"sample": r.sample, "layer": r.layer, "step": r.step, "redundancy": float(mean_offdiag(r.data["head_sim"]))}
            for r in records if "head_sim" in r.data]
    if not rows:
        raise InputError("no record holds head_sim: capture in stats mode")
    return pd.DataFrame(rows)
