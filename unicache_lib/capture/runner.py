"""Capture a vision-language model over a list of samples, one sample per forward, into a store.

Resumable: samples whose layers are all stored already are skipped, so an interrupted run
continues where it stopped and a finished one is a no-op.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..modality import spans_from_input_ids
from ..store import Store, key_str
from .record import CaptureResult
from .vlm import AttentionCapture, find_attention_modules

TINY_PROMPT = "user : <image> {question} assistant :"


def build_prompt(processor, question: str) -> str:
    """The model's own chat template when the processor has one (real checkpoints), else the
    tiny models' ``user : <image> {question} assistant :``."""
    if getattr(processor, "chat_template", None):
        conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        return processor.apply_chat_template(conv, add_generation_prompt=True)
    return TINY_PROMPT.format(question=question)


def model_inputs(processor, image, question: str, device=None) -> dict:
    """Processor output for one (image, question), batch size 1, on ``device``."""
    enc = processor(images=[image], text=[build_prompt(processor, question)], return_tensors="pt")
    return {k: (v.to(device) if device is not None and torch.is_tensor(v) else v) for k, v in enc.items()}


def spans_fn(model):
    """``input_ids -> Spans`` for this model (image token id and count from its config)."""
    cfg = model.config
    tid = getattr(cfg, "image_token_id", None) or getattr(cfg, "image_token_index", None)
    if tid is None:
        raise ValueError(f"{type(model).__name__} config has no image_token_id: pass spans explicitly")
    n = getattr(cfg, "image_seq_length", None) if cfg.model_type == "llava" else None
    return lambda ids: spans_from_input_ids(ids, tid, n)


def layer_batches(model, batch: int | None, part: str = "language") -> list[list[int]]:
    """Split the model's layers into groups of ``batch`` (None = one group with all layers)."""
    layers = sorted({li for li, _ in find_attention_modules(model, part).values()})
    if not batch:
        return [layers]
    return [layers[i : i + batch] for i in range(0, len(layers), batch)]


@torch.no_grad()
def capture_samples(model, processor, samples, store: Store | None = None, mode: str = "stats",
                    layers=None, layer_batch: int | None = None, part: str = "language",
                    progress: bool = True) -> CaptureResult:
    """Run ``model`` on each sample (image + its question) under :class:`AttentionCapture`.

    Args:
        samples: objects with ``id``, ``image`` and ``question`` (the standard sample set).
        store: when given, records are written there per sample and already-stored samples are
            skipped (resume); the returned result then holds only what this call captured.
        layers: layer subset; ``layer_batch``: capture at most this many layers per forward
            (big models: less memory per pass, one forward per batch of layers).
    Returns:
        The records captured by this call.
    """
    device = next(model.parameters()).device
    groups = [list(layers)] if layers is not None else layer_batches(model, layer_batch, part)
    if layers is not None and layer_batch:
        groups = [groups[0][i : i + layer_batch] for i in range(0, len(groups[0]), layer_batch)]
    all_layers = [li for g in groups for li in g]
    todo = list(samples)
    if store is not None:
        left = set(store.missing([s.id for s in todo], all_layers, part))
        todo = [s for s in todo if s.id in left]
    result = CaptureResult(part)
    spans = spans_fn(model) if part == "language" else None
    for s in tqdm(todo, desc=f"capture ({mode})", disable=not progress):
        inputs = model_inputs(processor, s.image, s.question, device)
        recs = []
        for g in groups:
            with AttentionCapture(model, mode, layers=g, part=part, spans=spans, sample_ids=[s.id]) as cap:
                model(**inputs)
            recs += cap.result.records
        if store is not None:  # layers stored by an earlier, narrower capture are kept, not rewritten
            have = store.keys()
            store.write([r for r in recs if key_str(r.key) not in have])
        result.records += recs
    return result


def stats_store_or_capture(path, fallback, model_name: str = "tiny-llava", progress: bool = False,
                           sample_seed: int | None = None):
    """The understanding model's stats store at ``path`` (notebook 02 writes one), or, when there
    is none, a fresh capture of the standard sample set (built from ``sample_seed``; ``None``: the
    shipped set) into ``fallback``. A store captured on another sample set is refused. Returns
    ``(path, captured)``."""
    import json
    import shutil
    from pathlib import Path

    from ..world import samples as sample_set
    from ..zoo.loaders import load_understanding

    path, fallback = Path(path), Path(fallback)
    want = sample_set.SEED if sample_seed is None else int(sample_seed)
    if (path / "meta.json").exists():
        have = json.loads((path / "meta.json").read_text()).get("sample_seed", sample_set.SEED)
        if int(have) != want:
            raise ValueError(f"the store at {path} was captured on the standard set of sample seed {have}, not {want}: "
                             "point to the store of the same sample set, or to a missing path to capture afresh")
        return path, False
    if fallback.exists():
        shutil.rmtree(fallback)  # the caller's own output of an earlier run
    model, proc = load_understanding(model_name, attn_implementation="eager")
    capture_samples(model, proc, sample_set.load(seed=want), Store(fallback, meta={"model": model_name, "sample_seed": want}),
                    progress=progress)
    return fallback, True
