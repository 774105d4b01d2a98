"""What an explorer draws from, as it travels: the captured maps cut into the pieces the views need, quantised to one
byte a value, with the labels and shapes in a JSON ``spec`` and the numbers in one binary ``blob``.

Pieces, per panel (one model's sample), frame (a layer, or a (step, layer)) and head:

- ``t2i``: each word's row over the image keys (the word reading the picture), in multiples of the uniform weight
  (the row times the number of keys it can see), one byte a cell with a float32 scale per row (the row's maximum);
- ``i2t``: each word's column over the image queries (the picture reading the word), the same units, the words that
  some image query can see only (a causal model's image tokens cannot see the words after them);
- ``full``: the whole map, block-averaged to at most ``full_side`` cells a side, log-quantised (byte 0: weight 0,
  1..255: log10 of the weight between the map's own ``lo`` and ``hi``, float32), the lower triangle only when
  every map of the panel is causal;
- the picture, at most :data:`IMAGE_SIDE` pixels a side, as PNG or JPEG (whichever is smaller).

The size of all that is known from the shapes alone (:func:`plan`), so an explorer over its budget is refused before
a single map is quantised, naming the parameter to lower. :func:`build` then fills the blob."""
from __future__ import annotations

import functools
import io
import json
import math
import re
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np

from ..analysis.token_classes import content_position
from ..capture.record import CaptureResult, Record
from ..core.errors import AttentionValueError, InputError
from ..plots import _image_block, quoted

BUDGET_BYTES = 2_000_000  # one explorer's HTML form, all in: the spec's JSON, the blob in base64, the module, the markup
FORM_OVERHEAD = 4_000  # bytes of the HTML form besides the spec, the blob and the module (markup, start-up script)
MIN_FULL_SIDE = 16  # the full map is not shrunk below this many cells a side to fit the budget: refused instead
IMAGE_SIDE = 256  # the picture's longest side in the payload (pixels)
LOG_DECADES = 6  # the log quantisation of a full map spans at most this many powers of ten below its maximum
VIEWS = {"t2i": "the word reading the picture", "i2t": "the picture reading the word", "full": "the whole map"}


JS_PATH = Path(__file__).with_name("explorer.js")


@functools.lru_cache(maxsize=1)
def module_source() -> str:
    """The explorer's ES module (explorer.js, shipped with the package)."""
    return JS_PATH.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------- records -> panels


def index_records(recs: list[Record], fields: tuple[str, ...], what: str) -> tuple[dict, list[list]]:
    """``{(field values): record}`` over ``recs`` and the captured values of each field (samples in capture order,
    the rest sorted); raises InputError naming the first missing combination, so no slider reaches a record that is
    not there."""
    by = {tuple(getattr(r, f) for f in fields): r for r in recs}
    axes = [list(dict.fromkeys(k[0] for k in by))] + [sorted({k[i] for k in by}) for i in range(1, len(fields))]
    if (missing := [k for k in product(*axes) if k not in by]):
        raise InputError(f"{what}: no record for {dict(zip(fields, missing[0]))} ({len(missing)} of "
                         f"{len(by) + len(missing)} combinations missing); every sample needs the same "
                         f"{' and '.join(f + 's' for f in fields[1:])}: capture them all alike, or pass only "
                         f"the complete samples (CaptureResult.from_records([...]))")
    return by, axes


def _indexed(recs: list[Record], fields: tuple[str, ...], images: dict, tokens: dict, what: str):
    """``(recs, by, *axes)`` of :func:`index_records`, ``images`` and ``tokens`` checked to cover every sample (when
    the explorer is built, not when a slider moves)."""
    by, axes = index_records(recs, fields, what)
    for name, m in (("images", images), ("tokens", tokens)):
        if (gone := [k for k in axes[0] if k not in (m or {})]):
            raise InputError(f"{what}: {name} has no entry for sample {gone[0]!r}: pass {name} for every sample")
    return (recs, by, *axes)


def full_maps(result: CaptureResult, images: dict, tokens: dict, what: str):
    """``(records, (sample, layer) -> record, samples, layers)`` of the full-mode records of ``result``'s part (or the
    first part holding maps), ``images`` and ``tokens`` checked to cover every sample."""
    if not (recs := [r for r in result.records if "probs" in r.data]):
        raise InputError(f"{what} needs full-mode records (capture with mode='full')")
    part = result.part if result.part in {r.part for r in recs} else recs[0].part
    return _indexed([r for r in recs if r.part == part], ("sample", "layer"), images, tokens, what)


def step_maps(result: CaptureResult, images: dict, tokens: dict, part: str | None, what: str):
    """``(records, (sample, layer, step) -> record, samples, layers, steps)`` of the full-mode records with text keys
    of ``part`` (default: the first part holding them), ``images`` and ``tokens`` checked to cover every sample."""
    if not (recs := [r for r in result.records if "probs" in r.data and r.meta.get("n_text", 0) > 0
                     and (part is None or r.part == part)]):
        raise InputError(f"{what} needs full-mode records with text keys (DiffusionCapture(mode='full'))")
    return _indexed([r for r in recs if r.part == recs[0].part], ("sample", "layer", "step"), images, tokens, what)


def _chosen(found: tuple, picks: tuple, what: str) -> tuple:
    """``(by, samples, layers[, steps])`` of ``found`` (:func:`full_maps` / :func:`step_maps`): the records' one head
    count checked (one for all), each axis cut to its pick in ``picks`` (samples, layers[, steps]; :func:`_pick`)."""
    recs, by, *axes = found
    if len(heads := {int(r.probs.shape[0]) for r in recs}) != 1:
        raise InputError(f"{what}: records with different head counts {sorted(heads)}: pass one part's records")
    return (by, *(_pick(a, c, n, what) for a, c, n in zip(axes, picks, ("sample", "layer", "step"))))


def _pick(values: list, chosen, name: str, what: str) -> list:
    """``values`` restricted to ``chosen`` (in ``values``' order); None keeps all. Unknown values are refused."""
    if chosen is None:
        return list(values)
    chosen = list(chosen)
    if (bad := [c for c in chosen if c not in values]):
        raise InputError(f"{what}: {name} {bad[0]!r} was not captured (captured: {values})")
    if not chosen:
        raise InputError(f"{what}: {name} is empty: pass at least one, or None for all")
    return [v for v in values if v in chosen]


def _maps(t) -> np.ndarray:
    """A record's ``probs`` as a float32 numpy array (a view of a float32 CPU tensor, no copy)."""
    # (.float() of a float32 tensor is the tensor itself)
    return t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t, np.float32)


def _probabilities(m: np.ndarray, where: str) -> np.ndarray:
    """``m`` when it holds attention probabilities: finite, >= 0, each query row summing to at most 1 (a strided
    capture keeps some keys, so a row may sum to less); else :class:`AttentionValueError` naming ``where``, never a
    picture of NaN or of numbers that are not shares."""

    if not np.isfinite(m).all():
        bad = float(np.mean(~np.isfinite(m)))
        raise AttentionValueError(f"{where}: {bad:.0%} of the attention values are NaN or infinite (a capture that "
                                  f"overflowed, e.g. in float16): recapture it in float32; nothing is drawn from it")
    if m.size and float(m.min()) < -1e-6:
        raise AttentionValueError(f"{where}: attention values down to {float(m.min()):.3g}: these are not "
                                  f"probabilities (scores before the softmax?); pass the softmax's output")
    rows = m.sum(-1) if m.ndim else m
    if m.size and float(rows.max()) > 1.01:  # (float16 softmax rows sum to 1 within a few 1e-3)
        raise AttentionValueError(f"{where}: a query's attention sums to {float(rows.max()):.3g}, more than 1: these "
                                  f"are not one softmax's probabilities (summed over heads or layers?); pass each "
                                  f"head's softmax output")
    return m


@dataclass
class Panel:
    """One model's sample: its frames (``maps[f]`` is ``[H, Sq, Sk]``, frames row-major over ``axes``) and where the
    words and the picture are in them."""

    sample: str
    note_name: str  # "question" / "prompt"
    note: str | None
    words: list[str]  # word labels (quoted position and token)
    open_word: int
    axes: list[tuple[str, list]]  # [("layer", [0, 1, 2])] or [("step", [...]), ("layer", [...])]
    maps: list  # per frame: [H, Sq, Sk] float32
    image: np.ndarray
    grid: tuple[int, int]
    img_cols: np.ndarray  # image keys in grid order (t2i cells)
    t2i_rows: np.ndarray | None  # the words' query rows
    img_rows: np.ndarray | None  # image queries in grid order (i2t cells)
    i2t_cols: np.ndarray | None  # the words' key columns
    i2t_words: list[int] = field(default_factory=list)  # which words have an i2t column (some image query sees them)
    t2i_blind: list[int] = field(default_factory=list)  # words that see no image key (before the picture, causal)
    vis: np.ndarray | None = None  # [Sq] keys each query row can see
    causal: bool = False
    key_band: tuple[int, int] | None = None  # the image keys, when one block
    query_band: tuple[int, int] | None = None  # the image queries, when one block
    part: str = "language"
    kind: str = "attention"  # or "steps"

    @property
    def heads(self) -> int:
        return int(self.maps[0].shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(x) for x in self.maps[0].shape[1:])


def _grid_cells(n: int, grid, grid_tokens, what: str, sample) -> tuple[tuple[int, int], np.ndarray]:
    """``((rows, cols), cells)``: ``cells`` index the ``n`` image tokens in grid order (``grid_tokens``, or all)."""
    cells = np.arange(n) if grid_tokens is None else np.asarray(grid_tokens, np.int64).ravel()
    if len(cells) and (cells.min() < 0 or cells.max() >= n):
        raise InputError(f"{what}: grid_tokens of sample {sample!r} index outside its {n} image tokens")
    if grid is None:
        g = int(round(len(cells) ** 0.5))
        if g * g != len(cells):
            raise InputError(f"{what}: the {len(cells)} image tokens of sample {sample!r} do not form a square grid: "
                             f"pass grids={{sample: ((rows, cols), grid_tokens)}}")
        grid = (g, g)
    rows, cols = (int(x) for x in grid)
    if rows * cols != len(cells):
        raise InputError(f"{what}: {len(cells)} image tokens of sample {sample!r} for a {rows} x {cols} grid")
    return (rows, cols), cells


def _visible(v: np.ndarray | None, sq: int, sk: int, causal: bool) -> np.ndarray:
    """Keys each query row can see: the record's mask ``v`` when it kept one, else all but the future (causal) or
    all."""
    return (np.maximum(v.sum(1), 1).astype(np.float32) if v is not None and v.shape == (sq, sk)
            else np.arange(1, sq + 1, dtype=np.float32) if causal and sq == sk else np.full(sq, float(sk), np.float32))


def _is_causal(maps: list) -> bool:
    """Every map square and nothing above its diagonal (a causal mask): then only the lower triangle travels."""
    return all(P.shape[-1] == P.shape[-2] >= 2 and not np.triu(P, 1).any() for P in maps)


def attention_panels(result, images, tokens, grids=None, questions=None, *, samples=None, layers=None,
                     what="attention_explorer") -> list[Panel]:
    """The panels of an understanding model's full-mode capture, one per sample (``samples``: a subset; ``layers``:
    a subset of the captured layers)."""
    by, chosen, lays = _chosen(full_maps(result, images, tokens, what), (samples, layers), what)
    panels = []
    for s in chosen:
        r0 = by[s, lays[0]]
        if r0.query_stride > 1 or r0.key_stride > 1:
            raise InputError(f"{what}: the maps of sample {s!r} are thinned (query_stride {r0.query_stride}): capture "
                             f"them with query_stride=1")
        maps = [_probabilities(_maps(by[s, lay].probs), f"{what}: sample {s!r}, layer {lay}") for lay in lays]
        H, sq, sk = maps[0].shape
        toks = list(tokens[s])
        grid, cells = (grids or {}).get(s, (None, None))
        if r0.part == "cross":  # text queries x vision keys
            positions = list(range(sq))
            if len(toks) != sq:
                raise InputError(f"{what}: sample {s!r} has {len(toks)} tokens for {sq} text positions: give one per "
                                 f"position, tokenizer.convert_ids_to_tokens of the captured input_ids")
            grid, cells = _grid_cells(sk, grid, cells, what, s)
            img_cols, img_rows, i2t_cols = cells, None, None
            t2i_rows = np.asarray(positions)
            key_band, query_band = (0, sk), None
        else:
            if r0.spans is None:
                raise InputError(f"{what}: the records of sample {s!r} have no spans (which positions are the image)")
            r0.spans.check(sk)
            img = r0.spans.image_index
            positions = [int(i) for i in r0.spans.text_index]
            at = set(img.tolist())
            marks = [toks[i] for i in at if i < len(toks)]
            mark = max(marks, key=marks.count, default=None)  # the image token, where one label repeats there
            bad = [p for p in range(min(len(toks), sk)) if (toks[p] == mark) != (p in at)] if marks.count(mark) > 1 else []
            if len(toks) != sk or bad:
                raise InputError(f"{what}: sample {s!r} has {len(toks)} tokens for a sequence of {sk}" + (
                    f", and position {bad[0]} holds {toks[bad[0]]!r} where the image positions ({img[0]}..{img[-1]}) "
                    f"hold {mark!r} and no other does (shifted)" if len(toks) == sk else "") + ": give one token per "
                    f"position, tokenizer.convert_ids_to_tokens of the captured input_ids (a doubled '<s>' adds one)")
            grid, cells = _grid_cells(len(img), grid, cells, what, s)
            img_cols = img_rows = img[cells]
            t2i_rows = i2t_cols = np.asarray(positions)
            key_band = query_band = _image_block(r0.spans, sk)  # (None unless one block)
        causal = _is_causal(maps)
        v = np.asarray(_maps(r0.data["visible"]) > 0.5) if "visible" in r0.data else None
        seen = (np.zeros(0, bool) if i2t_cols is None else v[np.ix_(img_rows, i2t_cols)].any(0) if v is not None
                else i2t_cols <= img_rows.max() if causal else np.ones(len(i2t_cols), bool))
        blind = (~v[np.ix_(t2i_rows, img_cols)].any(1) if v is not None
                 else t2i_rows < np.min(img_cols) if causal else np.zeros(0, bool))
        q = (questions or {}).get(s)
        panels.append(Panel(
            sample=str(s), note_name="question", note=None if q is None else str(q),
            words=[quoted(p, toks[p]) for p in positions], open_word=positions.index(content_position(toks, positions)),
            axes=[("layer", list(lays))], maps=maps, image=images[s], grid=grid, img_cols=np.asarray(img_cols),
            t2i_rows=t2i_rows, img_rows=None if img_rows is None else np.asarray(img_rows),
            i2t_cols=i2t_cols, i2t_words=[int(i) for i in np.flatnonzero(seen)],
            t2i_blind=[int(i) for i in np.flatnonzero(blind)], vis=_visible(v, sq, sk, causal), causal=causal,
            key_band=key_band, query_band=query_band, part=r0.part, kind="attention"))
    return panels


def step_panels(result, images, tokens, part=None, *, samples=None, layers=None, steps=None,
                what="step_explorer") -> list[Panel]:
    """The panels of a generator's full-mode capture, one per prompt, frames over (step, layer)."""
    by, chosen, lays, stps = _chosen(step_maps(result, images, tokens, part, what), (samples, layers, steps), what)
    panels = []
    for s in chosen:
        r0 = by[s, lays[0], stps[0]]
        if r0.query_stride > 1 or r0.key_stride > 1:
            raise InputError(f"{what}: the maps of prompt {s!r} are thinned (query_stride {r0.query_stride}): the "
                             f"picture reading a word needs every image query; capture with query_stride=1")
        maps = [_probabilities(_maps(by[s, lay, st].probs), f"{what}: sample {s!r}, layer {lay}, step {st}")
                for st in stps for lay in lays]
        H, sq, sk = maps[0].shape
        n_img, n_text = int(r0.meta["n_image"]), int(r0.meta["n_text"])
        if not (toks := list(tokens[s])):
            raise InputError(f"{what}: prompt {s!r} has no tokens")
        if len(toks) > n_text or len(toks) != r0.meta.get("n_text_real", len(toks)) or toks != r0.meta.get("tokens",
                                                                                                          toks):
            raise InputError(f"{what}: prompt {s!r} has {len(toks)} tokens {toks[:3]}... but its maps {n_text} text "
                             f"keys, {r0.meta.get('n_text_real', n_text)} of them real"
                             + (", captured as %s..." % r0.meta["tokens"][:3] if "tokens" in r0.meta else "") +
                             ": give one token per real text key, the tokens capture_generation returned (its "
                             ".tokens; a doubled '<s>' adds one)")  # SN16's check, for prompts
        joint = r0.part == "joint"
        text_first = joint and r0.meta.get("token_order", "image|text").startswith("text")
        img0, txt0 = (n_text, 0) if text_first else (0, n_img)  # first image / text row and column
        grid, cells = _grid_cells(n_img, None, None, what, s)
        words = list(range(len(toks)))
        if (pos := r0.meta.get("text_positions")) is None and r0.meta.get("n_text_real", n_text) < n_text:
            raise InputError(f"{what}: prompt {s!r}'s records do not say which of their {n_text} text keys hold its "
                             f"{len(toks)} real tokens (captured before they did; SD3 puts T5's after CLIP's padding): "
                             f"capture it again")
        pos = np.asarray(words if pos is None else pos)  # the text key of each word
        if joint:
            if sq != n_img + n_text or sk != n_img + n_text:
                raise InputError(f"{what}: prompt {s!r}: a joint map of {sq} x {sk} for {n_img} image and {n_text} "
                                 f"text tokens")
            img_rows = img_cols = img0 + cells
            t2i_rows = i2t_cols = txt0 + pos
            key_band = query_band = (img0, img0 + n_img)
        else:  # cross: image queries x text keys
            if sq != n_img or sk != n_text:
                raise InputError(f"{what}: prompt {s!r}: a cross map of {sq} x {sk} for {n_img} image queries and "
                                 f"{n_text} text keys")
            img_rows, img_cols, t2i_rows, i2t_cols = cells, None, None, pos
            key_band, query_band = None, (0, n_img)
        prompt = r0.meta.get("prompt")
        panels.append(Panel(
            sample=str(s), note_name="prompt", note=None if prompt is None else str(prompt),
            words=[quoted(w, toks[w]) for w in words], open_word=0,
            axes=[("step", list(stps)), ("layer", list(lays))], maps=maps, image=images[s], grid=grid,
            img_cols=np.asarray(img_cols) if img_cols is not None else np.zeros(0, np.int64),
            t2i_rows=t2i_rows, img_rows=np.asarray(img_rows), i2t_cols=i2t_cols, i2t_words=list(words),
            vis=np.full(sq, float(sk), np.float32), causal=False, key_band=key_band, query_band=query_band,
            part=r0.part, kind="steps"))
    return panels


# ----------------------------------------------------------------------------------------------- the views, exactly


def view_values(panel: Panel, view: str, frame: int, head: int, word: int) -> np.ndarray | None:
    """The exact numbers a view shows: ``t2i`` / ``i2t`` a ``[rows, cols]`` grid in multiples of the uniform weight,
    ``full`` the ``[Sq, Sk]`` map; None where the view has nothing for this word (``t2i`` of a word that sees no image
    key, ``i2t`` of a word no image query sees: a causal mask); ``head == heads``: the mean of the heads."""
    P = panel.maps[frame]
    P = P.mean(0) if head >= P.shape[0] else P[head]
    if view == "t2i":
        if word in panel.t2i_blind:
            return None
        row = int(panel.t2i_rows[word])
        return (P[row, panel.img_cols] * panel.vis[row]).reshape(panel.grid).astype(np.float32)
    if view == "i2t":
        if word not in panel.i2t_words:
            return None
        col = int(panel.i2t_cols[word])
        return (P[panel.img_rows, col] * panel.vis[panel.img_rows]).reshape(panel.grid).astype(np.float32)
    if view == "full":
        return np.asarray(P, np.float32)
    raise InputError(f"no view {view!r}: one of {sorted(VIEWS)}")


def panel_views(panel: Panel) -> list[str]:
    return [v for v, ok in (("t2i", panel.t2i_rows is not None and len(panel.img_cols) > 0),
                            ("i2t", panel.i2t_cols is not None and panel.img_rows is not None),
                            ("full", True)) if ok]


# ----------------------------------------------------------------------------------------------- plan and size


FLOAT_SLACK = 0.05  # how far past 0..1 a float picture may overshoot and still be read as 0..1 (then clipped)


def encode_image(image, side: int = IMAGE_SIDE) -> tuple[bytes, str, int, int]:
    """``(bytes, mime, width, height)`` of ``image [H, W, 3]`` (uint8, or floats in 0..1) at most ``side`` pixels a
    side: PNG or JPEG, whichever is smaller."""
    from PIL import Image  # local: PIL is needed only when a picture is encoded

    a = np.asarray(image.detach().cpu().numpy() if hasattr(image, "detach") else image)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[2] not in (1, 3, 4):  # channels first, as a tensor holds it
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or a.size == 0 or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise InputError(f"an explorer's picture must be [H, W, 3] (or [H, W]); got shape {a.shape}")
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise InputError(f"an explorer's picture must be uint8, uint16 or floats in 0..1; got {a.dtype}")
    if a.dtype == np.uint16:  # 16-bit: 65535 is white (it used to be clipped at 255: mid-grey drawn white)
        a = (a.astype(np.uint32) // 257).astype(np.uint8)
    elif np.issubdtype(a.dtype, np.integer) and a.dtype != np.uint8:
        if a.min() < 0 or a.max() > 255:
            raise InputError(f"an explorer's picture of {a.dtype} holds values {a.min()}..{a.max()}, outside 0..255: "
                             f"pass uint8 (0..255), uint16 or floats in 0..1")
        a = a.astype(np.uint8)
    elif a.dtype != np.uint8:
        if not np.isfinite(a).all():
            raise InputError(f"an explorer's picture holds NaN or infinite values ({float(np.mean(~np.isfinite(a))):.0%} "
                             f"of them): nothing would be drawn there; pass the picture itself (uint8, or floats in 0..1)")
        lo, hi = float(a.min()), float(a.max())
        # 0..1 (a resize's or de-normalisation's overshoot clipped) or 0..255 held as floats; between them neither
        # reading is safe: 1.3 is a bright 0..1 pixel or a black 0..255 one
        if not (lo >= -FLOAT_SLACK and hi <= 1 + FLOAT_SLACK or lo >= 0 and 2 <= hi <= 255):
            raise InputError(f"an explorer's picture of floats holds {lo:.3g}..{hi:.3g}: neither 0..1 nor 0..255, so "
                             f"it cannot be drawn without a guess; pass np.clip(picture, 0, 1) for a 0..1 picture (a "
                             f"normalised one: undo the normalisation first) or uint8 for 0..255")
        a = np.clip(a.astype(np.float64) * (255.0 if hi <= 1 + FLOAT_SLACK else 1.0), 0, 255).astype(np.uint8)
    im = Image.fromarray(a[..., :3] if a.ndim == 3 else a).convert("RGB")
    if max(im.size) > side:
        r = side / max(im.size)
        im = im.resize((max(1, round(im.size[0] * r)), max(1, round(im.size[1] * r))), Image.LANCZOS)
    encoded = []
    for fmt, mime, kw in (("PNG", "image/png", {"optimize": True}), ("JPEG", "image/jpeg", {"quality": 88})):
        buf = io.BytesIO()
        im.save(buf, fmt, **kw)
        encoded.append((buf.getvalue(), mime))
    data, mime = min(encoded, key=lambda e: len(e[0]))  # PNG on a tie
    return data, mime, im.size[0], im.size[1]


@dataclass
class Plan:
    """What the payload will hold and its size, known before any map is quantised."""

    k: dict  # model index -> pooling factor of its full maps
    spec: dict  # the JSON spec (offsets filled)
    images: list  # (offset, bytes) per picture
    blob_len: int
    spec_len: int

    @property
    def nbytes(self) -> int:
        """The explorer's HTML form: the spec's JSON, the blob in base64, the module and the markup around them."""
        return self.spec_len + 4 * math.ceil(self.blob_len / 3)  # the blob in base64


def spec_json(spec: dict) -> str:
    """The spec as JSON that is safe inside ``<script>`` (``<``, ``>``, ``&`` and the line separators escaped)."""
    s = json.dumps(spec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if (odd := re.search("[\ud800-\udfff]", s)):  # a lone surrogate: os.fsdecode of a file name that is not UTF-8
        raise InputError(f"a name in the explorer ({s[max(0, odd.start() - 40):odd.start()].encode('ascii', 'replace')!r}"
                         f"...) is not text (a lone surrogate, from a file name that is not UTF-8): rename it")
    return (s.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def size_words(models) -> str:
    """``"3 samples × 4 layers × 8 heads"``: what the explorer over ``models`` (label, panels) holds."""
    n, first = sum(len(ps) for _, ps in models), models[0][1][0]
    axes = " × ".join(f"{len(v)} {name}s" for name, v in first.axes)
    return f"{n} {'prompt' if first.kind == 'steps' else 'sample'}{'s' if n > 1 else ''} × {axes} × {first.heads} heads"


def make_plan(models: list[tuple[str, list[Panel]]], title: str, full_side, opening: dict) -> Plan:
    """Lay out the blob for ``models`` (label, panels) with the full maps pooled to at most ``full_side`` cells a side
    (None: not pooled); fills every offset of the spec. Encodes the pictures (small, once), quantises nothing."""
    off = 0
    images = []
    spec_models, ks = [], {}
    for mi, (label, panels) in enumerate(models):
        # the block size that brings the longest side of the model's maps to at most full_side cells (1: no pooling)
        ks[mi] = k = 1 if full_side is None else max(1, math.ceil(max(max(p.shape) for p in panels)
                                                                  / max(1, int(full_side))))
        spec_panels = []
        for p in panels:
            F, H, C = len(p.maps), p.heads, p.grid[0] * p.grid[1]
            views = panel_views(p)
            entry = {"sample": p.sample, "note_name": p.note_name, "note": p.note, "words": p.words,
                     "open_word": p.open_word, "axes": [{"name": n, "values": list(map(int, v))} for n, v in p.axes],
                     "heads": H, "grid": list(p.grid), "views": views, "part": p.part, "shape": list(p.shape),
                     "key_band": list(p.key_band) if p.key_band else None,
                     "query_band": list(p.query_band) if p.query_band else None, "causal": p.causal,
                     "rows": None if p.t2i_rows is None else [int(x) for x in p.t2i_rows],
                     "cols": None if p.i2t_cols is None else [int(x) for x in p.i2t_cols]}
            for v, nw in (("t2i", len(p.words)), ("i2t", len(p.i2t_words))):
                if v in views:
                    entry[v] = {"off": off, "soff": off + F * H * nw * C, "words": nw}
                    off += F * H * nw * (C + 4)
            entry["i2t_words"] = list(p.i2t_words) if "i2t" in views else []
            entry["t2i_blind"] = list(p.t2i_blind) if "t2i" in views else []
            n, m = (math.ceil(d / k) for d in p.shape)
            cells = n * (n + 1) // 2 if p.causal and n == m else n * m  # the lower triangle of a causal map
            entry["full"] = {"off": off, "soff": off + F * H * cells, "rows": n, "cols": m, "k": k,
                             "tri": bool(p.causal and n == m), "cells": cells}
            off += F * H * (cells + 8)
            if getattr(p, "_png", None) is None:  # the picture encoded once, kept on the panel for the next plan
                p._png = encode_image(p.image)
            data, mime, w, h = p._png
            entry["image"] = {"off": off, "len": len(data), "mime": mime, "width": w, "height": h}
            images.append((off, data))
            off += len(data)
            spec_panels.append(entry)
        spec_models.append({"label": label, "panels": spec_panels, "scale": {}})
    spec = {"version": 1, "title": title, "kind": models[0][1][0].kind, "models": spec_models,
            "view_names": VIEWS, "open": opening}
    # the colour scales are filled when the maps are read (:func:`build`): their JSON is a few numbers per model
    spec_len = (len(spec_json(spec).encode()) + 120 * len(models) + FORM_OVERHEAD + len(module_source().encode())
                + 6 * len(title.encode()))  # the title again, escaped, in the form's fallback line
    return Plan(ks, spec, images, off, spec_len)


def fit(models: list[tuple[str, list[Panel]]], title: str, full_side, budget_bytes: int, what: str,
        opening: dict, lower: str) -> Plan:
    """The plan within ``budget_bytes``: with ``full_side`` given, that one or a refusal naming ``full_side``; with
    None, the full maps at full size when they fit, else pooled to the largest side that fits (never below
    :data:`MIN_FULL_SIDE`); a refusal naming ``lower`` (the parameter that multiplies the size) otherwise."""
    budget_bytes = int(budget_bytes)
    shape = size_words(models)
    if full_side is not None:
        if int(full_side) < 1:
            raise InputError(f"{what}: full_side must be at least 1 cell, got {full_side}")
        plan = make_plan(models, title, int(full_side), opening)
        if plan.nbytes <= budget_bytes:
            return plan
        fits = next((s for s in _sides(models, int(full_side))
                     if make_plan(models, title, s, opening).nbytes <= budget_bytes), None)
        hint = f" ({fits} fits)" if fits else f" (none fits: pass fewer {lower})"
        raise InputError(f"{what}: {shape} make {plan.nbytes / 1e6:.3f} MB, over the budget of "
                         f"{budget_bytes / 1e6:.3f} MB: lower full_side (now {int(full_side)}){hint}")
    for side in [None, *_sides(models)]:  # the full maps at full size first, then pooled ever more
        plan = make_plan(models, title, side, opening)
        if plan.nbytes <= budget_bytes:
            return plan
    raise InputError(f"{what}: {shape} make {plan.nbytes / 1e6:.3f} MB even with the full maps at {MIN_FULL_SIDE} "
                     f"cells a side, over the budget of {budget_bytes / 1e6:.3f} MB: pass fewer {lower}")


def _sides(models, below: int | None = None) -> list[int]:
    """The full-map sides worth trying, largest first: each side at which some model's pooling factor changes, down
    to :data:`MIN_FULL_SIDE` (and below ``below`` when given)."""
    longest = [max(max(p.shape) for p in ps) for _, ps in models]
    sides = {side for n in longest for k in range(2, n + 1) if (side := math.ceil(n / k)) >= MIN_FULL_SIDE}
    return sorted((s for s in sides if below is None or s < below), reverse=True)


# ----------------------------------------------------------------------------------------------- quantise and fill


def quantise_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x [..., C] >= 0`` as bytes with one float32 scale (the maximum) per row: ``x ~ q / 255 * scale``."""
    x = np.maximum(np.asarray(x, np.float32), 0)
    s = x.max(-1).astype(np.float32)
    q = np.where(s[..., None] > 0, np.rint(x / np.where(s > 0, s, 1)[..., None] * 255), 0)
    return q.astype(np.uint8), s


def quantise_log(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x [..., N] >= 0`` as bytes on a log scale per map: 0 is weight 0, ``1 + round(254 * (log10 x - lo) / (hi -
    lo))`` the rest, with ``[lo, hi]`` (float32, per map) from the map's smallest positive weight (at most
    :data:`LOG_DECADES` below) to its largest."""
    x = np.asarray(x, np.float64)
    pos = x > 0
    with np.errstate(divide="ignore"):
        lg = np.where(pos, np.log10(np.where(pos, x, 1)), np.nan)
    hi = np.nanmax(np.where(pos, lg, -np.inf), axis=-1)
    lo = np.nanmin(np.where(pos, lg, np.inf), axis=-1)
    none = ~np.isfinite(hi)
    hi = np.where(none, 0.0, hi)
    lo = np.where(none, 0.0, np.maximum(lo, hi - LOG_DECADES))
    span = np.where(hi > lo, hi - lo, 1.0)
    q = np.where(pos, 1 + np.rint(254 * np.clip((lg - lo[..., None]) / span[..., None], 0, 1)), 0).astype(np.uint8)
    return q, np.stack([lo, hi], -1).astype(np.float32)


def pool(P: np.ndarray, k: int) -> np.ndarray:
    """``P [..., n, m]`` block-averaged over ``k x k`` blocks (the last blocks over what is left)."""
    if k == 1:
        return P
    n, m = P.shape[-2:]
    N, M = math.ceil(n / k), math.ceil(m / k)
    pad = np.zeros(P.shape[:-2] + (N * k, M * k), np.float64)
    pad[..., :n, :m] = P
    s = pad.reshape(P.shape[:-2] + (N, k, M, k)).sum((-3, -1))
    c = np.outer(np.minimum(k, n - k * np.arange(N)), np.minimum(k, m - k * np.arange(M)))  # cells in each block
    return (s / c).astype(np.float32)


def build(models: list[tuple[str, list[Panel]]], plan: Plan) -> tuple[dict, bytes]:
    """Quantise every panel's maps into the plan's blob; returns ``(spec, blob)`` with each model's colour scales (one
    per view: ``t2i`` / ``i2t`` from 0 to the largest value, at least 1 = even reading; ``full`` the log10 range)."""
    blob = bytearray(plan.blob_len)
    spec = plan.spec
    for mi, (label, panels) in enumerate(models):
        top = {"t2i": 1.0, "i2t": 1.0}
        lo_all, hi_all = np.inf, -np.inf
        for p, entry in zip(panels, spec["models"][mi]["panels"]):
            for v in ("t2i", "i2t"):
                if v not in entry:
                    continue
                # each frame's [H, Sq, Sk] -> [H, W, C], stacked: [F, H, W, C]
                if v == "t2i":
                    rows = p.t2i_rows[list(range(len(p.words)))]
                    x = np.stack([P[:, rows][:, :, p.img_cols] * p.vis[rows][None, :, None] for P in p.maps])
                else:
                    cols = p.i2t_cols[list(p.i2t_words)]
                    x = np.stack([np.transpose(P[:, p.img_rows][:, :, cols], (0, 2, 1)) * p.vis[p.img_rows][None, None, :]
                                  for P in p.maps])
                top[v] = max(top[v], float(x.max()) if x.size else 0.0)
                q, s = quantise_rows(x)
                o, so = entry[v]["off"], entry[v]["soff"]
                blob[o:o + q.size] = q.tobytes()
                blob[so:so + 4 * s.size] = s.astype("<f4").tobytes()
            f = entry["full"]
            Q = np.stack([pool(P, plan.k[mi]) for P in p.maps])  # [F, H, n, m]
            if f["tri"]:
                il = np.tril_indices(f["rows"])
                Q = Q[:, :, il[0], il[1]]
            else:
                Q = Q.reshape(Q.shape[0], Q.shape[1], -1)
            q, lohi = quantise_log(Q)
            blob[f["off"]:f["off"] + q.size] = q.tobytes()
            blob[f["soff"]:f["soff"] + 4 * lohi.size] = lohi.astype("<f4").tobytes()
            has = (q > 0).any(-1)
            if has.any():
                lo_all = min(lo_all, float(lohi[..., 0][has].min()))
                hi_all = max(hi_all, float(lohi[..., 1][has].max()))
        for off, data in plan.images:
            blob[off:off + len(data)] = data
        if not np.isfinite(hi_all):
            lo_all, hi_all = -1.0, 0.0
        lo_all = max(lo_all, hi_all - LOG_DECADES)
        spec["models"][mi]["scale"] = {"t2i": round(top["t2i"], 4), "i2t": round(top["i2t"], 4),
                                       "full": [round(lo_all, 4), round(hi_all, 4)]}
    return spec, bytes(blob)
