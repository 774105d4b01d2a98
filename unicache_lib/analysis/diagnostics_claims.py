"""Notebook 07's claims (U10, U12) as data, the broken-model experiment behind U10, and the measurements on a
:class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's cells read as a few calls.

:data:`RULES` is the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and rule written
once there); :func:`declare` writes them on a board. :func:`broken_variants` captures a healthy model and four
deliberately broken ones; :func:`detector_table` runs the modality-neglect detector on each; :func:`measure_neglect`
(U10) and :func:`measure_hallucination` (U12) record the verdicts; :func:`decisions` prints the lesson's end from the
same tables. Intervals resample the standard samples (U10) or the held-out questions (U12).
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from ..claims import decision_rows, rules_of
from ..capture.runner import capture_samples
from ..diagnostics.broken import blank_image, mask_image_attention, zero_image_features, zero_image_values
from ..diagnostics.neglect import detect_neglect, image_dependence, text_image_share_per_sample
from ..diagnostics.roc import auroc, auroc_interval, read_auroc
from ..intervals import extreme_of, mean_interval
from ..tables import WrappedTable

RULES = rules_of("07_diagnostics")
HEALTHY = "healthy"


def declare(board) -> None:
    """Write every rule of :data:`RULES` on ``board`` (before any measurement)."""
    board.declare(RULES)


def masked_name(layer: int) -> str:
    return f"masked from L{layer}"


def broken_variants(model, processor, samples, mask_from_layer: int, seed: int = 0) -> tuple[dict, dict]:
    """The healthy model and four broken variants on ``samples``: ``name -> (records, image dependence (KL))`` and
    ``name -> what the break removes``. Each break is undone when its capture ends (context managers)."""
    blank = [copy.copy(s) for s in samples]
    for s in blank:
        s.image = blank_image(s.image)
    masked = masked_name(mask_from_layer)
    breaks = {HEALTHY: "nothing", "zeroed features": "what the image tokens carry", "blank image": "the picture's content",
              "zeroed image values": "what reading an image key returns",
              masked: "text queries' attention on the image (caught by construction)"}

    def run(sample_list):
        return capture_samples(model, processor, sample_list).records, image_dependence(model, processor, sample_list, seed)

    variants = {HEALTHY: run(samples)}
    with zero_image_features(model):
        variants["zeroed features"] = run(samples)
    variants["blank image"] = run(blank)
    with zero_image_values(model, 0):
        variants["zeroed image values"] = run(samples)
    with mask_image_attention(model, mask_from_layer):
        variants[masked] = run(samples)
    return variants, breaks


def detector_table(variants: dict, breaks: dict, image_part: str) -> tuple[pd.DataFrame, dict]:
    """Per variant: what it breaks, the image share of text queries' reads per layer (``L<k>``), whether the detector
    fires, its first cut-off layer and the image dependence; and name -> per-sample shares ``[samples, layers]``."""
    det, shares = {}, {}
    for name, (recs, dep) in variants.items():
        recs = [r for r in recs if r.part == image_part]  # the layers whose keys hold the image
        layers = sorted({r.layer for r in recs})
        v = detect_neglect(recs)
        shares[name] = text_image_share_per_sample(recs)[1]
        det[name] = {"breaks": breaks[name], **{f"L{layers[i]}": s for i, s in enumerate(v.shares)}, "fires": v.fires,
                     "first cut-off layer": None if v.first_cutoff_layer is None else layers[v.first_cutoff_layer],
                     "image dependence (KL)": dep}
    return pd.DataFrame(det).T, shares


def not_by_construction(det: pd.DataFrame) -> list[str]:
    """The breaks the share is not forced onto (everything but the healthy model and the attention mask)."""
    return [n for n in det.index if n != HEALTHY and not n.startswith("masked from")]


def measure_neglect(board, det: pd.DataFrame, shares: dict, cross_attention: bool) -> None:
    """U10 on the detector table (:func:`detector_table`)."""
    if cross_attention:
        for crit in ("a", "b"):
            board.measure("U10", None, criterion=crit, note="cross-attention VLM: a cross layer's image share of text "
                          "queries' reads is 1 by construction and self-attention layers never see the image")
        return
    others = not_by_construction(det)

    def weakest_layer(x):  # x [samples, layers]: the lowest layer mean, from every layer's interval over samples
        return extreme_of([mean_interval(x[:, li], "samples") for li in range(x.shape[1])])
    board.measure("U10", weakest_layer(shares[HEALTHY]), criterion="a")
    board.measure("U10", extreme_of([weakest_layer(shares[n]) for n in others], max),
                  criterion="b", shown="fires on: " + (", ".join(n for n in others if det.loc[n, "fires"]) or "none")
                  + f" of {', '.join(others)}; healthy quiet: {not bool(det.loc[HEALTHY, 'fires'])}")


def measure_hallucination(board, coverage: np.ndarray, confidence: np.ndarray, wrong: np.ndarray, cross_attention: bool):
    """U12: AUROC of low answer-attention coverage for wrong answers (``coverage``, ``confidence``: higher = more
    trusted, per question; ``wrong``: 0/1), against the confidence baseline."""
    cov, conf, wr = -np.asarray(coverage), -np.asarray(confidence), np.asarray(wrong)
    if cross_attention:
        board.measure("U12", None, note="cross-attention VLM: the answer reads the image only in cross-attention layers, "
                      "whose keys are all vision tokens, so its coverage is 1 by construction")
    elif 2 <= int(wr.sum()) <= len(wr) - 2:
        u12 = auroc_interval(cov, wr)
        board.measure("U12", u12, criterion="a")
        board.measure("U12", auroc_interval(cov, wr, versus=conf), criterion="b",
                      shown=f"coverage AUROC {u12.value:.2f} ({read_auroc(u12)['direction']}, strength "
                      f"{read_auroc(u12)['strength']:.2f}) vs confidence {auroc(conf, wr):.2f} ({int(wr.sum())} wrong answers)")
    else:
        board.measure("U12", None, note=f"{int(wr.sum())} wrong answers of {len(wr)}: an AUROC needs at least 2 of each "
                      "(raise N_QUESTIONS)")


def decisions(roc: pd.DataFrame, det: pd.DataFrame, n_wrong: int, n: int):
    """The measurement -> action table of the lesson (a :class:`~unicache_lib.tables.WrappedTable`)."""
    c = roc.loc["coverage (low = suspect)"]
    # the healthy model's image share per layer, its image dependence, and the breaks not forced onto the share
    hl = det.loc[HEALTHY, [k for k in det.columns if str(k).startswith("L")]].astype(float)
    dep0, others = det.loc[HEALTHY, "image dependence (KL)"], not_by_construction(det)
    missed = [x for x in others if not det.loc[x, "fires"]]
    caught = [x for x in missed if det.loc[x, "image dependence (KL)"] < 0.1 * dep0]  # as in §2
    both = ", ".join(f"{x} (keeps {det.loc[x, 'image dependence (KL)'] / dep0:.0%} of the healthy KL)" for x in missed
                     if x not in caught)
    half = float((roc.hi - roc.lo).max() / 2) if "lo" in roc else None
    rows = [  # (claim, measurement, value here): what to do, and where, is the claim's advice (unicache_lib/claims.py)
        ("U12", "coverage AUROC for wrong answers, the claim's direction (U12 (a))",
         f"{c.auroc:.2f}" + (f" [{c.lo:.2f}, {c.hi:.2f}] {c.direction}" if "lo" in roc else "")),
        {"measurement": "confidence AUROC (baseline)", "value here": f"{roc.loc['confidence (baseline)', 'auroc']:.2f}",
         "what it suggests on your model": "any attention signal must beat this; if it does not, monitor confidence instead",
         "where": "§1"},
        {"measurement": "wrong answers available", "value here": f"{n_wrong} of {n}",
         "what it suggests on your model": (f"an AUROC is good to about ±{half:.2f} here: " if half is not None else "")
         + "decide on the interval only, and raise N_QUESTIONS until the wrong answers number dozens", "where": "N_QUESTIONS"},
        ("U10", "healthy lowest image share of text queries' reads (U10 (a))", f"{hl.min():.3f}"),
        {"measurement": "image dependence of the breaks the share misses",
         "value here": ", ".join(f"{x}: {det.loc[x, 'image dependence (KL)']:.2f}" for x in missed) or "-",
         "what it suggests on your model": "run image_dependence beside the share after any cache or pruning change: here it "
         f"catches {' and '.join(caught) or 'none of them'} (KL near 0), which the share misses"
         + (f"; it does not catch {both}: neither signal sees that break, check the answers' accuracy" if both else ""),
         "where": "§2 (image_dependence)"},
    ]
    return WrappedTable(pd.DataFrame(decision_rows(rows, "07_diagnostics")))
