"""Notebook 08's claims (A1-A6) as data, and their measurements on a
:class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's scoreboard cell reads as a few calls.

:data:`RULES` is the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and rule written
once there); :func:`declare` writes them on a board. One ``measure_*`` function per architecture records its claims
from the tables the notebook built, or marks them "not measurable here" with the reason when the model was left out
(its parameter set to ``None``) or the run gave nothing to compare:

- :func:`measure_fusion`: A1, A2 (a fusion encoder, ViLT);
- :func:`measure_cross_layers`: A3 (a cross-attention VLM, Mllama);
- :func:`measure_dual_tower`: A4 (a dual tower, CLIP);
- :func:`measure_unified`: A5, A6 (a unified model, Janus).

Every interval resamples the stated unit: samples, questions (paired), captions, images, caption thirds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..claims import DECISION_COLUMNS, decision_rows, rules_of
from ..diagnostics.roc import auroc_interval
from ..intervals import bootstrap, difference_interval, mean_interval, ratio_interval
from .architectures import lag1

RULES = rules_of("08_architectures")


def declare(board) -> None:
    """Write every rule of :data:`RULES` on ``board`` (before any measurement)."""
    board.declare(RULES)


def measure_fusion(board, fb: pd.DataFrame | None, healthy: np.ndarray | None, blind: np.ndarray | None) -> None:
    """A1, A2 from ViLT's per-sample block shares ``fb`` (columns ``image_queries_on_image``,
    ``image_queries_on_text``, ``text_position_share``, ``cross_modal``) and its per-question correctness ``[n]``
    healthy and with the image queries blind to the text; ``fb=None``: no fusion encoder."""
    if fb is None:
        for c in ("A1", "A2"):
            board.measure(c, None, note="no fusion encoder (VILT = None)")
        return
    board.measure("A1", mean_interval(fb.image_queries_on_image, "samples"), criterion="a",
                  shown="image queries' share on image keys")
    board.measure("A1", ratio_interval(fb.image_queries_on_text, fb.text_position_share, "samples"), criterion="b",
                  shown="image queries' share on text / text's share of positions")
    board.measure("A2", mean_interval(fb.cross_modal, "samples"), criterion="a", shown="healthy cross-modal share")
    board.measure("A2", difference_interval(healthy, blind, "questions"), criterion="b",
                  shown="accuracy healthy minus image-queries-blind")


def _level(g: pd.DataFrame, level: str, col: str) -> float:
    return g.loc[g.level == level, col].mean()


def measure_cross_layers(board, CW: pd.DataFrame | None) -> None:
    """A3 from the caption-word rows ``CW`` of the cross-attention layers (columns ``sample``, ``level`` in
    low / middle / top, ``kind``, ``norm_entropy``, ``object_focus``, ``half_selectivity``, ``background_mass``),
    resampled by caption; ``None`` or not three cross layers: not measurable."""
    if CW is None or CW.level.nunique() != 3 or set(CW.level) != {"low", "middle", "top"}:
        board.measure("A3", None, note="needs a cross-attention VLM with three cross-attention layers (low, middle, top)")
        return
    # one row of sums per caption, so each bootstrap resample is a few array sums, not pandas over every word:
    # (a), (d): per-caption differences, averaged over captions; (b), (c): word means pooled over the resampled
    # captions (sum over their words / number of words), exactly what concatenating their rows would give
    per = []
    for _, g in CW.groupby("sample"):
        mid = g[g.level == "middle"]
        focus, half = mid.loc[mid.kind != "position", "object_focus"].dropna(), mid.half_selectivity.dropna()
        per.append([_level(g, "low", "norm_entropy") - _level(g, "middle", "norm_entropy"),
                    focus.sum(), len(focus), half.sum(), len(half),
                    _level(g, "middle", "background_mass") - _level(g, "top", "background_mass")])
    per = np.asarray(per, float)
    caps = list(per)
    rows = lambda us: np.asarray(us)  # noqa: E731
    stats = {
        "a": (lambda us: rows(us)[:, 0].mean(), "low minus middle entropy"),
        "b": (lambda us: rows(us)[:, 1].sum() / rows(us)[:, 2].sum(), "middle: object focus"),
        "c": (lambda us: rows(us)[:, 3].sum() / rows(us)[:, 4].sum(), "middle: half selectivity"),
        "d": (lambda us: rows(us)[:, 5].mean(), "middle minus top background mass"),
    }
    for k, (stat, shown) in stats.items():
        board.measure("A3", bootstrap(caps, stat, "captions"), criterion=k, shown=shown)


def measure_dual_tower(board, CF: pd.DataFrame | None) -> None:
    """A4 from the class token's focus rows ``CF`` (``layer``, ``object_mass``, ``area_share`` per sample), last
    layer, as a ratio of means over samples; ``None``: no dual tower."""
    if CF is None:
        board.measure("A4", None, note="no dual-tower model (CLIP = None)")
        return
    last = CF[CF.layer == CF.layer.max()]
    board.measure("A4", ratio_interval(last.object_mass, last.area_share, "samples"),
                  shown="class token: object mass / area share (last layer)")


def measure_unified(board, describe, answer, series: list, thirds: pd.DataFrame | None, n_asked: int) -> None:
    """A5, A6 from Janus's per-image mean image share while describing ``describe [n]`` and answering
    ``answer [n]``, the per-caption token series (``series``: list of ``[tokens]``) and the caption thirds of the
    four-object scenes (``thirds``: ``share``, ``error``); ``describe=None``: no unified model. Fewer than two
    non-empty captions, or fewer than two thirds with and without an error, make the claim (criterion) not
    measurable, saying how many there were."""
    if describe is None:
        for c in ("A5", "A6"):
            board.measure(c, None, note="no unified model (UNIFIED = None)")
        return
    if len(describe) < 2:
        for c in ("A5", "A6"):
            board.measure(c, None, note=f"{len(describe)} of {n_asked} captions were not empty: nothing to compare")
        return
    board.measure("A5", difference_interval(answer, describe, "images"), criterion="a", shown="answer minus describe")
    board.measure("A5", ratio_interval(answer, describe, "images"), criterion="b", shown="answer / describe")
    a6 = bootstrap(series, lag1, "captions")
    board.measure("A6", a6, criterion="a", shown="lag-1 correlation")
    n_err = 0 if thirds is None else int(thirds.error.sum())
    if thirds is not None and n_err >= 2 and (~thirds.error).sum() >= 2:
        board.measure("A6", auroc_interval(-thirds.share.to_numpy(), thirds.error.to_numpy(), unit="caption thirds"),
                      criterion="b", shown="AUROC, low share -> error")
    else:
        board.measure("A6", None, criterion="b", note=f"{n_err} of {0 if thirds is None else len(thirds)} caption thirds "
                      f"hold an error: too few errors to tell drift from chance (raise DRIFT_CAPTIONS); (a) alone: "
                      f"lag-1 correlation {a6.value:.2f} [{a6.lo:.2f}, {a6.hi:.2f}] over {a6.n} captions")


def decisions(healthy=None, blind=None, cross=None, iou_best=None, cls_frame=None, describe=None, answer=None,
              series=(), role_share=None) -> pd.DataFrame:
    """Notebook 08's measurement -> action table: one row per measurement this run has (``None`` leaves a row out).
    ``healthy`` / ``blind``: ViLT's per-question correctness (:func:`fusion_correct`); ``cross``: Mllama's per-level
    table with the object focus in column 1 (three levels); ``iou_best``: word -> object IoU over chance per model;
    ``cls_frame``: :func:`cls_focus`; ``describe`` / ``answer`` / ``series``: :func:`task_switch`; ``role_share``:
    share of heads per role per model."""
    short = lambda d: ", ".join(f"{m.split(' (')[0]} {x}" for m, x in d.items())  # noqa: E731
    rows = []  # (claim, measurement, value here): what to do, and where, is the claim's advice (unicache_lib/claims.py)
    if healthy is not None:
        rows.append(("A2", "ViLT: accuracy healthy vs image queries blind to the text (A2 (b))",
                     f"{healthy.mean():.3f} vs {blind.mean():.3f}"))
    if cross is not None:
        rows.append(("A3", "Mllama: object words' focus per cross layer (A3 (b))", short(cross.iloc[:, 1].round(1))))
    if iou_best is not None:
        rows.append(("U11", "word → object IoU over a random region, best band (§3; 02's U11 against the other objects)",
                     short(iou_best.sort_values(ascending=False).map("{:.1f}x".format))))
    if cls_frame is not None:
        last = cls_frame[cls_frame.layer == cls_frame.layer.max()]
        rows.append(("A4", "CLIP: class token's object mass / area, last layer (A4)", f"{last.object_mass.mean() / last.area_share.mean():.1f}x"))
    if describe is not None and len(describe) >= 2:
        rows.append(("A5", "Janus: image share answering / describing (A5)", f"{answer.mean() / describe.mean():.2f}"))
        rows.append(("A6", "Janus: lag-1 correlation of the per-token image share (A6 (a))", f"{lag1(series):+.2f}"))
    if role_share is not None:
        rows.append(("U8", "share of focused heads per model (§3; 02's U8)",
                     short(role_share.focused[role_share.focused > 0].round(2)) + "; the others 0"))
    return pd.DataFrame(decision_rows(rows, "08_architectures"), columns=list(DECISION_COLUMNS))
