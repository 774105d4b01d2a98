"""Visual anchors: the few image positions that text reads far more than the rest."""
from __future__ import annotations

import numpy as np
import torch

from ..core.errors import InputError
from ..core.similarity import jaccard
from ..world.scenes import grid_cover
from ..stats import text_read_frequency


def image_reads(record, heads: str = "mean") -> torch.Tensor:
    """How much the text reads each image position in one record: ``[n_image]``.

    Uses the stats-mode ``text_read_freq`` (or computes it from a full map), averaged over heads.
    """
    if record.spans is None:
        raise InputError("the record has no modality spans: capture with spans to find image anchors")
    rf = (record.data["text_read_freq"] if "text_read_freq" in record.data
          else text_read_frequency(record.probs, record.spans))
    idx = torch.as_tensor(record.spans.image_index)  # image tokens in sequence order (tiles may be apart)
    if len(idx) == 0:
        raise InputError(f"record {record.key} has no image keys (a cross-attention VLM's self-attention layer?): "
                         "read the image where its keys are (part 'cross')")
    return rf[:, idx].mean(0) if heads == "mean" else rf[:, idx]


def top_anchors(reads, k: int) -> np.ndarray:
    """Indices (within the image block) of the ``k`` most-read image positions, most-read first."""
    r = torch.as_tensor(reads).float()
    if k < 1 or k > r.shape[-1]:
        raise InputError(f"k must be in [1, {r.shape[-1]}], got {k}")
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
    different groups. ``anchor_sets``: sample -> indices; ``groups``: sample -> group. A sample whose group is
    empty (your own samples without a ``scene_type``) is in no pair: it is not of the others' type, nor of another."""
    ids = [s for s in anchor_sets if groups.get(s)]
    within, across = [], []
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            (within if groups[a] == groups[b] else across).append(jaccard(anchor_sets[a], anchor_sets[b]))
    return {"within": float(np.mean(within)) if within else float("nan"),
            "across": float(np.mean(across)) if across else float("nan"),
            "n_within": len(within), "n_across": len(across)}


PATCH_KINDS = ("object", "edge", "background")


def patch_kinds(masks: np.ndarray, grid) -> np.ndarray:
    """``[cells]`` index into :data:`PATCH_KINDS`: object (>= 75% covered by objects), edge (partly
    covered: an object boundary, the high-contrast patches), background (no object). ``grid``: patch
    side in pixels or ``(rows, cols)`` of image tokens (:func:`~unicache_lib.world.scenes.grid_cover`)."""
    cover = grid_cover(masks.any(0, keepdims=True), grid)[0]
    return np.where(cover >= 0.75, 0, np.where(cover > 0, 1, 2))


def token_kinds(masks: np.ndarray, n_image: int, grid, grid_tokens=None) -> np.ndarray:
    """``[n_image]`` :func:`patch_kinds` of every image token; -1 for tokens that are not a cell of the
    picture's grid (a class token, a padded tile, another tile). ``grid_tokens``: indices of the grid
    cells' tokens within the image span (default: the first rows*cols tokens)."""
    kinds = patch_kinds(masks, grid)
    out = np.full(n_image, -1, np.int64)
    idx = np.arange(len(kinds)) if grid_tokens is None else np.asarray(grid_tokens)
    if len(idx) != len(kinds) or (len(idx) and idx.max() >= n_image):
        raise InputError(f"{len(kinds)} grid cells for {len(idx)} grid tokens of {n_image} image tokens")
    out[idx] = kinds
    return out


def anchor_placement(anchors, kinds: np.ndarray) -> dict:
    """Where anchors fall vs chance: share of anchors on each patch kind, and the share of all
    patches of that kind (what a random choice of anchors would give). Tokens of kind -1 (not on the
    picture's grid) count in neither."""
    anchors, kinds = np.asarray(anchors), np.asarray(kinds)
    on = kinds[anchors] if len(anchors) else kinds[:0]
    on, all_ = on[on >= 0], kinds[kinds >= 0]
    return {key: float(np.mean(among == i)) if len(among) else float("nan") for i, name in enumerate(PATCH_KINDS)
            for key, among in ((name, on), (f"{name}_chance", all_))}
