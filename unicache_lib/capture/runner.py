"""Capture a vision-language model over a list of samples, one sample per forward, into a store.

Resumable: samples whose layers are all stored already are skipped, so an interrupted run
continues where it stopped and a finished one is a no-op.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from ..core.errors import InputError, StoreError
from ..core.models import first_token_logits, loaded, placement, to_model
from ..core.untrusted import decode_utf8, read_inside
from ..families import family_of
from ..inputs import check_count, check_question, default_family, encode, prepare_image, resolve_layers
from ..progress import bar
from ..runtime.loaders import load_understanding
from ..runtime.tiny_layouts import answer_logits as tiny
from ..store import MAX_META_BYTES, Store, key_str, remove_store
from ..world import samples as sample_set
from .record import CaptureResult
from .vlm import AttentionCapture, attention_sites, check_memory, full_capture_bytes


def build_prompt(processor, question: str, family=None) -> str:
    """The model's own chat template when the processor has one (real checkpoints), else the family's
    plain layout (the tiny models' ``user : <image> {question} assistant :``). A question that already
    holds the image marker is refused (:class:`~unicache_lib.inputs.PromptError`)."""
    family = default_family(family)
    return family.prompt(processor, check_question(question, family))


def model_inputs(processor, image, question: str | None, device=None, family=None, dtype=None, *,
                 prompt: str | None = None) -> dict:
    """Processor output for one (image, question), batch size 1, on ``device``; floating inputs
    (pixel values) in ``dtype`` when given (the model's weight dtype).

    ``image``: anything :func:`~unicache_lib.inputs.prepare_image` accepts (uint8 RGB, grayscale,
    RGBA, float in [0, 1], PIL, tensors; converted exactly, else refused with what to pass).
    ``prompt``: a whole prompt of your own instead of the family's template around ``question``; it
    must hold the family's image marker (e.g. ``<image>``) once.
    """
    return to_model(encode(processor, image, question, family, prompt), device, dtype)


def inputs_for(model, processor, image, question: str | None, *, prompt: str | None = None) -> dict:
    """:func:`model_inputs` for ``model``: its family's prompt, its device and weight dtype."""
    dev, dtype = placement(model)
    fam = family_of(model)
    return fam.canonical_inputs(model, model_inputs(processor, image, question, dev, fam, dtype, prompt=prompt))


def answer_logits(model, processor, questions, images_uint8, batch: int = 100) -> torch.Tensor:
    """``[N, vocab]`` float32 logits of the first answer token for (question, image) pairs (gradients
    flow when enabled). The shipped tiny layout runs in padded batches; every other model runs one
    prompt at a time through its processor and family prompt (no padding, so no position shifts).
    Images go through :func:`~unicache_lib.inputs.prepare_image` first (uint8 RGB; float [0, 1],
    grayscale and RGBA images converted exactly), whichever path runs them."""
    images = [prepare_image(im) for im in images_uint8]  # floats in [0, 1], grayscale, RGBA: converted once
    questions = list(questions)
    if len(images) != len(questions):
        raise InputError(f"{len(questions)} questions for {len(images)} images")
    fam = family_of(model)
    side = model.config.vision_config.image_size if _tiny_layout(model, processor) else None
    if side and images and all(im.shape[:2] == (side, side) for im in images):  # images of another size: processor
        for q in questions:
            check_question(q, fam)
        return tiny(model, processor.tokenizer, questions, np.stack(images), batch)
    return first_token_logits(model, lambda qs, imgs: encode(processor, imgs[0], qs[0], fam), questions, images, 1)


def _tiny_layout(model, processor) -> bool:
    """A shipped tiny LLaVA's layout (tiny-llava: 64 image tokens; tiny-llava-576: 576): plain prompt, no chat
    template, one image token per patch of the tower's grid."""
    cfg = model.config
    if cfg.model_type != "llava" or getattr(processor, "chat_template", None):
        return False
    vc = cfg.vision_config
    return getattr(cfg, "image_seq_length", None) == (vc.image_size // vc.patch_size) ** 2


def spans_fn(model):
    """``input_ids -> Spans`` of the self-attention sequence for this model (from its family)."""
    fam = family_of(model)
    return lambda ids, inputs=None: fam.spans(model.config, ids, inputs)


@torch.no_grad()
def capture_samples(model, processor, samples, store: Store | None = None, mode: str = "stats",
                    layers=None, layer_batch: int | None = None, part: str = "language",
                    progress: bool | None = None, memory_budget_gb: float | None = None) -> CaptureResult:
    """Run ``model`` on each sample (image + its question) under :class:`AttentionCapture`.

    Args:
        samples: objects with ``id``, ``image`` and ``question`` (the standard sample set).
        store: when given, records are written there per sample and already-stored samples are
            skipped (resume); the returned result then holds only what this call captured. Each record's meta
            holds its sample's ``sample_digest`` (picture and question): a stored id of other content is refused.
        layers: layer subset; ``layer_batch``: capture at most this many layers per forward
            (big models: less memory per pass, one forward per batch of layers); None: all in one forward.
        memory_budget_gb: with ``mode="full"``, the maps the call returns are estimated first (printed)
            and an estimate over this budget raises :class:`CaptureError` before any forward.
    Returns:
        The records captured by this call.
    """
    sites = attention_sites(model, part)
    if layers is not None:  # negative indices count from the last layer, as in AttentionCapture
        have = sorted({s.layer for s in sites if s.part != "vision"} or {s.layer for s in sites})
        layers = resolve_layers(layers, have, f"the model's {part} part")
    ls = list(layers) if layers is not None else sorted({s.layer for s in sites})
    if layer_batch is not None:  # -1 made no group at all: nothing captured, nothing said
        check_count(layer_batch, "layer_batch (None: all layers in one forward)", 1)
    groups = [ls[i : i + layer_batch] for i in range(0, len(ls), layer_batch)] if layer_batch else [ls]
    wanted = {(s.part, s.layer) for s in sites if s.layer in ls}
    if not wanted:
        raise InputError(f"no attention module of part {part!r} in layers {layers}")
    todo = list(samples)
    digest = {str(s.id): sample_digest(s) for s in todo}  # in each record's meta: a resume with other pictures refused
    if len(digest) < len(todo):  # two folders merged: the second picture's digest over the first's records
        raise InputError(f"sample ids {sorted({i for i in digest if [str(s.id) for s in todo].count(i) > 1})[:5]} are "
                         f"given twice: each sample needs its own id (e.g. prefix them with their folder's name)")
    if store is not None:
        own_meta(store, model)
        store.check_resume(mode=mode)  # another model, dtype or mode is refused before anything is skipped
        if store.path.exists() and (odd := sorted({e["sample"] for e in store.index() if e["sample"] in digest
                           and e.get("meta", {}).get("sample_digest", digest[e["sample"]]) != digest[e["sample"]]})):
            raise StoreError(f"sample {odd[0]!r} ({len(odd)} in all) is stored in {store.path} from another picture or "
                             f"question (two sample sets of the same ids: another sample seed or folder): capture into "
                             f"a new folder, or remove_store({str(store.path)!r}) to start it again")
        have = store.keys()
        todo = [s for s in todo if any(key_str((s.id, p, li, -1)) not in have for p, li in wanted)]
    result = CaptureResult(part)
    if mode == "full" and todo:
        per = full_capture_bytes(model, inputs_for(model, processor, todo[0].image, todo[0].question), ls, part)
        check_memory(per * len(todo), memory_budget_gb, f"full maps of {len(todo)} sample{'s' * (len(todo) != 1)}",
                     say=progress is not False)  # a caller that turned the bar off (a step of a measurement): quiet
    for s in bar(todo, progress, desc=f"capture ({mode})"):
        inputs = inputs_for(model, processor, s.image, s.question)
        recs = []
        for g in groups:
            with AttentionCapture(model, mode, layers=g, part=part, sample_ids=[s.id]) as cap:
                model(**inputs)
            recs += cap.result.records
        for r in recs:
            r.meta["sample_digest"] = digest[str(s.id)]
        if store is not None:  # layers stored by an earlier, narrower capture are kept, not rewritten
            have = store.keys()
            store.write([r for r in recs if key_str(r.key) not in have])
        result.records += recs
    return result


def sample_digest(sample) -> str:
    """A digest of ``sample``'s picture (as :func:`~unicache_lib.inputs.prepare_image` reads it) and question: what a
    capture records beside each record, so that a resume whose samples share the stored ids but not their content is
    refused."""
    im = prepare_image(sample.image)
    return hashlib.sha256(f"{im.shape}|{sample.question}|".encode() + im.tobytes()).hexdigest()[:16]


def own_meta(store: Store, model, *more) -> None:
    """Set ``store.meta``'s ``dtype`` and ``model_config`` to ``model``'s (with ``more``: a generator's text encoders),
    so that :meth:`~unicache_lib.store.Store.check_resume` refuses a store of another model or dtype; a caller's meta
    naming other values (``Store(p, meta=Store(p).read_meta())`` given another model) is refused, never kept."""
    for k, v in (("dtype", str(next(model.parameters()).dtype)), ("model_config", model_fingerprint(model, *more))):
        if store.meta.setdefault(k, v) != v:
            raise StoreError(f"the meta given to Store({str(store.path)!r}) names {k}={store.meta[k]!r}, this model "
                             f"is {k}={v!r}: leave {k} out of meta (a capture records its model's own)")


def _store_dtype(meta: dict, model, path: Path):
    """The dtype a store's weights were sampled in, to sample ``model``'s as they were: float32 weights cast to a
    store's half precision round as ``from_pretrained(dtype=...)`` rounds them; a store in another dtype than a
    half-precision model's cannot be compared, and is refused naming the dtype to load the model in."""
    have, dt = next(model.parameters()).dtype, getattr(torch, str(meta.get("dtype", "")).removeprefix("torch."), None)
    if "dtype" not in meta or isinstance(dt, torch.dtype) and have in (dt, torch.float32):
        return dt if isinstance(dt, torch.dtype) else None
    raise InputError(f"the store at {path} was captured in {meta.get('dtype')!r}, the model is loaded in {str(have)!r}: its "
                     f"weights cannot be compared with the capture's; load the model in float32 or in the store's "
                     f"dtype (DTYPE), or point to a missing path to capture afresh")


def model_fingerprint(model, *more, as_dtype=None) -> str:
    """``"<class>:<digest>"`` of the model's config (without its paths and versions) and of a sample of its weights
    (of every tensor, in float32: the first two values of each row and column and 256 values strided over it, so a
    fine-tune of one projection or one embedding row differs there; a few MB read on a 7B model): what a store records so that a resumed capture of another model into it is refused even when its meta names no model.
    ``more``: other modules hashed after it (a generator's text encoders); the name stays ``model``'s class.
    ``as_dtype``: each sampled value cast to it first (a float32 model compared with a half-precision capture)."""
    def clean(x):
        return {k: clean(v) for k, v in x.items() if not str(k).startswith("_")
                and k not in ("transformers_version", "torch_dtype", "dtype")} if isinstance(x, dict) else x
    h = hashlib.sha256()
    for m in (model, *more):  # every tensor: its first two rows and columns (an embedding row, a bias) and a stride
        cfg = getattr(m, "config", {})  # a diffusers transformer's is a FrozenDict (no to_dict)
        h.update(json.dumps(clean(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)), sort_keys=True,
                            default=str).encode())
        for v in (loaded(p).detach().reshape(p.shape[0] if p.dim() else 1, -1) for p in m.parameters()):
            h.update(torch.cat([v[:, :2].flatten(), v[:2].flatten(), v.flatten()[:: max(1, v.numel() // 256)]])
                     .to(as_dtype or v.dtype).float().cpu().numpy().tobytes())
    return f"{type(model).__name__}:{h.hexdigest()[:12]}"


def _store_meta(path: Path) -> dict:
    """The store's ``meta.json`` read through the bounded reader (:func:`~unicache_lib.core.untrusted.read_inside`: a
    regular file inside the store, at most :data:`~unicache_lib.store.MAX_META_BYTES`; a FIFO, a link out or a sparse
    file of gigabytes refused in one line before it is read) and parsed as a JSON object."""
    fix = "Point to notebook 02's OUT_DIR/stats store, or to a missing path to capture afresh"
    data = read_inside(path, "meta.json", links=False, limit=MAX_META_BYTES, what="store meta", fix=fix)
    try:
        meta = json.loads(decode_utf8(data, path / "meta.json"))
    except (ValueError, RecursionError) as e:
        raise InputError(f"{path / 'meta.json'} is not JSON ({' '.join(str(e).split())[:120]}): {fix}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path / 'meta.json'} holds a {type(meta).__name__}, not an object: {fix}")
    return meta


def stats_store_or_capture(path, fallback, model_name: str = "tiny-llava", progress: bool | None = None,
                           sample_seed: int | None = None, model=None, processor=None):
    """The understanding model's stats store at ``path`` (notebook 02 writes one), or, when there
    is none, a fresh capture of the standard sample set (built from ``sample_seed``; ``None``: the
    shipped set) into ``fallback``, with ``model`` / ``processor`` when given (else ``model_name`` is
    loaded). A store of another model or another sample set is refused. Returns ``(path, captured)``."""
    path, fallback = Path(path), Path(fallback)
    want = sample_set.SEED if sample_seed is None else int(sample_seed)
    if os.path.lexists(path / "meta.json"):
        meta = _store_meta(path)
        have = meta.get("sample_seed", sample_set.SEED)
        if int(have) != want:
            raise InputError(f"the store at {path} was captured on the standard set of sample seed {have}, not {want}: "
                             "point to the store of the same sample set, or to a missing path to capture afresh")
        if meta.get("model", model_name) != model_name:
            raise InputError(f"the store at {path} holds {meta['model']!r}, not {model_name!r}: point to that model's "
                             "store (notebook 02's OUT_DIR/stats), or to a missing path to capture afresh")
        if "model_config" in meta:  # the class and sampled weights the capture recorded, whatever name it gives
            if model is None:
                model, processor = load_understanding(model_name, attn_implementation="eager")
            if (cls := model_fingerprint(model, as_dtype=_store_dtype(meta, model, path))) != str(meta["model_config"]):
                raise InputError(f"the store at {path} holds a capture of {meta['model_config']!r}, not of "
                                 f"{model_name!r} ({type(model).__name__}), whose capture is {cls!r} (or, for a store "
                                 f"captured before 2026-12-05, an older fingerprint of the same weights): point to that "
                                 f"model's store, or to a missing path to capture afresh")
        std = {s.id: sample_digest(s) for s in sample_set.load(seed=want)}  # 02 on a folder of yours records seed too
        if (odd := sorted({e["sample"] for e in Store(path).index() if std.get(e["sample"], "") != e.get(
                "meta", {}).get("sample_digest", std.get(e["sample"]))})):
            raise InputError(f"the store at {path} holds samples that are not the standard set's of sample seed {want} "
                             f"({odd[0]!r}, {len(odd)} in all: a folder of your own?): point to the store of the "
                             f"standard set, or to a missing path to capture afresh")
        return path, False
    if fallback.exists():
        remove_store(fallback)  # the caller's own output of an earlier run (refused while another process writes it)
    if model is None:
        model, processor = load_understanding(model_name, attn_implementation="eager")
    capture_samples(model, processor, sample_set.load(seed=want),
                    Store(fallback, meta={"model": model_name, "sample_seed": want}), progress=progress)
    return fallback, True
