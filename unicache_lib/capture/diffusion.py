"""Capture attention from a diffusers transformer (SD3 MMDiT, PixArt, DiT) step by step.

    with DiffusionCapture(gen.transformer, sample_ids=["p0", "p1"], store=store) as cap:
        sample(gen, prompts, steps=20, callbacks=[cap])           # the library's loop
    # or, with a diffusers pipeline:
    with DiffusionCapture(pipe.transformer, sample_ids=["p0"]) as cap:
        pipe(prompt, callback_on_step_end=cap.pipeline_callback)

Each attention module's processor is wrapped: the original processor computes the output (so the
model's output is bit-identical to an uncaptured run), and the wrapper recomputes
``softmax(q k^T / sqrt(d) + mask)`` in float32 from the module's own projections. One record per
(sample, part, layer, step) goes to :attr:`result` and, when a store is given, to the store at the
end of every step. Parts: ``"joint"`` (SD3: the joint sequence ``[image | text]``), ``"self"``
(image self-attention of PixArt / DiT) and ``"cross"`` (PixArt: image queries, text keys).

Record contents (``mode="stats"``, H heads; nothing of size S^2 survives):
:func:`~unicache_lib.stats.step_statistics` plus the adjacent-step similarities computed here
against the previous step of the same sample and layer:

``sim_prev``      ``[H, 4]`` cosine of this step's map with the previous step's, per block (NaN at
                  step 0 and for blocks the part does not have)
``sim_prev_all``  ``[H]`` the same over the whole map
``out_sim_prev``  ``[2]`` cosine of the attention output (after ``to_out``) with the previous
                  step's: image side, text side (NaN where the part has no text side)

``mode="full"`` keeps the map too (``probs [H, Sq, Sk]``, thinned by ``query_stride``). The map of
the previous step is held per (sample, layer) for the similarities: at real scale (SD3-medium,
4,429 tokens x 24 heads) pass ``query_stride`` to thin it, or ``adjacent=False``.

Classifier-free guidance: the batch is ``[uncond | cond]`` (the library's loop and diffusers'
pipelines); ``branch="cond"`` (default) records the conditional half.
"""
from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import torch

from .. import stats as S
from ..modality import BLOCKS, IMAGE, TEXT
from ..similarity import cosine
from .record import CaptureResult, Record
from .vlm import CaptureError, unwrap

PARTS = ("joint", "self", "cross")
BRANCHES = ("cond", "uncond")
_SUPPORTED = ("JointAttnProcessor2_0", "AttnProcessor2_0")


def find_diffusion_attention(transformer) -> dict[str, tuple[int, str, torch.nn.Module]]:
    """``{module name: (block index, part, module)}`` for every attention module of a diffusers
    transformer, in block order. Raises :class:`CaptureError` when there are none."""
    import re

    out = {}
    for name, mod in unwrap(transformer).named_modules():
        if not hasattr(mod, "processor") or not hasattr(mod, "to_q"):
            continue
        m = re.search(r"(?:transformer_blocks|blocks|layers)\.(\d+)\.", name + ".")
        if not m:
            continue
        if getattr(mod, "add_q_proj", None) is not None:
            part = "joint"
        elif getattr(mod, "is_cross_attention", False):
            part = "cross"
        else:
            part = "self"
        out[name] = (int(m.group(1)), part, mod)
    if not out:
        raise CaptureError(f"{type(transformer).__name__} has no diffusers attention modules "
                           f"(transformer_blocks.N.attn*): pass the pipeline's .transformer")
    return dict(sorted(out.items(), key=lambda kv: (kv[1][0], kv[1][1])))


def wrap_processors(targets: dict, make) -> ExitStack:
    """Install ``make(name, layer, part, original_processor)`` as the processor of every module in
    ``targets`` (as returned by :func:`find_diffusion_attention`). Closing the returned stack puts the
    originals back; if installing fails half-way, what was installed is undone before raising."""
    stack = ExitStack()
    try:
        for name, (layer, part, mod) in targets.items():
            orig = mod.processor
            stack.callback(setattr, mod, "processor", orig)
            mod.processor = make(name, layer, part, orig)
    except BaseException:
        stack.close()
        raise
    return stack


def _heads_view(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, d = x.shape
    return x.view(b, s, heads, d // heads).transpose(1, 2)


def attention_probs(attn, part: str, hidden_states, encoder_hidden_states=None, attention_mask=None) -> torch.Tensor:
    """``[B, H, Sq, Sk]`` float32 attention probabilities of one diffusers ``Attention`` call,
    recomputed from its projections exactly as ``JointAttnProcessor2_0`` / ``AttnProcessor2_0``
    form them (same norms, same 1/sqrt(head_dim) scale, same additive mask).

    ``joint``: ``Sq = Sk = S_image + S_text`` in the order ``[image | text]``; ``cross``:
    ``Sq = S_image``, ``Sk = S_text``; ``self``: ``Sq = Sk = S_image``.
    """
    h = hidden_states
    if h.dim() == 4:
        raise CaptureError("4-D (convolutional) attention inputs are not supported; capture transformer blocks")
    if attn.group_norm is not None:
        h = attn.group_norm(h.transpose(1, 2)).transpose(1, 2)
    q = _heads_view(attn.to_q(h), attn.heads)
    if part == "cross":
        e = encoder_hidden_states
        if attn.norm_cross:
            e = attn.norm_encoder_hidden_states(e)
    else:
        e = h
    k = _heads_view(attn.to_k(e), attn.heads)
    if attn.norm_q is not None:
        q = attn.norm_q(q)
    if attn.norm_k is not None:
        k = attn.norm_k(k)
    if part == "joint":
        if encoder_hidden_states is None:
            raise CaptureError("joint attention called without encoder_hidden_states")
        eq = _heads_view(attn.add_q_proj(encoder_hidden_states), attn.heads)
        ek = _heads_view(attn.add_k_proj(encoder_hidden_states), attn.heads)
        if attn.norm_added_q is not None:
            eq = attn.norm_added_q(eq)
        if attn.norm_added_k is not None:
            ek = attn.norm_added_k(ek)
        q, k = torch.cat([q, eq], 2), torch.cat([k, ek], 2)
    q, k = q.float(), k.float()
    logits = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)  # sdpa's default scale, as the processors use
    if attention_mask is not None and part != "joint":
        b = hidden_states.shape[0]
        m = attn.prepare_attention_mask(attention_mask, k.shape[2], b)
        m = m.view(b, attn.heads, -1, m.shape[-1])
        logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
    return torch.softmax(logits, -1)


class _Wrapped:
    """The processor installed on one attention module: output from the original processor,
    probabilities recomputed for the capture."""

    def __init__(self, cap: "DiffusionCapture", orig, name: str, layer: int, part: str):
        self.cap, self.orig, self.name, self.layer, self.part = cap, orig, name, layer, part

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kwargs):
        out = self.orig(attn, hidden_states, encoder_hidden_states=encoder_hidden_states,
                        attention_mask=attention_mask, **kwargs)
        with torch.no_grad():
            probs = attention_probs(attn, self.part, hidden_states, encoder_hidden_states, attention_mask)
            self.cap._record(self, probs, out, encoder_hidden_states, attention_mask)
        return out


class DiffusionCapture:
    """Context manager recording a diffusers transformer's attention per denoising step.

    Args:
        transformer: ``SD3Transformer2DModel`` / ``PixArtTransformer2DModel`` / ``DiTTransformer2DModel``
            (wrappers unwrapped).
        sample_ids: one id per prompt of the sampling run (the conditional half of a CFG batch);
            ids must be new to the store: a second run writes under new ids, so steps of two runs
            never mix.
        mode: ``"stats"`` or ``"full"`` (stats plus the map).
        layers / parts: subsets of block indices and of ``PARTS``; None = all.
        text_tokens: per sample, the text tokens' names (``["<s>", "a", "red", ...]``) for the real
            (non-padding) text positions, which come first in the text sequence. Needed for word maps
            and for separating padding on SD3 (which attends to padding); None = every text position
            is real.
        branch: ``"cond"`` or ``"uncond"`` half of a CFG batch.
        store: a :class:`~unicache_lib.store.Store`; records are written at the end of each step.
        adjacent: keep the previous step's map for the step-to-step similarities.
        query_stride: keep every k-th query row of the map held for ``adjacent`` and of ``full`` maps.
        meta: extra fields for every record's meta (e.g. the prompt kind).
    """

    def __init__(self, transformer, sample_ids, mode: str = "stats", layers=None, parts=None,
                 text_tokens: list[list[str]] | None = None, branch: str = "cond", store=None,
                 adjacent: bool = True, query_stride: int = 1, meta: dict | list[dict] | None = None):
        if mode not in ("stats", "full"):
            raise ValueError(f"mode must be 'stats' or 'full', got {mode!r}")
        if branch not in BRANCHES:
            raise ValueError(f"branch must be one of {BRANCHES}, got {branch!r}")
        self.sample_ids = [str(s) for s in sample_ids]
        if not self.sample_ids or len(set(self.sample_ids)) != len(self.sample_ids):
            raise ValueError("sample_ids must be non-empty and unique")
        if text_tokens is not None and len(text_tokens) != len(self.sample_ids):
            raise ValueError(f"{len(text_tokens)} token lists for {len(self.sample_ids)} samples")
        if query_stride < 1:
            raise ValueError("query_stride must be >= 1")
        self.transformer = unwrap(transformer)
        self.mode, self.branch, self.store = mode, branch, store
        self.text_tokens = text_tokens
        self.adjacent, self.query_stride = adjacent, query_stride
        metas = meta if isinstance(meta, list) else [dict(meta or {})] * len(self.sample_ids)
        if len(metas) != len(self.sample_ids):
            raise ValueError(f"{len(metas)} meta dicts for {len(self.sample_ids)} samples")
        self.metas = metas
        found = find_diffusion_attention(self.transformer)
        have_layers = sorted({li for li, _, _ in found.values()})
        have_parts = sorted({p for _, p, _ in found.values()})
        if layers is not None:  # negative indices count from the last block
            from ..inputs import resolve_layers

            want = set(resolve_layers(layers, have_layers, "the transformer"))
            found = {n: v for n, v in found.items() if v[0] in want}
        if parts is not None:
            bad = set(parts) - set(have_parts)
            if bad:
                raise CaptureError(f"parts {sorted(bad)} not in this transformer; it has {have_parts}")
            found = {n: v for n, v in found.items() if v[1] in set(parts)}
        for n, (_, _, mod) in found.items():
            pname = type(mod.processor).__name__
            if pname not in _SUPPORTED:
                raise CaptureError(
                    f"{n} uses {pname}; capture recomputes attention as {' / '.join(_SUPPORTED)} do. Reset it with "
                    f"transformer.set_default_attn_processor() or unfuse QKV projections before capturing"
                )
        self.targets = found
        self.result = CaptureResult(part=have_parts[0])
        self.step = 0
        self.timestep = float("nan")
        self._pending: list[Record] = []
        self._seen: set = set()
        self._prev: dict = {}
        self._stack: ExitStack | None = None

    # ---- steps ---------------------------------------------------------------------------------
    def on_step_begin(self, step: int, timestep: float) -> None:
        """Library-loop callback: the denoising step about to run."""
        self._flush()
        self.step, self.timestep = int(step), float(timestep)

    def on_step_end(self, step: int, timestep: float, sample=None) -> None:
        self._flush()

    def pipeline_callback(self, pipe, step: int, timestep, callback_kwargs: dict) -> dict:
        """diffusers pipeline ``callback_on_step_end``: closes step ``step``, opens the next."""
        self._flush()
        self.step = int(step) + 1
        self.timestep = float("nan")
        return callback_kwargs

    def _see_timestep(self, module, args, kwargs):
        t = kwargs.get("timestep")
        if torch.is_tensor(t) and t.numel():
            self.timestep = float(t.reshape(-1)[0])
        elif isinstance(t, (int, float)):
            self.timestep = float(t)

    # ---- recording -----------------------------------------------------------------------------
    def _rows(self, batch: int) -> range:
        n = len(self.sample_ids)
        if batch == 2 * n:
            return range(n, 2 * n) if self.branch == "cond" else range(0, n)
        if batch == n:
            if self.branch == "uncond":
                raise CaptureError("branch='uncond' but the batch has no unconditional half (guidance off?)")
            return range(n)
        raise CaptureError(f"the transformer got a batch of {batch} for {n} sample_ids: expected {n} "
                           f"(no guidance) or {2 * n} ([uncond | cond]); pass one id per prompt")

    def _real_text(self, j: int, n_text: int, mask_row) -> np.ndarray:
        """Boolean ``[n_text]``: which text positions are real tokens (not padding)."""
        if self.text_tokens is not None:
            n = len(self.text_tokens[j])
            if n > n_text:
                raise CaptureError(f"sample {self.sample_ids[j]!r} has {n} text tokens but the model got {n_text}")
            real = np.zeros(n_text, bool)
            real[:n] = True
            return real
        if mask_row is not None:  # PixArt's additive mask: 0 for real keys, -10000 for padding
            return (mask_row.reshape(-1)[-n_text:].float() > -1).cpu().numpy()
        return np.ones(n_text, bool)

    def _record(self, w: _Wrapped, probs: torch.Tensor, out, enc, mask) -> None:
        rows = self._rows(probs.shape[0])
        key0 = (w.name, self.step)
        if key0 in self._seen:
            raise CaptureError(
                f"{w.name} ran twice in step {self.step}: advance steps with the sampling loop's callbacks "
                f"(callbacks=[cap]) or a pipeline's callback_on_step_end=cap.pipeline_callback"
            )
        self._seen.add(key0)
        if w.part == "joint":
            n_img = probs.shape[-1] - enc.shape[1]
            out_img, out_txt = out if isinstance(out, tuple) else (out, None)
        elif w.part == "cross":
            n_img = probs.shape[-2]
            out_img, out_txt = out, None
        else:
            n_img = probs.shape[-1]
            out_img, out_txt = out, None
        for j, b in enumerate(rows):
            P = probs[b]
            n_text = P.shape[-1] - n_img if w.part == "joint" else (P.shape[-1] if w.part == "cross" else 0)
            mrow = mask[b] if (mask is not None and w.part == "cross") else None
            real = self._real_text(j, n_text, mrow) if n_text else np.zeros(0, bool)
            if w.part == "joint":
                qk = kk = np.r_[np.full(n_img, IMAGE), np.full(n_text, TEXT)]
                kreal = np.r_[np.ones(n_img, bool), real]
            elif w.part == "cross":
                qk, kk, kreal = np.full(n_img, IMAGE), np.full(n_text, TEXT), real
            else:
                qk = kk = np.full(n_img, IMAGE)
                kreal = np.ones(n_img, bool)
            data = S.step_statistics(P, qk, kk, kreal)
            sid = self.sample_ids[j]
            prev_key = (sid, w.name)
            Pk = P[:, :: self.query_stride] if self.query_stride > 1 else P
            oi = out_img[b].float()
            ot = out_txt[b].float() if (out_txt is not None and w.part == "joint") else None
            prev = self._prev.get(prev_key)
            data.update(_adjacent(Pk, oi, ot, prev, qk[:: self.query_stride], kk))
            if self.adjacent:
                self._prev[prev_key] = (Pk, oi, ot)
            if self.mode == "full":
                data["probs"] = Pk.cpu().clone()
            meta = {"timestep": self.timestep, "n_image": int(n_img), "n_text": int(n_text),
                    "n_text_real": int(real.sum()), **self.metas[j]}
            if self.text_tokens is not None:
                meta["tokens"] = list(self.text_tokens[j])
            self._pending.append(Record(
                sample=sid, layer=w.layer, part=w.part, mode=self.mode,
                data={k: v.detach().float().cpu() for k, v in data.items()}, step=self.step,
                seq_len=int(P.shape[-1]), heads=int(P.shape[0]),
                query_stride=self.query_stride if self.mode == "full" else 1, meta=meta,
            ))

    def _flush(self) -> None:
        if not self._pending:
            return
        recs, self._pending = self._pending, []
        if self.store is not None:
            self.store.write(recs)
        self.result.records += recs

    # ---- context management --------------------------------------------------------------------
    def __enter__(self) -> "DiffusionCapture":
        if self.store is not None:
            have = {k.split("|", 1)[0] for k in self.store.keys()}
            clash = [s for s in self.sample_ids if s in have]
            if clash:
                raise CaptureError(
                    f"sample ids {clash[:3]} are already in the store {self.store.path}: a new sampling run "
                    f"needs new ids (e.g. prefix them with a run name), so steps of two runs never mix"
                )
        self._stack = wrap_processors(self.targets, lambda name, layer, part, orig: _Wrapped(self, orig, name, layer, part))
        self._stack.callback(self.transformer.register_forward_pre_hook(self._see_timestep, with_kwargs=True).remove)
        return self

    def __exit__(self, exc_type, *exc):
        self._stack.close()
        self._stack = None
        self._prev.clear()
        if exc_type is None:
            self._flush()  # the last step's records
            if len(self.result) == 0:
                raise CaptureError("the capture recorded nothing: run the sampling loop inside the `with` block")
        else:
            self._pending = []  # a failed step is not stored; completed steps already are
        return False


def _adjacent(P, out_img, out_txt, prev, q_kinds, k_kinds) -> dict[str, torch.Tensor]:
    """Cosines with the previous step (NaN when there is none or a block is empty)."""
    H = P.shape[0]
    nan = float("nan")
    sim_blocks = torch.full((H, len(BLOCKS)), nan)
    sim_all = torch.full((H,), nan)
    out_sim = torch.full((2,), nan)
    if prev is not None:
        pP, po_img, po_txt = prev
        sim_all = cosine(P.flatten(1), pP.flatten(1)).cpu()
        qk, kk = torch.as_tensor(q_kinds), torch.as_tensor(k_kinds)
        for i, blk in enumerate(BLOCKS):
            src, dst = blk.split("->")
            qs = (qk == (IMAGE if src == "image" else TEXT)).to(P.device)
            ks = (kk == (IMAGE if dst == "image" else TEXT)).to(P.device)
            if qs.any() and ks.any():
                a, b = P[:, qs][:, :, ks], pP[:, qs][:, :, ks]
                sim_blocks[:, i] = cosine(a.flatten(1), b.flatten(1)).cpu()
        out_sim[0] = float(cosine(out_img.flatten(), po_img.flatten()))
        if out_txt is not None and po_txt is not None:
            out_sim[1] = float(cosine(out_txt.flatten(), po_txt.flatten()))
    return {"sim_prev": sim_blocks, "sim_prev_all": sim_all, "out_sim_prev": out_sim}

