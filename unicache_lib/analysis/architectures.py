"""Measurements of notebook 08 that only the study's other architectures need (claims A1-A6).

Every function takes records captured by :class:`~unicache_lib.capture.AttentionCapture` (or the models
themselves, for the ablation and the decoding runs) and returns tidy tables whose rows are the units the
scoreboard resamples (samples, or (sample, token) pairs grouped by sample).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
import torch

from ..capture import AttentionCapture
from ..capture.decode import decode_with_capture, producing_rows
from ..capture.record import CaptureResult
from ..capture.runner import inputs_for
from ..capture.unified import generate_image_with_capture, signed_to_uint8
from ..core.errors import InputError
from ..core.hooks import forward_hooks
from ..core.modality import BLOCKS, IMAGE, TEXT
from ..core.scoring import FOCUSED, same_answer
from ..families import family_of
from ..world.scenes import COLOURS, POSITIONS, SHAPES, make_scene, patch_grid_masks
from ..world.segment import score_object
from ..world.text import CAPTION_QUESTION, POSITION_ORDER, caption
from .generation import stats_stride_of, step_table
from .layers import layer_band
from .understanding import cross_modal, head_table


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
        raise InputError(f"no records of part {part!r}")
    n = max(r.layer for r in recs) + 1
    rows = []
    for r in recs:
        d = r.data
        if "norm_entropy" not in d:
            raise InputError("reading_profile needs stats-mode records (norm_entropy, image_share)")
        ent = d["norm_entropy"].float()
        if r.spans is None and r.part != "cross":  # a tower without the other modality (CLIP): no split
            share, cm, e = float("nan"), float("nan"), float(torch.nanmean(ent))
        elif r.part == "cross":  # the rows that read the image (not NaN)
            share, cm, e = float("nan"), float("nan"), float(ent[:, ~torch.isnan(ent[0])].mean())
        else:
            if r.spans is None or "image_share" not in d:
                raise InputError(f"record {r.key} has no spans: capture with spans to split text from image")
            kinds = torch.as_tensor(r.spans.array)
            q = kinds[-ent.shape[1]:]
            # text rows that can see the image (a causal prefix before the image puts exactly 0 on it; a
            # bidirectional stream's text rows all see it)
            sees = torch.nan_to_num(d["image_share"].float()).amax(0) > 0
            text_rows = (q == TEXT) & sees
            share = float(torch.nanmean(d["image_share"].float()[:, text_rows])) if bool(text_rows.any()) else float("nan")
            e = float(torch.nanmean(ent[:, text_rows])) if bool(text_rows.any()) else float(torch.nanmean(ent))
            b = d["blocks"].float().mean(0) if "blocks" in d else None
            cm = float(cross_modal(b)) if b is not None else float("nan")
        rows.append({"model": model, "sample": r.sample, "layer": r.layer, "depth": r.layer / max(1, n - 1),
                     "band": layer_band(r.layer, n), "part": r.part, "text_image_share": share, "norm_entropy": e,
                     "cross_modal": cm})
    return pd.DataFrame(rows)


def generator_profile(records, model: str) -> pd.DataFrame:
    """:func:`reading_profile` for a generator's records (joint or cross attention, averaged over steps):
    ``text_image_share`` (joint: text queries' share on image keys; cross: NaN, the text is never a query),
    ``norm_entropy`` (joint: text query rows; cross: image queries over the text keys) and ``cross_modal``."""
    T = step_table([r for r in records if r.part in ("joint", "cross")])
    T["text_image_share"] = np.where(T.part == "joint", T.share_ti / (T.share_ti + T.share_tt), np.nan)
    T["norm_entropy"] = np.where(T.part == "joint", T.txt_entropy, T.text_entropy)
    T["cross_modal"] = np.where(T.part == "joint", T.share_it + T.share_ti, np.nan)
    g = T.groupby(["sample", "part", "layer"])[["text_image_share", "norm_entropy", "cross_modal"]].mean().reset_index()
    n = g.layer.max() + 1
    return g.assign(depth=g.layer / max(1, n - 1), band=[layer_band(int(li), n) for li in g.layer], model=model)


def head_roles(records, model: str, focused: float = FOCUSED, spread: float = 0.8) -> pd.DataFrame:
    """One row per (layer, head): its role over samples, from its mean max weight and normalised entropy:
    ``focused`` (a row's largest weight above ``focused`` on average), ``spread`` (normalised entropy above
    ``spread``) or ``mixed``."""
    records = list(records)
    stats_stride_of(records)  # exact and sampled records are not averaged together
    if records and "row_entropy" in records[0].data:  # a generator's records: its image queries, over the steps
        H = pd.DataFrame([{"layer": r.layer, "head": h, "max_weight": float(r.data["max_weight"][h, 0]),
                           "norm_entropy": float(r.data["row_entropy"][h, 0])} for r in records for h in range(r.heads)
                          if r.part in ("joint", "cross")])
    else:
        H = head_table(records)
    H = H.groupby(["layer", "head"])[["max_weight", "norm_entropy"]].mean().reset_index()
    return H.assign(role=np.where(H.max_weight > focused, "focused",
                                  np.where(H.norm_entropy > spread, "spread", "mixed")), model=model)


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
                     "cross_modal": float(cross_modal(b))})
    return pd.DataFrame(rows)


@contextmanager
def image_queries_blind_to_text(model, n_image: int, layers=None):
    """Inside the block, ViLT's image queries (the last ``n_image`` positions) cannot see the text keys: a
    pre-hook on every self-attention module (or those of ``layers``, layer indices) adds a 4-D mask with ``-inf``
    on (image row, text column). The text still reads the image. Hooks are removed on exit, also on error."""
    def cells(S):  # image rows (the last n_image) x text columns
        return (torch.arange(S)[:, None] >= S - n_image) & (torch.arange(S)[None, :] < S - n_image)

    with _blind(model, cells, layers, "image_queries_blind_to_text"):
        yield model


@contextmanager
def blind_cells(model, mask: torch.Tensor, layers=None):
    """Inside the block, ViLT's queries cannot read the keys where ``mask`` (bool ``[S, S]``, query rows x key
    columns, over the whole stream) is True, in every self-attention layer (or those of ``layers``); as
    :func:`image_queries_blind_to_text`, for any cells. A stream of another length than the mask's is refused."""
    mask = torch.as_tensor(mask, dtype=torch.bool)

    def cells(S):
        if tuple(mask.shape) != (S, S):
            raise InputError(f"blind_cells: the mask is {tuple(mask.shape)}, the stream {S} positions: give a [{S}, {S}] "
                             "mask (query rows x key columns)")
        return mask

    with _blind(model, cells, layers, "blind_cells"):
        yield model


@contextmanager
def _blind(model, cells, layers, what: str):
    """The hook behind :func:`image_queries_blind_to_text` and :func:`blind_cells`: ``cells(S)`` gives the bool
    ``[S, S]`` cells to mask (``-inf`` added to the attention mask) for a stream of ``S`` positions."""
    fam = family_of(model)
    if fam.name != "ViLT":  # other families pass their masks otherwise (kwargs, causal implied): a mask added here would
        raise InputError(f"{what} edits ViLT's additive attention mask; {fam.name} builds its masks "
                         f"otherwise and would attend over a mask this hook did not mean. Pass a ViLT model")
    sites = fam.sites(model, ("language",))
    if layers is not None:
        unknown = sorted(set(layers) - {x.layer for x in sites})
        if unknown:
            raise InputError(f"layers {unknown} are not self-attention layers of this model (it has "
                             f"{sorted(x.layer for x in sites)})")
        sites = [x for x in sites if x.layer in set(layers)]

    def pre(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        S = h.shape[1]
        m = torch.zeros(1, 1, S, S, dtype=h.dtype, device=h.device)
        m[..., cells(S).to(h.device)] = torch.finfo(h.dtype).min
        am = args[1] if len(args) > 1 else kwargs.get("attention_mask")
        m = m if am is None else am + m  # keep the padding mask ([B, 1, 1, S] broadcasts)
        if len(args) > 1:
            args = (args[0], m) + tuple(args[2:])
        else:
            kwargs = dict(kwargs, attention_mask=m)
        return args, kwargs

    with forward_hooks([(s.module, "forward_pre", pre) for s in sites]):
        yield model


def caption_word_rows(records, tokens: list[str], scene, grid_tokens, grid) -> pd.DataFrame:
    """Teacher-forced caption on a cross-attention VLM (A3): one row per (cross layer, caption content word) of
    one sample: the word's mass on its object's patches, on the background, its object's area share, and for
    position words the mass on the matching half / on the opposite half; ``norm_entropy`` of the word's row over the
    grid cells (renormalised; 1 = even).

    ``tokens``: the prompt + caption tokens (the caption is the text after the last ``:``); ``grid_tokens``:
    indices of the grid cells among the keys; ``grid``: (rows, cols)."""
    po = patch_grid_masks(scene.masks, grid)
    rows_g, cols_g = np.divmod(np.arange(len(po)), grid[1])
    halves = {"left": cols_g < grid[1] / 2, "right": cols_g >= grid[1] / 2, "top": rows_g < grid[0] / 2,
              "bottom": rows_g >= grid[0] / 2}
    opposite = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}
    start = max(i for i, t in enumerate(tokens) if t == ":") + 1
    # caption = "colour shape position , colour shape position ..." in reading order
    objs = sorted(range(len(scene.objects)), key=lambda i: POSITION_ORDER.index(scene.objects[i].position))
    out = []
    for r in records:
        P = r.probs.float().mean(0)  # [T, K]
        for j, word in enumerate(tokens[start:]):  # the caption
            k = j // 4  # the object this triple describes (",": 4th token)
            if k >= len(objs) or j % 4 == 3:
                continue
            t = objs[k]
            w = P[start + j][torch.as_tensor(grid_tokens)].numpy()  # the word's own row
            w = w / max(w.sum(), 1e-12)
            kind = ("colour", "shape", "position")[j % 4]
            row = {"sample": r.sample, "layer": r.layer, "word": word, "kind": kind,
                   "norm_entropy": float(-(w * np.log(np.clip(w, 1e-30, None))).sum() / np.log(len(w))),
                   "object_mass": float(w[po == t].sum()), "area_share": float((po == t).mean()),
                   "background_mass": float(w[po < 0].sum())}
            if kind == "position" and word in halves:
                row["half_selectivity"] = float(w[halves[word]].sum() / max(w[halves[opposite[word]]].sum(), 1e-12))
            out.append(row)
    return pd.DataFrame(out)


def cls_focus(records, masks_by_sample: dict, grid, grid_tokens) -> pd.DataFrame:
    """Dual tower (A4): one row per (sample, vision layer): the class token's attention mass on the object patches
    (all objects the caption names) and the objects' area share (what uniform attention would give them)."""
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
    return out.assign(focus=out.object_mass / out.area_share)


def generated_share(result, sample_id: str, n_tokens: int) -> np.ndarray:
    """``[n_tokens, L]``: the image share (mean over heads) of the query row that produced each generated token,
    per captured layer, from :func:`~unicache_lib.capture.decode.decode_with_capture` records."""
    return np.stack([producing_rows(result, sample_id, n_tokens, li).float().mean(-1).numpy()
                     for li in sorted({r.layer for r in result.records if r.part == "language"})], -1)


def lag1(series: list[np.ndarray]) -> float:
    """Pooled lag-1 correlation of per-token values after removing each token position's mean over the series
    (so a shared rise or fall along the sequence is not read as suppression)."""
    M = np.full((len(series), max(len(s) for s in series)), np.nan)
    for i, s in enumerate(series):
        M[i, : len(s)] = s
    dev = M - np.nanmean(M, 0, keepdims=True)
    a, b = dev[:, :-1].ravel(), dev[:, 1:].ravel()
    ok = ~(np.isnan(a) | np.isnan(b))
    return float("nan") if ok.sum() < 3 or a[ok].std() == 0 or b[ok].std() == 0 else \
        float(np.corrcoef(a[ok], b[ok])[0, 1])


def caption_errors(tokens: list[str], scene) -> np.ndarray:
    """Per caption token: is it a colour, shape or position word that no object of the scene has (a named attribute
    that is not in the picture)? Other words are never errors."""
    have = {"colour": {o.colour for o in scene.objects}, "shape": {o.shape for o in scene.objects},
            "position": {o.position for o in scene.objects}}
    kind = {w: k for k, words in (("position", POSITIONS), ("shape", SHAPES), ("colour", COLOURS)) for w in words}
    return np.array([w in kind and w not in have[kind[w]] for w in tokens], bool)


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
    if n < 1:
        raise InputError(f"n must be >= 1 scenes, got {n}")
    rng = np.random.default_rng(seed)
    return [make_scene(rng, ("clutter", "overlap")[i % 2], size, n_objects=4) for i in range(n)]


# --- the runs behind notebook 08's sections: each a model run with capture, returning the table it measures ---

def capture_both_towers(model, processor, samples, mode: str = "stats", part: str = "all"):
    """A dual tower (CLIP) on each sample's image and its caption, one forward per sample (the towers never read
    each other, so a batch would only mix padding in); a :class:`~unicache_lib.capture.record.CaptureResult`."""
    if family_of(model).name != "CLIP":  # one forward of image and caption is only "both towers" for a dual tower
        raise InputError(f"capture_both_towers runs a dual-tower model (CLIP) on image and caption; "
                         f"{family_of(model).name} reads them in one model. Capture it with capture.runner.capture_samples")
    res = CaptureResult()
    for s in samples:
        inp = {k: v.to(model.device) for k, v in processor(text=[s.caption], images=[s.image], return_tensors="pt").items()}
        with torch.no_grad(), AttentionCapture(model, mode, part=part, sample_ids=[s.id]) as cap:
            model(**inp)
        res.records += cap.result.records
    return res


@torch.no_grad()
def fusion_correct(model, processor, questions, blind: bool = False, batch: int = 100, layers=None) -> np.ndarray:
    """A fusion encoder (ViLT) answering held-out ``questions`` (``heldout_set`` items): ``[n]`` 1.0 where the top
    answer is right; ``blind``: every image query's attention on text keys masked, in every layer or in ``layers``
    (:func:`image_queries_blind_to_text`). Patches go in grid order, so runs repeat exactly."""
    fam, ok = family_of(model), []
    if fam.name != "ViLT":  # answers come from a classifier over id2label, the processor takes images and text at once
        raise InputError(f"fusion_correct scores a ViLT-style fusion encoder's classifier answers; {fam.name} answers by "
                         f"generating text. Pass a ViLT model (for a decoder VLM: unicache_lib.capture.runner.answer_logits)")
    for i in range(0, len(questions), batch):
        part = questions[i: i + batch]
        inp = processor(images=[q.scene.uint8() for q in part], text=[q.question for q in part], return_tensors="pt",
                        padding=True)
        inp = {k: v.to(model.device) for k, v in inp.items()}
        inp = fam.canonical_inputs(model, inp)
        with (image_queries_blind_to_text(model, n_image=fam.n_image(model.config, inp), layers=layers) if blind
              else nullcontext()):
            logits = model(**inp).logits
        ok += [same_answer(model.config.id2label[int(j)], q.answer) for j, q in zip(logits.argmax(-1), part)]
    return np.array(ok, float)


def cross_caption_rows(model, processor, scenes) -> pd.DataFrame:
    """A cross-attention VLM (Mllama) reading teacher-forced true captions of ``scenes``: :func:`caption_word_rows`
    for every caption, with ``level`` (low / middle / top when there are three cross layers, else ``cross k``) and
    ``object_focus`` (object mass / area share) added; ``sample`` is ``c{i}``."""
    fam, rows = family_of(model), []
    for i, sc in enumerate(scenes):
        inputs = inputs_for(model, processor, sc.uint8(), None, prompt=f"{fam.prompt(processor, CAPTION_QUESTION)} {caption(sc)}")
        with torch.no_grad(), AttentionCapture(model, "full", part="cross", sample_ids=[f"c{i}"]) as cap:
            model(**inputs)
        toks = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
        rows.append(caption_word_rows(cap.result.records, toks, sc, fam.grid_tokens(model.config, inputs),
                                      fam.image_grid(model.config, inputs)))
    CW = pd.concat(rows, ignore_index=True)
    layers = sorted(CW.layer.unique())
    names = ("low", "middle", "top") if len(layers) == 3 else [f"cross {k}" for k in range(len(layers))]
    return CW.assign(level=CW.layer.map(dict(zip(layers, names))), object_focus=CW.object_mass / CW.area_share)


def task_switch(model, processor, questions, max_new_tokens: int = 16):
    """A unified model (Janus) on the images of ``questions``: describe each (``CAPTION_QUESTION``, up to
    ``max_new_tokens``) and answer its question (one token). Returns ``(describe [n], answer [n], series)``: per
    image the mean image share of the caption's tokens and of the answer token, and each caption's per-token image
    share ``[tokens]`` (mean over layers). An image whose caption comes out empty is left out of both tasks."""
    describe, answer, series = [], [], []
    for i, q in enumerate(questions):
        toks, res = decode_with_capture(model, processor, q.scene.uint8(), CAPTION_QUESTION, sample_id=f"d{i}",
                                        max_new_tokens=max_new_tokens)
        if not toks:
            continue
        sh = generated_share(res, f"d{i}", len(toks)).mean(-1)
        describe.append(float(sh.mean()))
        series.append(sh)
        _, ares = decode_with_capture(model, processor, q.scene.uint8(), q.question, sample_id=f"a{i}", max_new_tokens=1)
        answer.append(float(generated_share(ares, f"a{i}", 1).mean()))
    return np.array(describe), np.array(answer), series


def caption_thirds(model, processor, scenes, max_new_tokens: int = 16) -> pd.DataFrame:
    """Captions of ``scenes`` (e.g. :func:`hard_caption_scenes`) cut in thirds: one row per (caption, third) with
    the third's mean image share and whether it holds an error (:func:`phrase_errors`); the rows A6 (b) scores."""
    rows = []
    for i, sc in enumerate(scenes):
        toks, res = decode_with_capture(model, processor, sc.uint8(), CAPTION_QUESTION, sample_id=f"h{i}",
                                        max_new_tokens=max_new_tokens)
        if toks:
            sh, err = generated_share(res, f"h{i}", len(toks)).mean(-1), phrase_errors(toks, sc)
            rows += [{"caption": i, "third": k, "share": float(sh[idx].mean()), "error": bool(err[idx].any())}
                     for k, idx in enumerate(np.array_split(np.arange(len(toks)), 3)) if len(idx)]
    return pd.DataFrame(rows, columns=["caption", "third", "share", "error"])


def draw_with_capture(model, processor, prompts) -> list[dict]:
    """A unified model drawing one image per prompt (``prompt_set`` items) with capture on. Per drawing: ``image``
    ``[H, W, 3]`` uint8, ``score`` (:func:`~unicache_lib.world.segment.score_object` on its first object:
    colour / position / shape; position and shape are judged only where the colour is right) and ``curve``:
    the image share of the query producing each image token after the first (mean over layers and heads), and
    ``even``: what an even reading would give at the same steps (the image tokens' share of the keys it sees)."""
    out = []
    for i, p in enumerate(prompts):
        conv = [{"role": "user", "content": [{"type": "text", "text": p["short"]}]}]  # the checkpoint's chat layout
        ids = processor(text=[processor.apply_chat_template(conv, add_generation_prompt=True)], generation_mode="image",
                        return_tensors="pt")["input_ids"]
        tokens, res = generate_image_with_capture(model, ids, sample_id=f"g{i}")
        img = signed_to_uint8(model.decode_image_tokens(tokens[None].to(model.device)))[0]
        steps = sorted({int(r.sample.rsplit("/t", 1)[1]) for r in res.records})[1:]
        curve = [np.nanmean([float(r.data["image_share"].float()[:, -1].mean()) for r in res.select(f"g{i}/t{k}")])
                 for k in steps]
        even = [float(np.mean(np.asarray(res.select(f"g{i}/t{k}")[0].spans.array) == IMAGE)) for k in steps]
        out.append({"prompt": p["short"], "image": img, "score": score_object(img, p["objects"][0]), "curve": curve,
                    "even": even})
    return out


def drawing_label(score: dict) -> str:
    """A drawing's verdict in words: position and shape are judged on the pixels of the asked colour, so when the
    colour is wrong they are "not judged", not "wrong"."""
    return (f"colour ok, position {'ok' if score['position'] else 'wrong'}" if score["colour"]
            else "colour wrong (position not judged)")


def layout_masks(n_image: int = 5, n_text: int = 3) -> dict[str, tuple[str, str, np.ndarray]]:
    """The seven ways notebook 08's models let queries read keys, as toy sequences of ``n_image`` image (``I``) and
    ``n_text`` text (``T``) tokens: name -> ``(query kinds, key kinds, allowed [n_queries, n_keys] bool)``. For the
    picture that opens the notebook (:func:`unicache_lib.plots.attention_layouts`); the real models' spans are
    read from each family's adapter when it is captured."""
    I, T = "I" * n_image, "T" * n_text

    def causal(n):
        return np.tril(np.ones((n, n), bool))

    def full(q, k):
        return np.ones((len(q), len(k)), bool)

    tower = np.zeros((n_image + n_text,) * 2, bool)
    tower[:n_image, :n_image] = True
    tower[n_image:, n_image:] = causal(n_text)
    return {
        "LLaVA: concat decoder": (I + T, I + T, causal(n_image + n_text)),
        "ViLT: fusion encoder": (T + I, T + I, full(T + I, T + I)),
        "Mllama: a cross-attention layer": (T, I, full(T, I)),
        "CLIP: dual tower": (I + T, I + T, tower),
        "Janus: unified, drawing": (T + I, T + I, causal(n_image + n_text)),
        "MMDiT: joint attention": (I + T, I + T, full(I + T, I + T)),
        "PixArt: self + cross": (I, I + T, full(I, I + T)),
    }
