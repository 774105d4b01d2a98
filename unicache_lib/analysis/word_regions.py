"""Does a prompt word look at what it names in the generated image? (claim G9; notebook 03, sections 0 and 9)

A generated image is segmented by the prompt's colours (:func:`object_masks`); each object's patches are
compared with the patches a word's attention ranks highest (:func:`word_region_table`), and the shapes the
generator actually drew are read back (:func:`drawn_objects`) so a word map is never judged against an object
the model did not draw.

    masks = object_masks(image, prompt)               # bool [n_objects, H, W]
    drawn_objects(image, prompt)                      # [{"asked": "red square", "drawn": "circle", ...}, ...]
    word_region_table(run, prompts, patch=4)          # one row per (prompt, object, word role)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.errors import InputError
from ..world.scenes import patch_grid_masks
from ..world.segment import classify_shape, colour_mask, nearest_position
from ..world.text import scorable
from . import generation as G

BINDING_SHARE = 0.125  # the shape words' regions compared for binding: the top 12.5% of the image patches


def judged(prompt: dict) -> bool:
    """Whether the prompt lists objects and the detector can judge every one of them."""
    return bool(prompt.get("objects")) and all(scorable(o) for o in prompt["objects"])


def object_masks(image: np.ndarray, prompt: dict) -> np.ndarray:
    """Bool ``[n_objects, H, W]``: the pixels of each object of ``prompt`` (a :func:`~unicache_lib.world.text.prompt_set`
    entry with ``objects``, each with a ``colour``, and ``pair`` = ``"same"`` / ``"different"`` / ``""``) in the
    generated ``image [H, W, 3]``, segmented by colour. Two objects of one colour cannot be told apart by colour:
    the picture is split at the middle, the first object's pixels on the left, the second's on the right (the
    prompt set places such pairs left and right)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise InputError(f"object_masks takes a generated image [H, W, 3], got shape {image.shape}")
    objs = prompt.get("objects")
    if not objs:
        raise InputError("the prompt has no 'objects': pass an entry of unicache_lib.world.text.prompt_set")
    same = prompt.get("pair") == "same"  # one colour twice: the first object's pixels left of the middle, the second's right
    left = np.arange(image.shape[1]) < image.shape[1] // 2
    return np.stack([colour_mask(image, o["colour"]) & ((not same) | (left if j == 0 else ~left if j == 1 else False))
                     for j, o in enumerate(objs)])


def drawn_objects(image: np.ndarray, prompt: dict, min_pixels: int = 3) -> list[dict]:
    """What the generator drew for each asked object: ``asked`` ("red square, left"), ``drawn`` (the shape the
    object's pixels look like, :func:`~unicache_lib.world.segment.classify_shape`; None when fewer than
    ``min_pixels`` pixels have its colour), ``position`` (nearest named position) and ``shape_ok``. Empty for a prompt
    without objects the detector can judge (your own prompts: :func:`~unicache_lib.world.text.scorable`)."""
    if not judged(prompt):
        return []
    rows = []
    for o, m in zip(prompt["objects"], object_masks(image, prompt)):
        shape = classify_shape(m) if m.sum() >= min_pixels else None
        rows.append({"asked": f"{o['colour']} {o['shape']}, {o['position']}", "drawn": shape,
                     "position": nearest_position(m) if shape else None, "shape_ok": shape == o["shape"]})
    return rows


def peak_objects(image: np.ndarray, prompt: dict, word_maps: dict) -> dict:
    """word -> the asked object (``"green circle"``) whose pixels cover most of the patch where that word's map peaks,
    or None where the peak is on background. ``word_maps``: word -> ``[n_image]`` weights over a square grid of image
    tokens laid over ``image [H, W, 3]``. Empty for a prompt the detector cannot judge. What a figure of word maps is
    read out with: a word whose peak sits on *another* object than the one it names is a binding error."""
    if not judged(prompt):
        return {}
    masks = object_masks(image, prompt)
    out = {}
    for word, m in word_maps.items():
        m = np.asarray(m, dtype=float).ravel()
        g = int(round(len(m) ** 0.5))
        if g * g != len(m):
            raise InputError(f"{word!r}: {len(m)} image-token weights form no square grid")
        r, c = divmod(int(m.argmax()), g)
        ph, pw = image.shape[0] // g, image.shape[1] // g
        counts = [int(mk[r * ph:(r + 1) * ph, c * pw:(c + 1) * pw].sum()) for mk in masks]
        k = int(np.argmax(counts)) if counts and max(counts) > 0 else None
        out[word] = None if k is None else f"{prompt['objects'][k]['colour']} {prompt['objects'][k]['shape']}"
    return out


def fully_drawn(image: np.ndarray, prompt: dict) -> bool:
    """Every object ``prompt`` asks for drawn in its colour and shape (:func:`drawn_objects`); False for a prompt the
    detector cannot judge."""
    rows = drawn_objects(image, prompt)
    return bool(rows) and all(r["drawn"] and r["shape_ok"] for r in rows)


def distinct_objects(prompt: dict) -> bool:
    """A two-object prompt whose objects differ in colour and in shape: each colour and shape word names one object."""
    objs = prompt.get("objects") or []
    return len(objs) == 2 and objs[0]["colour"] != objs[1]["colour"] and objs[0]["shape"] != objs[1]["shape"]


def word_region_table(run, prompts: list[dict], patch: int) -> pd.DataFrame:
    """Word regions against the drawn objects, for every prompt of a captured sampling run.

    Args:
        run: a :class:`~unicache_lib.capture.gen_runner.GenerationRun` of ``prompts`` (stats or full mode,
            cross or joint attention: the records hold ``word_map``).
        prompts: the ``prompt_set`` entries, in the run's order.
        patch: pixels per image-token side (``image_size // sqrt(image_tokens)``).
    Returns:
        One row per (prompt, object, role) with ``role`` "colour" / "shape": ``iou`` of the word's top-``k``
        patches (its attention averaged over heads, layers and steps, :func:`~.generation.word_maps`) with the
        object's ``k`` patches, and ``chance`` (a random ``k``-patch region's expected IoU); objects not drawn
        (no patch) are skipped. Plus, for two-object prompts, one row with ``role`` "binding overlap": IoU of
        the two shape words' top-12.5% regions (``object`` = -1). Columns: prompt, pair, object, role, iou, chance, k.
    """
    if len(prompts) > len(run.sample_ids):
        raise InputError(f"{len(prompts)} prompts for a run of {len(run.sample_ids)}: pass the run's own prompts")
    recs, rows = run.result.records, []
    for i, p in enumerate(prompts):
        if not judged(p):  # your own prompt without objects the detector knows: nothing to compare with
            continue
        toks = run.tokens[i]
        W = G.word_maps(recs, run.sample_ids[i])  # [tokens, image]
        grid = patch_grid_masks(object_masks(run.images[i], p), patch)
        for j, o in enumerate(p["objects"]):
            obj_patches = grid == j
            k = int(obj_patches.sum())
            if k == 0:
                continue  # the object was not drawn: nothing to compare with
            for role in ("colour", "shape"):
                pos = G.word_positions(toks, o[role])
                if pos:
                    rows.append({"prompt": p["id"], "pair": p["pair"], "object": j, "role": role,
                                 "iou": G.iou(G.top_region(W[pos[min(j, len(pos) - 1)]], k), obj_patches),
                                 "chance": G.chance_iou(k, W.shape[1]), "k": k})
        if p["pair"]:
            pos = [G.word_positions(toks, o["shape"]) for o in p["objects"]]
            if all(pos):
                kk = max(1, int(round(BINDING_SHARE * W.shape[1])))
                rows.append({"prompt": p["id"], "pair": p["pair"], "object": -1, "role": "binding overlap",
                             "iou": G.iou(G.top_region(W[pos[0][0]], kk), G.top_region(W[pos[1][0]], kk)),
                             "chance": G.chance_iou(kk, W.shape[1]), "k": kk})
    return pd.DataFrame(rows, columns=["prompt", "pair", "object", "role", "iou", "chance", "k"])
