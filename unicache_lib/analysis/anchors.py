"""Visual anchors: the few image positions that text reads far more than the rest."""
from __future__ import annotations

import numpy as np
import torch

from ..similarity import jaccard


def image_reads(record, heads: str = "mean") -> torch.Tensor:
    """How much the text reads each image position in one record: ``[n_image]``.

    Uses the stats-mode ``text_read_freq`` (or computes it from a full map), averaged over heads.
    """
    from ..stats import text_read_frequency

    if record.spans is None:
        raise ValueError("the record has no modality spans: capture with spans to find image anchors")
    rf = record.data.get("text_read_freq")
    if rf is None:
        rf = text_read_frequency(record.probs, record.spans)
    a, b = record.spans.image_range()
    return rf[:, a:b].mean(0) if heads == "mean" else rf[:, a:b]


def top_anchors(reads, k: int) -> np.ndarray:
    """Indices (within the image block) of the ``k`` most-read image positions, most-read first."""
    r = torch.as_tensor(reads).float()
    if k < 1 or k > r.shape[-1]:
        raise ValueError(f"k must be in [1, {r.shape[-1]}], got {k}")
    return r.topk(k).indices.numpy()


def batching_overlap(reads_per_sample: list, k: int) -> dict:
    """Claim M3: how much of each sample's anchor set survives averaging over the batch.

    Returns the mean and per-sample Jaccard between each sample's top-``k`` and the top-``k`` of the
    batch-averaged reads.
    """
    R = torch.stack([torch.as_tensor(r).float() for r in reads_per_sample])
    avg = top_anchors(R.mean(0), k)
    per = [jaccard(top_anchors(r, k), avg) for r in R]
    return {"mean_jaccard": float(np.mean(per)), "per_sample": per, "n": len(per), "k": k}


def layer_persistence(reads_by_layer, k: int) -> np.ndarray:
    """``[L, L]`` Jaccard of the top-``k`` anchor sets between every pair of layers
    (``reads_by_layer [L, n_image]``)."""
    sets = [top_anchors(r, k) for r in torch.as_tensor(reads_by_layer)]
    return np.array([[jaccard(a, b) for b in sets] for a in sets])


def group_stability(anchor_sets: dict[str, np.ndarray], groups: dict[str, str]) -> dict:
    """Mean Jaccard of anchor sets between pairs of samples of the same group (scene type) and of
    different groups. ``anchor_sets``: sample -> indices; ``groups``: sample -> group."""
    ids = list(anchor_sets)
    within, across = [], []
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            (within if groups[a] == groups[b] else across).append(jaccard(anchor_sets[a], anchor_sets[b]))
    return {"within": float(np.mean(within)) if within else float("nan"),
            "across": float(np.mean(across)) if across else float("nan"),
            "n_within": len(within), "n_across": len(across)}


PATCH_KINDS = ("object", "edge", "background")


def patch_kinds(masks: np.ndarray, patch: int) -> np.ndarray:
    """``[n_patches]`` index into :data:`PATCH_KINDS`: object (>= 75% covered by objects), edge
    (partly covered: an object boundary, the high-contrast patches), background (no object)."""
    n, h, w = masks.shape
    cover = masks.any(0).reshape(h // patch, patch, w // patch, patch).mean(axis=(1, 3)).ravel()
    return np.where(cover >= 0.75, 0, np.where(cover > 0, 1, 2))


def anchor_placement(anchors, kinds: np.ndarray) -> dict:
    """Where anchors fall vs chance: share of anchors on each patch kind, and the share of all
    patches of that kind (what a random choice of anchors would give)."""
    anchors = np.asarray(anchors)
    out = {}
    for i, name in enumerate(PATCH_KINDS):
        out[name] = float(np.mean(kinds[anchors] == i)) if len(anchors) else float("nan")
        out[f"{name}_chance"] = float(np.mean(kinds == i))
    return out
