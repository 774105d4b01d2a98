"""Weak localisation (claim U11): does a word that names an object attend to that object's patches
more than to the *other* objects of the image?

Measured against the other objects, not against the object's area: background patches are all
alike, so even a random model's top patch lands on *some* object often.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..capture import AttentionCapture
from ..capture.runner import inputs_for
from ..core.errors import InputError
from .generation import chance_iou, iou, top_region, word_positions
from ..world.scenes import patch_grid_masks
from ..families import family_of


def selectivity(weights, patch_object: np.ndarray, target: int) -> float:
    """Mean attention per patch on object ``target`` divided by the mean per patch on the other objects.

    Args:
        weights: ``[n_patches]`` one token's attention over the image patches.
        patch_object: ``[n_patches]`` object index per patch, -1 for background
            (:func:`~unicache_lib.world.scenes.patch_grid_masks`).
    Returns:
        > 1 when the named object is preferred; NaN when the image has no other object or the
        target covers no patch.
    """
    w = torch.as_tensor(weights).float().numpy()
    po = np.asarray(patch_object)
    if w.shape != po.shape:
        raise InputError(f"{w.shape[0]} weights for {po.shape[0]} patches")
    on = po == target
    other = (po >= 0) & ~on
    if not on.any() or not other.any():
        return float("nan")
    denom = w[other].mean()
    return float(w[on].mean() / denom) if denom > 0 else float("inf")


QUERIES = ("shape", "colour", "last")


def object_readings(model, processor, samples, grid=None, question: str = "where is the {colour} {shape} ?",
                    query: str = "shape"):
    """For every object of every multi-object sample with masks, ``question`` asked about it, and per layer the
    ``query`` position's attention over the picture's patches, every head: what :func:`object_word_selectivity`
    scores, unscored (so a score of your own can run on it; lesson 02's exercises do).

    ``question``, ``query`` and ``grid`` as in :func:`object_word_selectivity`. Yields ``(sample id, target object
    index, layer, W, patch_object)``: ``W [heads, n_patches]`` (a tensor), ``patch_object [n_patches]`` the object
    index under each patch, -1 for background (:func:`~unicache_lib.world.scenes.patch_grid_masks`)."""
    if query not in QUERIES:
        raise InputError(f"query must be one of {QUERIES}, got {query!r}")
    fam = family_of(model)
    part = fam.image_part
    for s in samples:
        if len(s.objects) < 2 or len(s.masks) != len(s.objects):  # one object, or no masks to say where they are
            continue
        for t, o in enumerate(s.objects):
            q = question.format(colour=o["colour"], shape=o["shape"])
            inputs = inputs_for(model, processor, s.image, q)
            g = grid or fam.image_grid(model.config, inputs)
            if g is None:
                raise InputError(f"{fam.name}: the image tokens of this input form no single grid over the picture "
                                 f"(tiles / newline tokens); pass grid=(rows, cols) for a layout you know")
            po = patch_grid_masks(s.masks, g)
            cells = fam.grid_tokens(model.config, inputs) if grid is None else torch.arange(len(po))
            toks = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
            if query == "last":
                pos = len(toks) - 1
            else:
                hits = word_positions(toks, o[query])
                if not hits:
                    raise InputError(f"query {query!r}: the question {q!r} does not contain the object's {query} word "
                                     f"{o[query]!r}; put {{{query}}} in the question or use query='last'")
                pos = hits[-1]
            with torch.no_grad(), AttentionCapture(model, "full", part=part) as cap:
                model(**inputs)
            for r in cap.result.select(part=part):
                w_img = r.probs[:, pos, :] if part == "cross" else r.probs[:, pos, torch.as_tensor(r.spans.image_index)]
                yield s.id, t, r.layer, w_img[:, cells], po


def object_word_selectivity(model, processor, samples, grid=None, question: str = "where is the {colour} {shape} ?",
                            query: str = "shape", per_head: bool = False) -> "pd.DataFrame":
    """Ask ``question`` (default ``where is the {colour} {shape} ?``) about every object of every multi-object
    sample, and measure the ``query`` position's attention on that object vs the other objects, per layer.

    ``question`` is formatted with the object's ``colour`` and ``shape`` (e.g. ``"what shape is the {colour}
    object ?"``); ``query`` is the position read: ``"shape"`` / ``"colour"`` (the last occurrence of the object's
    shape / colour word, which the question must contain) or ``"last"`` (the last prompt position, the one that
    produces the answer). ``per_head``: one row per head (column ``head``) instead of the mean over heads.

    The map read is the one whose keys are the image: the language model's self-attention (image
    tokens in the sequence) or, for a cross-attention VLM, its cross-attention layers. The image
    tokens are placed over the picture by the family's token grid (``grid=(rows, cols)`` overrides
    it); a family whose tokens form no single grid (tiles with newline tokens) raises. The readings come from
    :func:`object_readings`.

    Returns one row per (sample, object, layer), or per (sample, object, layer, head) with ``per_head``:
    ``selectivity`` (of the map averaged over heads, or of one head's, then :func:`selectivity`), ``top_on_target`` (is
    the most-attended patch on the object), ``iou`` (the word's k most-read patches against the object's k patches)
    and ``chance_iou`` (the same for k random patches).
    """
    rows = []
    for sid, t, layer, W, po in object_readings(model, processor, samples, grid, question, query):
        k = int((po == t).sum())
        for h, w in (enumerate(W) if per_head else [(None, W.mean(0))]):
            rows.append({"sample": sid, "object": t, "layer": layer, **({"head": h} if per_head else {}),
                         "selectivity": selectivity(w, po, t), "top_on_target": bool(po[int(w.argmax())] == t),
                         "iou": iou(top_region(w.numpy(), k), po == t) if k else float("nan"),
                         "chance_iou": chance_iou(k, len(po))})
    return pd.DataFrame(rows, columns=["sample", "object", "layer", *(["head"] if per_head else []), "selectivity",
                                       "top_on_target", "iou", "chance_iou"])


def _image_row(r, P, query_pos: int):
    """Query row ``query_pos`` of ``P [..., Sq, Sk]`` on the image keys (cross-attention: every vision token), and the
    keys that row sees (the unit of the uniform weight: ``query_pos + 1`` under a causal mask)."""
    row = P[..., query_pos, :]
    return (row, P.shape[-1]) if r.part == "cross" else (row[..., r.spans.image_index], query_pos + 1)


def query_over_image(records, sample: str, query_pos: int, head: int | None = None,
                     uniform: bool = False) -> dict[int, np.ndarray]:
    """One query position's attention over the image, layer by layer, from full-mode records.

    Args:
        records: full-mode records (``probs [H, S, S]`` with spans, or cross-attention ``[H, T, V]``).
        sample: the sample id; ``query_pos``: the query's index in the sequence (cross-attention: in the text).
        head: one head, or None for the mean over heads.
        uniform: in multiples of the uniform weight (× the keys the query row can see: ``query_pos + 1`` under a
            causal mask, every vision token in cross-attention), the unit every lesson shows attention over images
            in: 1 = what each key would get if the row read evenly.
    Returns:
        layer -> ``[n_image]`` weights on the image keys (cross-attention: on the vision tokens), in layer order.
    """
    out = {}
    for r in sorted((r for r in records if r.sample == sample), key=lambda r: r.layer):
        if "probs" not in r.data:
            raise InputError(f"record ({sample}, layer {r.layer}) holds no full map: capture it with mode='full'")
        P = r.probs.float()
        if not 0 <= query_pos < P.shape[-2]:
            raise InputError(f"query_pos {query_pos} outside the {P.shape[-2]} query rows of sample {sample}")
        row, seen = _image_row(r, P.mean(0) if head is None else P[head], query_pos)
        out[r.layer] = (row * seen if uniform else row).numpy()
    if not out:
        raise InputError(f"no record of sample {sample!r} among the {len(records)} records given")
    return out


def reading_head(records, query_pos: int) -> tuple:
    """``(record, head, peak)``: among one sample's full-mode records, the layer and head whose query row at
    ``query_pos`` puts the most weight on one image key, with that weight in multiples of the uniform weight (the
    head where a lesson's first picture shows the word reading the image, instead of one that happens to read
    nothing there). Ties go to the earlier layer, then head."""
    best = None
    for r in sorted(records, key=lambda r: r.layer):
        if "probs" not in r.data:
            raise InputError(f"record (layer {r.layer}) holds no full map: capture it with mode='full'")
        row, seen = _image_row(r, r.probs.float(), query_pos)
        peak, h = (row * seen).max(-1).values.max(0)
        if best is None or float(peak) > best[2]:
            best = (r, int(h), float(peak))
    if best is None:
        raise InputError("reading_head needs at least one full-mode record")
    return best
