"""Measurements of notebook 07 that only the study's other architectures need (claims A1-A6).

Every function takes records captured by :class:`~unicache_lib.capture.AttentionCapture` (or the models
themselves, for the ablation and the decoding runs) and returns tidy tables whose rows are the units the
scoreboard resamples (samples, or (sample, token) pairs grouped by sample).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from ..modality import BLOCKS, IMAGE, TEXT
from .layers import layer_band


def reading_profile(records, model: str, part: str | None = None) -> pd.DataFrame:
    """One row per (sample, layer) of ``part``: how much and how sharply the text reads the image.

    Columns: ``model``, ``sample``, ``layer``, ``depth`` (layer / (n - 1), 0 = first, 1 = last), ``band``,
    ``text_image_share`` (mean over heads and over the text query rows that can see the image, of each
    row's mass on image keys; NaN where the text has no image keys to choose against: a cross-attention
    layer reads only the image), ``norm_entropy`` of those rows, ``cross_modal`` (image->text plus
    text->image share of the whole map, self-attention only).
    """
    recs = [r for r in records if part is None or r.part == part]
    if not recs:
        raise ValueError(f"no records of part {part!r}")
    layers = sorted({r.layer for r in recs})
    n = max(layers) + 1
    rows = []
    for r in recs:
        d = r.data
        if "norm_entropy" not in d:
            raise ValueError("reading_profile needs stats-mode records (norm_entropy, image_share)")
        ent = d["norm_entropy"].float()
        if r.spans is None and r.part != "cross":  # a tower without the other modality (CLIP): no split
            share, cm, e = float("nan"), float("nan"), float(torch.nanmean(ent))
        elif r.part == "cross":
            live = ~torch.isnan(ent[0])
            share, cm = float("nan"), float("nan")
            e = float(ent[:, live].mean())
        else:
            if r.spans is None or "image_share" not in d:
                raise ValueError(f"record {r.key} has no spans: capture with spans to split text from image")
            kinds = torch.as_tensor(r.spans.array)
            q = kinds[-ent.shape[1]:]
            # text rows that can see the image (a causal prefix before the image puts exactly 0 on it; a
            # bidirectional stream's text rows all see it)
            sees = torch.nan_to_num(d["image_share"].float()).amax(0) > 0
            text_rows = (q == TEXT) & sees
            share = float(torch.nanmean(d["image_share"].float()[:, text_rows])) if bool(text_rows.any()) else float("nan")
            e = float(torch.nanmean(ent[:, text_rows])) if bool(text_rows.any()) else float(torch.nanmean(ent))
            b = d["blocks"].float().mean(0) if "blocks" in d else None
            cm = float(b[BLOCKS.index("image->text")] + b[BLOCKS.index("text->image")]) if b is not None else float("nan")
        rows.append({"model": model, "sample": r.sample, "layer": r.layer, "depth": r.layer / max(1, n - 1),
                     "band": layer_band(r.layer, n), "part": r.part, "text_image_share": share, "norm_entropy": e,
                     "cross_modal": cm})
    return pd.DataFrame(rows)


def generator_profile(records, model: str) -> pd.DataFrame:
    """:func:`reading_profile` for a generator's records (joint or cross attention, averaged over steps):
    ``text_image_share`` (joint: text queries' share on image keys; cross: NaN, the text is never a query),
    ``norm_entropy`` (joint: text query rows; cross: image queries over the text keys) and ``cross_modal``."""
    from .generation import step_table

    T = step_table([r for r in records if r.part in ("joint", "cross")])
    T["text_image_share"] = np.where(T.part == "joint", T.share_ti / (T.share_ti + T.share_tt), np.nan)
    T["norm_entropy"] = np.where(T.part == "joint", T.txt_entropy, T.text_entropy)
    T["cross_modal"] = np.where(T.part == "joint", T.share_it + T.share_ti, np.nan)
    g = T.groupby(["sample", "part", "layer"])[["text_image_share", "norm_entropy", "cross_modal"]].mean().reset_index()
    n = g.layer.max() + 1
    g["depth"] = g.layer / max(1, n - 1)
    g["band"] = [layer_band(int(li), n) for li in g.layer]
    g["model"] = model
    return g


def head_roles(records, model: str, focused: float = 0.45, spread: float = 0.8) -> pd.DataFrame:
    """One row per (layer, head): its role over samples, from its mean max weight and normalised entropy:
    ``focused`` (a row's largest weight above ``focused`` on average), ``spread`` (normalised entropy above
    ``spread``) or ``mixed``."""
    from .understanding import head_table

    if records and "row_entropy" in records[0].data:  # a generator's records: its image queries, over the steps
        rows = [{"layer": r.layer, "head": h, "max_weight": float(r.data["max_weight"][h, 0]),
                 "norm_entropy": float(r.data["row_entropy"][h, 0])} for r in records for h in range(r.heads)
                if r.part in ("joint", "cross")]
        H = pd.DataFrame(rows)
    else:
        H = head_table(records)
    H = H.groupby(["layer", "head"])[["max_weight", "norm_entropy"]].mean().reset_index()
    H["role"] = np.where(H.max_weight > focused, "focused", np.where(H.norm_entropy > spread, "spread", "mixed"))
    H["model"] = model
    return H


def four_block_rows(records) -> pd.DataFrame:
    """Single-stream fusion (A1): one row per (sample, layer) with the image queries' share on image keys and
    on text keys, and the text's share of the positions (what uniform attention would give the text)."""
    rows = []
    for r in records:
        kinds = torch.as_tensor(r.spans.array)
        img_rows = kinds[-r.data["image_share"].shape[1]:] == IMAGE
        img_share = float(torch.nanmean(r.data["image_share"].float()[:, img_rows]))
        b = r.data["blocks"].float().mean(0)
        rows.append({"sample": r.sample, "layer": r.layer, "image_queries_on_image": img_share,
                     "image_queries_on_text": 1 - img_share, "text_position_share": float((kinds == TEXT).float().mean()),
                     "image->image": float(b[BLOCKS.index("image->image")]),
                     "cross_modal": float(b[BLOCKS.index("image->text")] + b[BLOCKS.index("text->image")])})
    return pd.DataFrame(rows)


@contextmanager
def image_queries_blind_to_text(model, n_image: int):
    """Inside the block, ViLT's image queries (the last ``n_image`` positions) cannot see the text keys: a
    pre-hook on every self-attention module adds a 4-D mask with ``-inf`` on (image row, text column). The
    text still reads the image. Hooks are removed on exit, also on error."""
    from ..families import family_of

    fam = family_of(model)
    if fam.name != "ViLT":  # other families pass their masks otherwise (kwargs, causal implied): a mask added here would
        raise ValueError(f"image_queries_blind_to_text edits ViLT's additive attention mask; {fam.name} builds its masks "
                         f"otherwise and would attend over a mask this hook did not mean. Pass a ViLT model")
    handles = []

    def pre(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        S = h.shape[1]
        m = torch.zeros(1, 1, S, S, dtype=h.dtype, device=h.device)
        m[..., S - n_image:, : S - n_image] = torch.finfo(h.dtype).min
        am = args[1] if len(args) > 1 else kwargs.get("attention_mask")
        m = m if am is None else am + m  # keep the padding mask ([B, 1, 1, S] broadcasts)
        if len(args) > 1:
            args = (args[0], m) + tuple(args[2:])
        else:
            kwargs = dict(kwargs, attention_mask=m)
        return args, kwargs

    try:
        for s in fam.sites(model, ("language",)):
            handles.append(s.module.register_forward_pre_hook(pre, with_kwargs=True))
        yield model
    finally:
        for h in handles:
            h.remove()


def caption_word_rows(records, tokens: list[str], scene, grid_tokens, grid) -> pd.DataFrame:
    """Teacher-forced caption on a cross-attention VLM (A3): one row per (cross layer, caption content word) of
    one sample: the word's mass on its object's patches, on the background, its object's area share, and for
    position words the mass on the matching half / on the opposite half; ``norm_entropy`` of the word's row over the
    grid cells (renormalised; 1 = even).

    ``tokens``: the prompt + caption tokens (the caption is the text after the last ``:``); ``grid_tokens``:
    indices of the grid cells among the keys; ``grid``: (rows, cols)."""
    from ..world.scenes import patch_grid_masks
    from ..world.text import POSITION_ORDER

    po = patch_grid_masks(scene.masks, grid)
    rows_g, cols_g = np.divmod(np.arange(len(po)), grid[1])
    halves = {"left": cols_g < grid[1] / 2, "right": cols_g >= grid[1] / 2, "top": rows_g < grid[0] / 2,
              "bottom": rows_g >= grid[0] / 2}
    opposite = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}
    start = max(i for i, t in enumerate(tokens) if t == ":") + 1
    cap = tokens[start:]
    # caption = "colour shape position , colour shape position ..." in reading order
    objs = sorted(range(len(scene.objects)), key=lambda i: POSITION_ORDER.index(scene.objects[i].position))
    out = []
    for r in records:
        P = r.probs.float().mean(0)  # [T, K]
        for j, word in enumerate(cap):
            k = j // 4  # the object this triple describes (",": 4th token)
            if k >= len(objs) or j % 4 == 3:
                continue
            t = objs[k]
            w = P[start + j][torch.as_tensor(grid_tokens)].numpy()  # the word's own row
            w = w / max(w.sum(), 1e-12)
            kind = ("colour", "shape", "position")[j % 4]
            ent = float(-(w * np.log(np.clip(w, 1e-30, None))).sum() / np.log(len(w)))
            row = {"sample": r.sample, "layer": r.layer, "word": word, "kind": kind, "norm_entropy": ent,
                   "object_mass": float(w[po == t].sum()), "area_share": float((po == t).mean()),
                   "background_mass": float(w[po < 0].sum())}
            if kind == "position" and word in halves:
                row["half_selectivity"] = float(w[halves[word]].sum() / max(w[halves[opposite[word]]].sum(), 1e-12))
            out.append(row)
    return pd.DataFrame(out)


def cls_focus(records, masks_by_sample: dict, grid, grid_tokens) -> pd.DataFrame:
    """Dual tower (A4): one row per (sample, vision layer): the class token's attention mass on the object patches
    (all objects the caption names) and the objects' area share (what uniform attention would give them)."""
    from ..world.scenes import patch_grid_masks

    rows = []
    for r in records:
        if r.part != "vision":
            continue
        po = patch_grid_masks(masks_by_sample[r.sample], grid)
        w = r.probs.float().mean(0)[0, torch.as_tensor(grid_tokens)].numpy()  # class-token row over the grid
        w = w / max(w.sum(), 1e-12)
        rows.append({"sample": r.sample, "layer": r.layer, "object_mass": float(w[po >= 0].sum()),
                     "area_share": float((po >= 0).mean())})
    out = pd.DataFrame(rows)
    out["focus"] = out.object_mass / out.area_share
    return out


def generated_share(result, sample_id: str, n_tokens: int) -> np.ndarray:
    """``[n_tokens, L]``: the image share (mean over heads) of the query row that produced each generated token,
    per captured layer, from :func:`~unicache_lib.capture.decode.decode_with_capture` records."""
    from ..capture.decode import producing_rows

    layers = sorted({r.layer for r in result.records if r.part == "language"})
    return np.stack([producing_rows(result, sample_id, n_tokens, li).float().mean(-1).numpy() for li in layers], -1)


def lag1(series: list[np.ndarray]) -> float:
    """Pooled lag-1 correlation of per-token values after removing each token position's mean over the series
    (so a shared rise or fall along the sequence is not read as suppression)."""
    L = max(len(s) for s in series)
    M = np.full((len(series), L), np.nan)
    for i, s in enumerate(series):
        M[i, : len(s)] = s
    dev = M - np.nanmean(M, 0, keepdims=True)
    a, b = dev[:, :-1].ravel(), dev[:, 1:].ravel()
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 3 or a[ok].std() == 0 or b[ok].std() == 0:
        return float("nan")
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def caption_errors(tokens: list[str], scene) -> np.ndarray:
    """Per caption token: is it a colour, shape or position word that no object of the scene has (a named attribute
    that is not in the picture)? Other words are never errors."""
    from ..world.scenes import COLOURS, POSITIONS, SHAPES

    have = {"colour": {o.colour for o in scene.objects}, "shape": {o.shape for o in scene.objects},
            "position": {o.position for o in scene.objects}}
    vocab = {"colour": set(COLOURS), "shape": set(SHAPES), "position": set(POSITIONS)}
    out = []
    for w in tokens:
        kind = next((k for k, v in vocab.items() if w in v), None)
        out.append(bool(kind is not None and w not in have[kind]))
    return np.array(out, bool)


def phrase_errors(tokens: list[str], scene) -> np.ndarray:
    """Per caption token: does it belong to a ``colour shape position`` phrase (captions list objects as such phrases
    separated by ``,``) that names no object of the scene? A wrong binding counts (``red square`` where the scene has
    a red circle and a blue square), and so does every attribute :func:`caption_errors` flags; commas are never
    errors. ``[len(tokens)]`` bool."""
    objects = {(o.colour, o.shape, o.position) for o in scene.objects}
    out = np.zeros(len(tokens), bool)
    start = 0
    for i in range(len(tokens) + 1):
        if i == len(tokens) or tokens[i] == ",":
            if i > start and tuple(tokens[start:i]) not in objects:
                out[start:i] = True
            start = i + 1
    return out


def hard_caption_scenes(n: int, seed: int = 0, size: int = 64) -> list:
    """``n`` scenes on which the shipped captioners make errors (A6 needs some): four objects each, cluttered and
    overlapping scenes alternating (the standard set has 1-4 objects and is captioned ~98% exactly)."""
    from ..world.scenes import make_scene

    if n < 1:
        raise ValueError(f"n must be >= 1 scenes, got {n}")
    rng = np.random.default_rng(seed)
    return [make_scene(rng, ("clutter", "overlap")[i % 2], size, n_objects=4) for i in range(n)]
