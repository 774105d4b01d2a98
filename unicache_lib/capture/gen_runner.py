"""Run a generator over prompts under :class:`~unicache_lib.capture.diffusion.DiffusionCapture`.

One sampling run per batch of prompts; records go to a store under ``{run}/{prompt id}`` so
two runs (e.g. short and long prompts, or two seeds) never share a sample id, and the per-step
guidance strength (how far the conditional velocity is from the unconditional one) is kept
alongside.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import InputError
from ..progress import bar
from ..runtime.sampling import sample, to_uint8
from ..runtime.tiny_layouts import Generator, tokenize_prompts
from ..store import Store, remove_store
from ..world.text import prompt_set
from .diffusion import DiffusionCapture
from .record import CaptureResult
from .runner import _store_meta, model_fingerprint


@dataclass(eq=False)
class GuidanceProbe:
    """Sampling-loop callback: per sample and step, ``||v_cond - v_uncond|| / ||v_uncond||``
    (the relative pull of the prompt on the update)."""

    rows: list[np.ndarray] = field(default_factory=list)

    def on_velocity(self, step, timestep, v_un, v_c):
        self.rows.append(((v_c - v_un).flatten(1).norm(dim=1) / v_un.flatten(1).norm(dim=1).clamp(min=1e-12))
                         .float().cpu().numpy())

    @property
    def values(self) -> np.ndarray:
        """``[n_samples, n_steps]``."""
        return np.stack(self.rows, 1) if self.rows else np.zeros((0, 0))


def prompt_tokens(gen: Generator, prompts: list[str]) -> list[list[str]] | list[list[str | None]] | None:
    """The text tokens the model sees for each prompt: the tiny layout's real tokens in order; for a
    pipeline, one name per text position with ``None`` at padding (``PipelineGenerator.token_names``;
    ``None`` where the pipeline's positions cannot be named)."""
    if hasattr(gen, "token_names"):
        return gen.token_names(prompts)
    ids, mask = tokenize_prompts(gen.tokenizer, prompts)
    return [gen.tokenizer.convert_ids_to_tokens(row[: int(m.sum())].tolist()) for row, m in zip(ids, mask)]


def text_encoders(gen) -> list:
    """The generator's text encoders (the tiny layout's one; a pipeline's ``text_encoder``, ``_2``, ``_3``, also of a
    raw diffusers pipeline): what a generator store's ``model_config`` fingerprints with its transformer."""
    pipe = gen if hasattr(gen, "components") else getattr(gen, "pipe", None)  # a raw diffusers pipeline is its own
    return [m for m in (None if pipe is gen else getattr(gen, "text_encoder", None),
                        *(getattr(pipe, f"text_encoder{k}", None) for k in ("", "_2", "_3"))) if m is not None]


@dataclass
class GenerationRun:
    """What :func:`capture_generation` returns: images ``[N, H, W, 3]`` uint8, the records, the
    guidance strength ``[N, steps]``, sample ids and tokens in prompt order."""

    images: np.ndarray
    result: CaptureResult
    guidance: np.ndarray
    sample_ids: list[str]
    tokens: list[list[str]]
    meta: list[dict] = field(default_factory=list)


def capture_generation(gen: Generator, prompts: list[str], run: str, store=None, steps: int = 20,
                       guidance: float = 3.0, seed: int = 0, mode: str = "stats", layers=None,
                       parts=None, meta: list[dict] | None = None, batch: int = 8,
                       query_stride: int = 1, progress: bool | None = None, stats_stride: int = 1) -> GenerationRun:
    """Sample ``prompts`` (seed ``seed + i`` for prompt ``i``) with capture on.

    Args:
        run: prefix of the sample ids (``"{run}/{i}"``); must be new to ``store``.
        meta: one dict per prompt, stored in each record's meta (e.g. ``{"kind": "long"}``).
        batch: prompts per sampling run (memory: capture holds one map per prompt and layer).
        query_stride / stats_stride: as :class:`~.diffusion.DiffusionCapture` (``stats_stride`` > 1: estimated
            statistics from every k-th query row, no word maps).
    """
    if meta is not None and len(meta) != len(prompts):
        raise InputError(f"{len(meta)} meta dicts for {len(prompts)} prompts")
    ids = [f"{run}/{i}" for i in range(len(prompts))]
    toks = prompt_tokens(gen, prompts)
    metas = [{"prompt": p, **(meta[i] if meta else {})} for i, p in enumerate(prompts)]
    imgs, res, probe_rows = [], CaptureResult(), []
    for s in bar(range(0, len(prompts), batch), progress, desc=f"capture {run}"):
        sl = slice(s, s + batch)
        probe = GuidanceProbe()
        with DiffusionCapture(gen.transformer, ids[sl], mode=mode, layers=layers, parts=parts, store=store, encoders=
                              text_encoders(gen),
                              text_tokens=toks[sl] if toks is not None else None, meta=metas[sl],
                              query_stride=query_stride, stats_stride=stats_stride) as cap:
            imgs.append(to_uint8(sample(gen, prompts[sl], steps, guidance, callbacks=[cap, probe],
                                        seed=[seed + i for i in range(s, min(s + batch, len(prompts)))])))
        res.records += cap.result.records
        probe_rows.append(probe.values)
    g = np.concatenate(probe_rows) if guidance != 1.0 else np.zeros((len(prompts), 0))
    real = [[t for t in row if t is not None] for row in toks] if toks is not None else [[] for _ in prompts]
    return GenerationRun(np.concatenate(imgs), res, g, ids, real, metas)


def generation_store_or_capture(path, fallback, gen: Generator, model_name: str, n_prompts: int = 8, steps: int = 20,
                                guidance: float = 3.0, seed: int = 0):
    """A generator's stats store at ``path`` (notebook 03 writes one per model), or a fresh capture
    of ``n_prompts`` short single-object prompts into ``fallback``. A store of another generator (its ``model`` or
    ``model_config``: transformer and text encoders) is refused. Returns ``(path, captured)``."""
    path, fallback = Path(path), Path(fallback)
    if os.path.lexists(path / "meta.json"):
        meta, fp = _store_meta(path), model_fingerprint(gen.transformer, *text_encoders(gen))
        if meta.get("model", model_name) != model_name or meta.get("model_config") != fp:
            raise InputError(f"the store at {path} holds {meta.get('model', '?')!r} ({meta.get('model_config')}, "
                             f"transformer {meta.get('dtype')}), not {model_name!r} ({fp}, transformer "
                             f"{next(gen.transformer.parameters()).dtype}, text encoders "
                             f"{[str(next(e.parameters()).dtype) for e in text_encoders(gen)]}): point to that "
                             f"generator's store (notebook 03's; the transformer and every text encoder in the dtypes "
                             f"it was captured in), or to a missing path to capture afresh")
        return path, False
    if fallback.exists():
        remove_store(fallback)  # the caller's own output of an earlier run (refused while another process writes it)
    capture_generation(gen, [p["short"] for p in prompt_set(n_prompts, 0, seed)], "short",
                       Store(fallback, meta={"model": model_name}), steps, guidance, seed)
    return fallback, True
