"""Tidy tables from stats-mode records of an understanding model (one row per sample x layer, per
head, or per text token), the raw material of notebook 02's figures and claims."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..core.errors import InputError
from ..core.modality import BLOCKS
from ..stats import gini, top_share
from .anchors import image_reads, top_anchors
from .layers import layer_band
from .token_classes import token_class

# What a reader sees for the four block columns of :func:`layer_table` (the stored keys stay ``BLOCKS``): each is a
# share of the *whole map's* mass, so "text->image" here is small when the text has few query rows. Not notebook 07's
# "image share of text queries' reads" (the text rows only).
BLOCK_LABELS: dict[str, str] = {
    "image->image": "image→image share of all attention", "text->text": "text→text share of all attention",
    "image->text": "image→text share of all attention", "text->image": "text→image share of all attention",
}

# Row summaries (max weight, entropy) skip the first rows of a causal map: a row that sees one key
# puts weight 1 on it, which would make every head look "focused".
MIN_KEYS = 16


def cross_modal(blocks):
    """The image->text plus text->image share of ``blocks [..., 4]`` (in ``BLOCKS`` order)."""
    return blocks[..., BLOCKS.index("image->text")] + blocks[..., BLOCKS.index("text->image")]


def _rows(t: torch.Tensor, part: str = "language") -> torch.Tensor:
    """``[H, Sq]`` -> the rows that see at least MIN_KEYS keys (self-attention prompt captures: Sq ==
    Sk). Cross-attention rows all see the vision tokens: none skipped (dead rows are NaN)."""
    return t[:, MIN_KEYS - 1:] if part != "cross" and t.shape[1] >= MIN_KEYS else t


def layer_table(records, scene_of: dict | None = None) -> pd.DataFrame:
    """One row per (sample, layer): statistics averaged over heads (and over query rows that see at
    least ``MIN_KEYS`` keys)."""
    n = max(r.layer for r in records) + 1
    rows = []
    for r in records:
        d = r.data
        row = {
            "sample": r.sample, "layer": r.layer, "band": layer_band(r.layer, n),
            "scene_type": (scene_of or {}).get(r.sample, ""), "part": r.part,
            "norm_entropy": float(torch.nanmean(_rows(d["norm_entropy"], r.part))),
            "max_weight": float(torch.nanmean(_rows(d["max_weight"], r.part))),
            "head_max_weight": float(torch.nanmean(_rows(d["max_weight"], r.part), -1).max()),  # the most focused head
            "diag": float(d["diag"].mean()), "distance": float(d["distance"].mean()),
            "variance": float(d["variance"].mean())}
        if "blocks" in d:
            b = d["blocks"].mean(0)
            row.update({name: float(b[i]) for i, name in enumerate(BLOCKS)})
            row["cross_modal"] = row["image->text"] + row["text->image"]
            if r.spans is not None and r.spans.n_image:  # (a cross-attention VLM's self layers hold no image)
                reads = image_reads(r)
                row.update(top10_share=float(top_share(reads, 0.1)), gini=float(gini(reads)))
        rows.append(row)
    return pd.DataFrame(rows)


def head_table(records) -> pd.DataFrame:
    """One row per (sample, layer, head): the head's typical focus (largest weight of a row, averaged
    over rows), mean normalised entropy and cross-modal share."""
    rows = []
    for r in records:
        d = r.data
        cm = cross_modal(d["blocks"]) if "blocks" in d else torch.full((r.heads,), float("nan"))
        for h in range(r.heads):
            rows.append({"sample": r.sample, "layer": r.layer, "part": r.part, "head": h,
                         "max_weight": float(torch.nanmean(_rows(d["max_weight"], r.part)[h])),
                         "norm_entropy": float(torch.nanmean(_rows(d["norm_entropy"], r.part)[h])),
                         "cross_modal": float(cm[h])})
    return pd.DataFrame(rows)


def token_flow(records, tokens: dict[str, list[str]], special: set[str] | frozenset = frozenset()) -> pd.DataFrame:
    """One row per (sample, layer, text query position): the token, its class and its share of
    attention on image keys (mean over heads). Positions before the image (the prompt prefix) cannot
    read it and are left out; image positions are not rows. Cross-attention records: every text
    position whose row reads the vision tokens (rows before the image are dead, NaN)."""
    n = max(r.layer for r in records) + 1
    rows = []
    for r in records:
        if "image_share" not in r.data:
            raise InputError("records hold no image_share: capture in stats mode with spans")
        share = r.data["image_share"].mean(0)
        toks = tokens[r.sample]
        if r.part == "cross":
            positions = [p for p in range(len(share)) if not bool(share[p].isnan())]
        else:
            a = int(r.spans.image_index[0])
            positions = [p for p in r.spans.text_index if p >= a]  # the prefix cannot see the image (causal)
        for pos in positions:
            rows.append({"sample": r.sample, "layer": r.layer, "band": layer_band(r.layer, n), "pos": int(pos),
                         "token": toks[pos], "class": token_class(toks[pos], special),
                         "image_share": float(share[pos])})
    return pd.DataFrame(rows)


def anchor_sets(records, k: int) -> dict[tuple[str, int], np.ndarray]:
    """(sample, layer) -> indices of the top-``k`` image positions read by the text."""
    return {(r.sample, r.layer): top_anchors(image_reads(r), k) for r in records}
