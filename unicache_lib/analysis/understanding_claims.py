"""Notebook 02's claim measurements (U1-U13): each claim's statistic with its bootstrap interval over the
samples, recorded on a :class:`~unicache_lib.scoreboard.Scoreboard` whose rules were written first.

:func:`declare` writes the rules (made from :mod:`unicache_lib.claims`, where each claim is written once); four
groups of measurements, one function each, so the notebook's scoreboard cell reads as five calls:

- :func:`measure_depth_claims`: U1, U2a, U2b, U8, U9, U13 from the per-(sample, layer) and per-head tables;
- :func:`measure_anchor_claims`: U3, U4 from the anchors of section 4;
- :func:`measure_word_claims`: U5, U6 from the token-flow and decoding tables;
- :func:`measure_localisation_claims`: U11 from the object-word selectivity of section 6.

What compares scene types (U3 (b), §9's :func:`scene_type_table`, 05's cluttered scenes) needs a ``scene_type`` on
the samples: without two types it reads "not measurable with these samples" and says what to add
(:func:`scene_type_note`), never a number of one untyped group.

Every interval resamples samples (whole samples: the questions or captions of one image are not independent).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..claims import rules_of
from ..core.modality import BLOCKS
from ..core.scoring import FOCUSED
from ..core.similarity import jaccard
from ..intervals import bootstrap
from ..world.scenes import SCENE_TYPES
from . import anchors as A

BY_CONSTRUCTION = "cross-attention VLM: a cross layer reads only vision tokens, so the text queries' image share is 1 by construction"
CONTENT, FUNCTION = ["object", "attribute", "position"], ["function", "punctuation"]


def declare(board, top_k: int, chance_jaccard: float) -> None:
    """Write U1-U13's rules on ``board`` before any measurement: U3 (a) compares the top-``top_k`` anchor Jaccard
    with 3 x ``chance_jaccard`` (what two random sets of that size would share)."""
    board.declare(rules_of("02_understanding_maps", top_k=top_k, u3_bar=3 * chance_jaccard))


def over_samples(stat, n: int, units=None, unit: str = "samples"):
    """95% bootstrap interval of ``stat(indices of resampled units)`` over ``range(n)`` (or ``units``)."""
    return bootstrap(list(range(n)) if units is None else units, lambda u: stat(np.asarray(u)), unit)


def measure_depth_claims(board, L: pd.DataFrame, H: pd.DataFrame, bands: dict, cross: bool) -> dict:
    """U1, U2a, U2b, U8, U9, U13.

    Args:
        L: :func:`~unicache_lib.analysis.understanding.layer_table` (one row per sample x layer).
        H: :func:`~unicache_lib.analysis.understanding.head_table` (one row per sample x layer x head).
        bands: band -> captured layers (:func:`~unicache_lib.analysis.layers.require_bands`).
        cross: the image is read by cross-attention layers (no distance, blocks by construction).
    Returns:
        ``{"X": column -> [n_samples, n_layers], "HM": [n_samples, n_layers, n_heads] max weight}`` for read-outs.
    """
    ids, captured = sorted(L["sample"].unique()), sorted(L["layer"].unique())
    n_s, band_idx = len(ids), {b: [captured.index(li) for li in ls] for b, ls in bands.items()}  # band -> columns
    X = {c: L.pivot(index="sample", columns="layer", values=c).loc[ids].to_numpy()
         for c in ("top10_share", "distance", "norm_entropy", "cross_modal", *BLOCKS)}
    depth = L.groupby("band")[["norm_entropy", "distance"]].mean()

    def band(c, b, idx):
        return X[c][idx][:, band_idx[b]].mean()

    board.measure("U1", over_samples(lambda i: X["top10_share"][i].mean(), n_s), shown=f"top-10% share, Gini {L.gini.mean():.2f}")
    if cross:
        board.measure("U2a", None, criterion="a", note="cross-attention: text queries over vision tokens have no attention distance")
    else:
        board.measure("U2a", over_samples(lambda i: band("distance", "deep", i) / band("distance", "shallow", i), n_s),
                      criterion="a", shown=f"distance {depth.loc['shallow', 'distance']:.1f}→{depth.loc['deep', 'distance']:.1f}")
    board.measure("U2a", over_samples(lambda i: band("norm_entropy", "deep", i) - band("norm_entropy", "shallow", i), n_s),
                  criterion="b", shown=f"entropy {depth.loc['shallow', 'norm_entropy']:.2f}→{depth.loc['deep', 'norm_entropy']:.2f}")
    HM = np.stack([H[H["sample"] == s].pivot(index="layer", columns="head", values="max_weight").loc[captured].to_numpy()
                   for s in ids])
    board.measure("U2b", over_samples(lambda i: band("norm_entropy", "shallow", i), n_s), criterion="a", shown="shallow entropy")
    board.measure("U2b", over_samples(lambda i: HM[i][:, band_idx["deep"]].mean((0, 1)).max(), n_s), criterion="b",
                  shown="top deep head max weight")

    def some_not_all(i):
        f = (HM[i].mean(0) > FOCUSED).mean(1)  # [layers] share of focused heads
        return ((f > 0) & (f < 1)).mean()

    frac_focused = (H.groupby(["layer", "head"]).max_weight.mean().unstack() > FOCUSED).mean(1)
    board.measure("U8", over_samples(some_not_all, n_s), shown=f"per layer: {frac_focused.round(2).to_dict()}")
    others = np.stack([X[c] for c in ("text->text", "image->text", "text->image")]).max(0)
    if cross:
        for crit in ("a", "b"):
            board.measure("U9", None, criterion=crit, note=BY_CONSTRUCTION)
        board.measure("U13", None, criterion="a", note=BY_CONSTRUCTION)
    else:
        board.measure("U9", over_samples(lambda i: (X["image->image"][i].mean(0) - others[i].mean(0)).min(), n_s),
                      criterion="a", shown="image->image margin")
        board.measure("U9", over_samples(lambda i: X["cross_modal"][i].mean(0).min(), n_s), criterion="b",
                      shown=f"min cross-modal {L.groupby('layer').cross_modal.mean().min():.2f}")
        board.measure("U13", over_samples(lambda i: band("cross_modal", "shallow", i), n_s), criterion="a",
                      shown="shallow cross-modal")
    board.measure("U13", over_samples(lambda i: band("norm_entropy", "shallow", i) - band("norm_entropy", "middle", i), n_s),
                  criterion="b", shown=f"entropy shallow {depth.loc['shallow', 'norm_entropy']:.2f} / middle "
                                       f"{depth.loc['middle', 'norm_entropy']:.2f}")
    return {"X": X, "HM": HM}


def measure_anchor_claims(board, L: pd.DataFrame, img_reads: np.ndarray, anchor_sets: dict, bands: dict,
                          scene_of: dict, placement: pd.DataFrame, sink: list, anchor_mass: list, record_samples: list,
                          top_k: int, cross: bool, family_name: str, masks_note: str | None = None) -> None:
    """U3 (anchors persist across layers; within-scene-type vs across-type stability) and U4 (anchors on objects;
    anchors vs the first-3-positions sink).

    Args:
        img_reads: ``[n_samples, n_layers, n_image]`` the text's read frequency over the image, samples in the order
            of ``L["sample"].unique()``.
        anchor_sets: (sample, layer) -> top-``top_k`` image positions
            (:func:`~unicache_lib.analysis.understanding.anchor_sets`).
        placement: one row per (sample, layer) with ``object`` / ``object_chance`` shares
            (:func:`~unicache_lib.analysis.anchors.anchor_placement`).
        sink, anchor_mass, record_samples: per record, the text's read share on the first 3 positions, on the
            anchors, and the record's sample.
        masks_note: why U4 (a) cannot be scored (samples without object masks,
            :func:`~unicache_lib.world.samples.missing`); None: it can.
    """
    ids, captured = sorted(L["sample"].unique()), sorted(L["layer"].unique())
    n_s, col = len(ids), {li: captured.index(li) for li in captured}
    lo, mid = bands["shallow"][0], bands["middle"][0]
    chance = top_k / (2 * img_reads.shape[-1] - top_k)
    jac_layers = np.array([A.layer_persistence(img_reads[k], top_k)[col[lo], col[mid]] for k in range(n_s)])
    board.measure("U3", over_samples(lambda i: jac_layers[i].mean(), n_s), criterion="a",
                  shown=f"layer {lo} vs {mid} (chance {chance:.2f})")
    J = np.array([[[jaccard(anchor_sets[(a, li)], anchor_sets[(b, li)]) for b in ids] for a in ids]
                  for li in captured]).mean(0)  # [n_s, n_s]
    typed = np.array([bool(scene_of.get(s)) for s in ids])  # a sample without a scene_type is in no pair
    both = typed[:, None] & typed[None, :]
    same_type = np.array([[scene_of.get(a) == scene_of.get(b) for b in ids] for a in ids]) & both
    other_type = ~same_type & both

    def within_minus_across(i):
        a, b = np.triu_indices(len(i), 1)
        keep = i[a] != i[b]  # a sample drawn twice is not a pair
        w = same_type[i[a], i[b]] & keep
        x = other_type[i[a], i[b]] & keep
        return J[i[a], i[b]][w].mean() - J[i[a], i[b]][x].mean() if w.any() and x.any() else np.nan

    why_not = scene_pairs_note(scene_of, ids)
    if why_not is None:
        typed_ids = [s for s, t in zip(ids, typed) if t]
        stab = [A.group_stability({s: anchor_sets[(s, li)] for s in typed_ids}, scene_of) for li in captured]
        board.measure("U3", over_samples(within_minus_across, int(typed.sum()), units=list(np.flatnonzero(typed))),
                      criterion="b", shown=f"within-type {np.nanmean([v['within'] for v in stab]):.2f} "
                                           f"vs across {np.nanmean([v['across'] for v in stab]):.2f}")
    else:
        board.measure("U3", None, criterion="b", note=why_not)
    pl = placement.groupby("sample")[["object", "object_chance"]].mean().loc[ids].to_numpy()
    marks = pd.DataFrame({"sample": record_samples, "sink": sink, "anchor": anchor_mass}).groupby("sample").mean().loc[ids].to_numpy()
    if masks_note:
        board.measure("U4", None, criterion="a", note=masks_note)
    elif np.isfinite(pl).all():
        board.measure("U4", over_samples(lambda i: pl[i, 0].mean() / max(pl[i, 1].mean(), 1e-9), n_s), criterion="a",
                      shown="anchors on objects vs chance")
    else:
        board.measure("U4", None, criterion="a", note=f"{family_name}: the image tokens form no single grid over the picture")
    if cross:
        board.measure("U4", None, criterion="b", note="cross-attention VLM: the keys are vision tokens only, there is no text sink")
    else:
        board.measure("U4", over_samples(lambda i: (marks[i, 1] - marks[i, 0]).mean(), n_s), criterion="b",
                      shown=f"anchor mass {np.mean(anchor_mass):.2f} vs first-3 {np.mean(sink):.2f}")


def scene_type_note(scene_of: dict) -> str | None:
    """Why what compares scene types (02 §9's table, 05's cluttered scenes) cannot be read on these samples, as the
    note "not measurable with these samples: ..."; None: two scene types or more are present. ``scene_of``: sample ->
    its ``scene_type`` ("" where the samples folder gives none)."""
    types = sorted({t for t in scene_of.values() if t})
    untyped = sum(1 for t in scene_of.values() if not t)
    if len(types) >= 2:
        return None
    what = ((f"none of the {untyped} samples has a scene_type" if untyped != 1 else "the one sample has no scene_type")
            if not types else
            f"every sample with a scene_type is '{types[0]}'" + (f" ({untyped} have none)" if untyped else ""))
    return (f"not measurable with these samples: {what}, so no two scene types can be compared; add a 'scene_type' "
            f"(one of {', '.join(SCENE_TYPES)}) to the lines of metadata.jsonl, two samples or more of each of two "
            f"types or more")


def scene_type_table(L: pd.DataFrame) -> str:
    """02 §9: the mean of each sample-layer statistic per scene type and the spread across types (entropy, top-10%
    share), from :func:`~unicache_lib.analysis.understanding.layer_table`'s ``L``; samples without a scene_type are
    left out, and with fewer than two scene types the table is "not measurable" (:func:`scene_type_note`)."""
    note = scene_type_note(dict(zip(L["sample"], L["scene_type"].fillna(""))))
    if note is not None:
        return f"scene types: {note}"
    typed = L[L["scene_type"].fillna("") != ""]
    by_type = typed.groupby("scene_type")[["norm_entropy", "max_weight", "cross_modal", "top10_share", "gini"]].mean()
    left_out = L["sample"].nunique() - typed["sample"].nunique()
    return (by_type.round(3).to_string() + f"\nspread across scene types: entropy {np.ptp(by_type.norm_entropy):.3f}, "
            f"top-10% share {np.ptp(by_type.top10_share):.3f}"
            + (f" ({left_out} samples without a scene_type left out)" if left_out else ""))


def scene_pairs_note(scene_of: dict, ids=None) -> str | None:
    """Why U3 (b) (anchor Jaccard within a scene type minus across types) cannot be measured on the samples ``ids``
    (default: every key of ``scene_of``): no scene types (:func:`scene_type_note`), or no two samples of one type;
    None: there are pairs of both kinds."""
    of = {s: scene_of.get(s) or "" for s in (scene_of if ids is None else ids)}
    note = scene_type_note(of)
    return (note if note is not None else "one sample per scene type: no within-type pairs (PER_TYPE >= 2 needed)"
            if pd.Series([t for t in of.values() if t]).value_counts().max() < 2 else None)


def class_sums(df: pd.DataFrame, classes) -> np.ndarray:
    """``[n_samples, 2]``: per sample (sorted), sum and count of ``image_share`` over the tokens of ``classes``."""
    return (df[df["class"].isin(classes)].groupby("sample").image_share.agg(["sum", "count"])
            .reindex(sorted(df["sample"].unique())).fillna(0).to_numpy())


def ratio_of_means(a: np.ndarray, b: np.ndarray):
    """Statistic over resampled sample indices: mean image share of ``a``'s tokens / of ``b``'s (from :func:`class_sums`)."""
    return lambda i: (a[i, 0].sum() / a[i, 1].sum()) / (b[i, 0].sum() / b[i, 1].sum()) if a[i, 1].sum() and b[i, 1].sum() else np.nan


def measure_word_claims(board, F: pd.DataFrame, D: pd.DataFrame, cross: bool) -> None:
    """U5 (content vs function words, prompt) and U6 (the same while decoding).

    Args:
        F: :func:`~unicache_lib.analysis.understanding.token_flow` (one row per sample x layer x text position).
        D: one row per (sample, layer, generated token) with ``class`` and ``image_share``.
    """
    content = F[F["class"].isin(CONTENT)].image_share.mean()
    function = F[F["class"].isin(FUNCTION)].image_share.mean()
    cw, fw = class_sums(F, CONTENT), class_sums(F, FUNCTION)
    if cross:
        board.measure("U5", None, note=BY_CONSTRUCTION)
    elif not (cw[:, 1].sum() and fw[:, 1].sum()):
        board.measure("U5", None, note="the questions hold no content word or no function word to compare")
    else:
        board.measure("U5", over_samples(ratio_of_means(cw, fw), len(cw)),
                      shown=f"{content:.3f} / {function:.3f} over {len(F)} token rows")
    dcw, dfw = class_sums(D, CONTENT), class_sums(D, FUNCTION)
    n_cap = D["sample"].nunique()
    if cross:
        board.measure("U6", None, note=BY_CONSTRUCTION)
    elif not (dcw[:, 1].sum() and dfw[:, 1].sum()):
        board.measure("U6", None, note="the captions hold no content word or no function word to compare")
    elif n_cap >= 2:
        board.measure("U6", over_samples(ratio_of_means(dcw, dfw), n_cap, list(range(n_cap)), "captions"),
                      shown=f"{n_cap} greedy captions")
    else:
        board.measure("U6", None, note="fewer than 2 captions (N_CAPTIONS)")


def measure_localisation_claims(board, loc: pd.DataFrame, ctrl: pd.DataFrame, note: str | None = None) -> None:
    """U11: in the layer where the trained model's median selectivity is highest, (a) that median and (b) its
    ratio to the untrained-LM control's, resampled by sample (the objects of one image are not independent).

    Args:
        loc, ctrl: :func:`~unicache_lib.analysis.localisation.object_word_selectivity` of the model and of its
            untrained-LM control (one row per sample x object x layer).
        note: why ``loc`` may be empty (e.g. :func:`~unicache_lib.world.samples.missing` masks), for the scoreboard.
    """
    if loc.empty:
        for c in ("a", "b"):
            board.measure("U11", None, criterion=c, note=note or "no sample with two or more objects and their masks")
        return
    best = loc.groupby("layer").selectivity.median().idxmax()
    n_loc = loc[loc.layer == loc.layer.min()].shape[0]
    lt, lc = loc[loc.layer == best], ctrl[ctrl.layer == best]
    multi = sorted(lt["sample"].unique())
    by_s = {s: (lt[lt["sample"] == s].selectivity.to_numpy(), lc[lc["sample"] == s].selectivity.to_numpy()) for s in multi}

    def median_sel(u, which):
        return np.nanmedian(np.concatenate([by_s[s][which] for s in u]))

    if len(multi) >= 2:
        board.measure("U11", bootstrap(multi, lambda u: median_sel(u, 0), "samples"), criterion="a",
                      shown=f"layer {best}, {n_loc} object questions")
        board.measure("U11", bootstrap(multi, lambda u: median_sel(u, 0) / median_sel(u, 1), "samples"), criterion="b",
                      shown=f"control {ctrl.groupby('layer').selectivity.median().loc[best]:.2f}")
    else:
        board.measure("U11", None, note="fewer than 2 multi-object samples")
