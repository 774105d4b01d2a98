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
