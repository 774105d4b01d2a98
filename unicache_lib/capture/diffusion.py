"""Capture attention from a diffusers transformer step by step, for every generator family of
:mod:`unicache_lib.gen_families` (SD3 / SD3.5, PixArt, Flux.1, Sana, HunyuanDiT, DiT).

    with DiffusionCapture(gen.transformer, sample_ids=["p0", "p1"], store=store, encoders=text_encoders(gen)) as cap:
        sample(gen, prompts, steps=20, callbacks=[cap])           # the library's loop
    # or, with a diffusers pipeline:
    with DiffusionCapture(pipe.transformer, sample_ids=["p0"]) as cap:
        pipe(prompt, callback_on_step_end=cap.pipeline_callback)

Each attention module's processor is wrapped: the original processor computes the output (so the
model's output is bit-identical to an uncaptured run), and the wrapper recomputes
``softmax(q k^T / sqrt(d) + mask)`` in float32 from the module's own projections, as the family's
adapter says that processor forms it (qk norms, rotary embeddings, masks). One record per
(sample, part, layer, step) goes to :attr:`result` and, when a store is given, to the store at the
end of every step. Parts: ``"joint"`` (one sequence of image and text tokens: SD3 ``[image | text]``,
Flux ``[text | image]``, in ``meta["token_order"]``), ``"self"`` (image self-attention) and
``"cross"`` (image queries, text keys). Flux records carry ``meta["block"]`` (``"double"`` /
``"single"``; single-stream blocks are numbered after the double-stream ones). Modules without a
softmax map (Sana's linear self-attention) are not captured: :attr:`DiffusionCapture.not_captured`
lists them and a warning says so.

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
4,429 tokens x 24 heads) pass ``query_stride`` to thin it, or ``adjacent=False``, or use
``mode="recompute"``.

``mode="recompute"``: the records of ``"stats"`` in bounded memory, as ``recompute`` on the
understanding side. Each map is formed from its logits one chunk of query rows at a time
(:class:`~unicache_lib.stats.LogitRows`; the families' map recomputation streams inside
:func:`~unicache_lib.gen_families.base.streamed_maps`), so no map-sized tensor exists; the previous
step is held as its queries and keys (``2 x H x S x D`` floats instead of ``H x S^2``, plus the attention
output, per captured layer and sample) and the adjacent similarities are recomputed from them exactly, not
estimated (the same numbers as ``"stats"`` to float rounding: ``tests/test_gen_families.py``). The price is
forming the previous step's rows again.

Classifier-free guidance: the batch is ``[uncond | cond]`` (the library's loop and diffusers'
pipelines); ``branch="cond"`` (default) records the conditional half.
"""
from __future__ import annotations

import inspect
import warnings
from contextlib import ExitStack

import numpy as np
import torch

from .. import stats as S
from ..core.errors import CaptureError, InputError
from ..core.hooks import ProcessorWrapper, forward_hooks, innermost, processors
from ..core.modality import BLOCKS, TEXT
from ..core.models import placement, unwrap
from ..core.similarity import cosine
from ..gen_families import gen_family_of, processor_probs
from ..gen_families.base import streamed_maps
from ..inputs import resolve_layers
from .record import CaptureResult, Record
from .runner import own_meta

PARTS = ("joint", "self", "cross")
MODES = ("stats", "full", "recompute")
BRANCHES = ("cond", "uncond")


def attention_probs(attn, part: str, hidden_states, encoder_hidden_states=None, attention_mask=None,
                    **kwargs) -> torch.Tensor:
    """``[B, H, Sq, Sk]`` float32 attention probabilities of one diffusers attention call, recomputed
    from the module's own projections exactly as its processor forms them (same norms, rotary
    embeddings, scale and mask): the processor's generator family knows how
    (:attr:`~unicache_lib.gen_families.GenFamily.processors`). ``kwargs``: the processor's other
    arguments (``image_rotary_emb``, ``temb``); ``processor=`` names the processor when ``attn.processor``
    is a wrapper that does not keep it as ``.orig``.

    ``joint``: ``Sq = Sk = S_image + S_text`` in the family's order (SD3 ``[image | text]``, Flux
    ``[text | image]``; a Flux single-stream block gets the joined sequence as ``hidden_states``);
    ``cross``: ``Sq = S_image``, ``Sk = S_text``; ``self``: ``Sq = Sk = S_image``.
    """
    proc = kwargs.pop("processor", None)
    proc = innermost(attn.processor) if proc is None else proc
    if part == "cross" and encoder_hidden_states is None:
        raise CaptureError("cross-attention called without encoder_hidden_states")
    return processor_probs(type(proc).__name__)(attn, hidden_states, encoder_hidden_states, attention_mask, **kwargs)


class _Wrapped(ProcessorWrapper):
    """The processor installed on one attention module: output from the original processor,
    probabilities recomputed for the capture."""

    def __init__(self, cap: "DiffusionCapture", orig, site):
        super().__init__(orig)
        self.cap, self.site = cap, site
        self.name, self.layer, self.part = site.name, site.layer, site.part
        # names of the arguments after (hidden_states, encoder_hidden_states, attention_mask), for
        # processors called positionally (FluxAttention passes image_rotary_emb fifth)
        self._extra = self.names[3:]

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        out = self.orig(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
        with torch.no_grad():
            extra = {**dict(zip(self._extra, args)), **kwargs}
            B = hidden_states.shape[0]
            rows = list(self.cap._rows(B))
            h, e, m = hidden_states, encoder_hidden_states, attention_mask
            if len(rows) < B:  # recompute the recorded half of a CFG batch only
                idx = torch.tensor(rows, device=hidden_states.device)

                def sel(t):
                    return t.index_select(0, idx) if torch.is_tensor(t) and t.dim() >= 2 and t.shape[0] == B else t

                h, e, m = sel(h), sel(e), sel(m)
                extra = {k: sel(v) for k, v in extra.items()}
            with streamed_maps(self.cap.mode == "recompute"):  # a list of LogitRows per batch row, nothing formed
                probs = self.cap.family.probs(attn, h, e, m, processor=self.orig, **extra)
            self.cap._record(self, probs, out, encoder_hidden_states, attention_mask, rows)
        return out


class DiffusionCapture:
    """Context manager recording a diffusers transformer's attention per denoising step.

    Args:
        transformer: a diffusers transformer of a supported generator family (wrappers unwrapped);
            others raise :class:`~unicache_lib.families.UnsupportedModelError`, processors the family
            cannot recompute raise :class:`CaptureError` with the fix.
        sample_ids: one id per prompt of the sampling run (the conditional half of a CFG batch);
            ids must be new to the store: a second run writes under new ids, so steps of two runs
            never mix.
        mode: ``"stats"``, ``"full"`` (stats plus the map) or ``"recompute"`` (the stats, each map streamed
            from its logits: memory bounded by a row chunk and the queries and keys).
        layers / parts: subsets of block indices and of ``PARTS``; None = all.
        text_tokens: per sample, either the names of the real (non-padding) text tokens
            (``["<s>", "a", "red", ...]``), which come first in the text sequence, or one name per text
            position with ``None`` at padding (a pipeline's ``token_names``: SD3's CLIP then T5 segments).
            Needed for word maps and for separating padding on SD3 (which attends to padding); None =
            real positions from the model's text mask, or all of them.
        branch: ``"cond"`` or ``"uncond"`` half of a CFG batch.
        store: a :class:`~unicache_lib.store.Store`; records are written at the end of each step.
        adjacent: keep the previous step's map for the step-to-step similarities.
        query_stride: keep every k-th query row of the map held for ``adjacent`` and of ``full`` maps.
        stats_stride: compute the statistics and the step-to-step map similarities on every k-th query row
            of each kind (image rows and text rows sampled apart, each weighted by the rows it stands for:
            :func:`~unicache_lib.stats.sample_rows`; modes ``"stats"`` and ``"recompute"``): about k times less
            map work, and the previous step held with k times fewer queries. The records are then
            **estimates** (their error against the exact capture on the shipped generators:
            ``benchmarks/results/stats_stride_error.txt``; check it on your model before relying on them),
            carry ``meta["stats_stride"]``, and hold no ``word_map`` (that needs every image query); analyses
            refuse to mix them with exact records. A stride that shares no factor with the image grid's side
            (odd on SD3's 64 x 64) spreads the rows over it instead of sampling whole columns.
        meta: extra fields for every record's meta (e.g. the prompt kind).
        encoders: the generator's text encoders (``text_encoders(gen)``; ``()`` for a generator without one), required
            with a ``store``: fingerprinted with the transformer in its ``model_config``, so a store of the same
            transformer beside another text encoder refuses this capture.
    """

    def __init__(self, transformer, sample_ids, mode: str = "stats", layers=None, parts=None,
                 text_tokens: list[list[str]] | None = None, branch: str = "cond", store=None,
                 adjacent: bool = True, query_stride: int = 1, meta: dict | list[dict] | None = None,
                 stats_stride: int = 1, encoders=None):
        self.sample_ids, self.encoders = [str(s) for s in sample_ids], encoders
        n = len(self.sample_ids)
        self.metas = meta if isinstance(meta, list) else [dict(meta or {})] * n
        for bad, why in (
                (mode not in MODES, f"mode must be one of {MODES}, got {mode!r}"),
                (branch not in BRANCHES, f"branch must be one of {BRANCHES}, got {branch!r}"),
                (not n or len(set(self.sample_ids)) != n, "sample_ids must be non-empty and unique"),
                (text_tokens is not None and len(text_tokens) != n, f"{len(text_tokens or ())} token lists for {n} samples"),
                (query_stride < 1 or stats_stride < 1,
                 f"query_stride and stats_stride must be >= 1, got {query_stride} and {stats_stride}"),
                (stats_stride > 1 and mode == "full",
                 "stats_stride estimates the statistics from a subset of query rows, and mode 'full' keeps the whole "
                 "map: thin a kept map with query_stride, or use mode 'stats' or 'recompute'"),
                (len(self.metas) != n, f"{len(self.metas)} meta dicts for {n} samples")):
            if bad:
                raise InputError(why)
        self.transformer = unwrap(transformer)
        placement(self.transformer)  # an offloaded (meta-device) transformer is refused in one line
        self.mode, self.branch, self.store, self.text_tokens = mode, branch, store, text_tokens
        self.adjacent, self.query_stride, self.stats_stride = adjacent, query_stride, stats_stride

        self.family = gen_family_of(self.transformer)
        all_sites = self.family.sites(self.transformer)
        #: module name -> why it is not captured (Sana's linear self-attention has no softmax map)
        self.not_captured = {s.name: self.family.uncaptured[s.part] for s in all_sites if not s.captured}
        found = {s.name: s for s in all_sites if s.captured}
        if not found:
            raise CaptureError(f"{type(self.transformer).__name__} has no attention module with a softmax map to capture")
        have_parts = sorted({s.part for s in found.values()})
        if layers is not None:  # negative indices count from the last block
            want = set(resolve_layers(layers, sorted({s.layer for s in found.values()}), "the transformer"))
            found = {n: s for n, s in found.items() if s.layer in want}
        if parts is not None:
            hidden = sorted(set(parts) & set(self.family.uncaptured))
            if hidden:
                raise CaptureError(f"part {hidden[0]!r} of {self.family.name} cannot be captured: "
                                   f"{self.family.uncaptured[hidden[0]]}. Capturable parts: {have_parts}")
            bad = set(parts) - set(have_parts)
            if bad:
                raise CaptureError(f"parts {sorted(bad)} not in this transformer; it has {have_parts}")
            found = {n: s for n, s in found.items() if s.part in set(parts)}
        for s in found.values():
            self.family.check_processor(s, s.module.processor)
        if parts is None and self.not_captured:
            warnings.warn(f"{len(self.not_captured)} attention modules of this {self.family.name} transformer are not "
                          f"captured (listed in .not_captured): {'; '.join(sorted(set(self.not_captured.values())))}",
                          stacklevel=2)
        self.sites = found
        self.result = CaptureResult(part=have_parts[0])
        self.step, self.timestep = 0, float("nan")
        self._pending: list[Record] = []
        self._seen: set = set()
        self._prev: dict = {}
        self._ctx: dict = {}
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
        self.step, self.timestep = int(step) + 1, float("nan")
        return callback_kwargs

    def _see_forward(self, module, args, kwargs):
        """Transformer forward pre-hook: the timestep, and what the family reads from the forward's
        arguments (text length, text padding mask)."""
        if args:  # positional call: name the arguments
            try:
                kwargs = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
            except TypeError:
                pass
        t = kwargs.get("timestep")
        if torch.is_tensor(t) and t.numel():
            self.timestep = float(t.reshape(-1)[0])
        elif isinstance(t, (int, float)):
            self.timestep = float(t)
        self._ctx = self.family.forward_context(kwargs)

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

    def _real_text(self, j: int, b: int, n_text: int, mask_row) -> np.ndarray:
        """Boolean ``[n_text]``: which text positions of batch row ``b`` (sample ``j``) are real tokens.

        From the transformer's text mask (forward arguments) or the attention mask; with ``text_tokens``
        the tokens sit where that mask puts real tokens when the counts agree (HunyuanDiT: CLIP tokens,
        padding, T5 tokens), else first (the text sequence starts with them)."""
        known = None
        ctx_real = self._ctx.get("text_real")
        if ctx_real is not None and ctx_real.shape[-1] == n_text and ctx_real.shape[0] > b:
            known = ctx_real[b].cpu().numpy().astype(bool)
        elif mask_row is not None:  # PixArt / Sana's additive mask: 0 for real keys, -10000 for padding
            known = (mask_row.reshape(-1)[-n_text:].float() > -1).cpu().numpy()
        if self.text_tokens is None:
            return np.ones(n_text, bool) if known is None else known
        toks = self.text_tokens[j]
        if len(toks) == n_text and any(t is None for t in toks):  # one name per position, None at padding
            return np.array([t is not None for t in toks])
        n = len(toks)
        if n > n_text:
            raise CaptureError(f"sample {self.sample_ids[j]!r} has {n} text tokens but the model got {n_text}")
        return known if known is not None and int(known.sum()) == n else np.arange(n_text) < n

    def _record(self, w: _Wrapped, probs: torch.Tensor, out, enc, mask, rows) -> None:
        """``probs [len(rows), H, Sq, Sk]`` (or one :class:`~unicache_lib.stats.LogitRows` per row): the maps of batch
        rows ``rows`` (of ``out``, ``enc``, ``mask``)."""
        key0 = (w.name, self.step)
        if key0 in self._seen:
            raise CaptureError(
                f"{w.name} ran twice in step {self.step}: advance steps with the sampling loop's callbacks "
                f"(callbacks=[cap]) or a pipeline's callback_on_step_end=cap.pipeline_callback"
            )
        self._seen.add(key0)
        fam, part = self.family, w.part
        n_q, n_k = probs[0].shape[-2:]
        if part == "joint":  # a Flux single-stream block gets the joined sequence: its text length comes from the forward
            n_text = enc.shape[1] if enc is not None else self._ctx.get("n_text")
            if n_text is None:
                raise CaptureError(f"{w.name} attends over a joined sequence whose text length is unknown: run the "
                                   f"transformer itself (its forward's encoder_hidden_states give the length)")
        else:
            n_text = n_k if part == "cross" else 0
        n_img = n_q if part == "cross" else n_k - n_text
        qk, kk = fam.kinds(part, n_q, n_k, n_text)
        out_img, out_txt = fam.split_output(part, out, n_text)
        k, qw, qw_held = self.stats_stride, None, None
        if k > 1:  # every k-th query row of each kind, weighted by the rows it stands for: the statistics are estimates
            sel, qw = S.sample_rows(qk, k)
            # the rows held for the next step (thinned again by query_stride) stand for their kind's rows anew
            qw_held = S.row_weights(qk[sel][:: self.query_stride], qk)
            qk = qk[sel]
            sel = torch.as_tensor(sel)
        for j, b in enumerate(rows):
            P = probs[j]
            if k > 1:
                P = P.thin(rows=sel) if isinstance(P, S.LogitRows) else P[:, sel.to(P.device)]
            real = (self._real_text(j, b, n_text, mask[b] if (mask is not None and part == "cross") else None) if n_text
                    else np.zeros(0, bool))
            kreal = np.ones(n_k, bool)
            kreal[kk == TEXT] = real
            sid = self.sample_ids[j]
            prev_key = (sid, w.name)
            prev = self._prev.get(prev_key)
            # the step-to-step map cosines in the statistics' own pass when the previous map holds the same rows
            data = S.step_statistics(P, qk, kk, kreal, q_weights=qw,
                                     prev=prev[0] if (prev is not None and self.query_stride == 1) else None)
            if k > 1:
                del data["word_map"]  # a word map needs every image query
            # held for the next step: a LogitRows as queries and keys, not as a map
            Pk = P.thin(self.query_stride) if isinstance(P, S.LogitRows) else \
                P[:, :: self.query_stride] if self.query_stride > 1 else P
            oi = out_img[b].float()
            ot = out_txt[b].float() if (out_txt is not None and part == "joint") else None
            data.update(_adjacent(Pk, oi, ot, prev, qk[:: self.query_stride], kk, qw_held, data))
            if self.adjacent:
                self._prev[prev_key] = (Pk, oi, ot)
            if self.mode == "full":
                data["probs"] = Pk.cpu().clone()
            meta = {"timestep": self.timestep, "n_image": int(n_img), "n_text": int(n_text),
                    "n_text_real": int(real.sum()), **w.site.meta, **self.metas[j],
                    **({"stats_stride": k} if k > 1 else {}),
                    **({"token_order": "|".join(fam.joint_order)} if part == "joint" else {}),
                    # where padding sits among the text keys, where the real ones are (SD3: CLIP's, padding, T5's)
                    **({"text_positions": np.flatnonzero(real).tolist()} if not real.all() else {}),
                    **({"tokens": [t for t in self.text_tokens[j] if t is not None]} if self.text_tokens is not None else {})}
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
            if self.encoders is None:  # a store of the transformer alone would take another text encoder's capture
                raise InputError("a capture into a store fingerprints the generator's text encoders with its "
                                 "transformer: pass encoders=text_encoders(gen) (unicache_lib.capture.gen_runner; gen "
                                 "a loaded generator or a diffusers pipeline; () for a generator without one)")
            own_meta(self.store, self.transformer, *self.encoders)  # another generator, dtype or text encoder: refused
            self.store.check_resume()
            have = {k.split("|", 1)[0] for k in self.store.keys()}
            clash = [s for s in self.sample_ids if s in have]
            if clash:
                raise CaptureError(
                    f"sample ids {clash[:3]} are already in the store {self.store.path}: a new sampling run "
                    f"needs new ids (e.g. prefix them with a run name), so steps of two runs never mix"
                )
        with ExitStack() as stack:  # undone here if installing fails half-way
            stack.enter_context(processors({n: s.module for n, s in self.sites.items()},
                                           lambda name, orig: _Wrapped(self, orig, self.sites[name])))
            stack.enter_context(forward_hooks([(self.transformer, "forward_pre", self._see_forward)]))
            self._stack = stack.pop_all()
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


def _adjacent(P, out_img, out_txt, prev, q_kinds, k_kinds, q_weights, data) -> dict[str, torch.Tensor]:
    """Cosines with the previous step (NaN when there is none or a block is empty): of the maps
    (:func:`~unicache_lib.stats.map_similarity`; skipped when ``data``, the statistics, already hold them from
    the fused pass) and of the attention outputs."""
    H = P.shape[0]
    nan = float("nan")
    out = {"sim_prev": torch.full((H, len(BLOCKS)), nan), "sim_prev_all": torch.full((H,), nan),
           "out_sim_prev": torch.full((2,), nan)}
    if prev is not None:
        pP, po_img, po_txt = prev
        if "sim_prev_all" in data:
            out.update(sim_prev=data["sim_prev"].cpu(), sim_prev_all=data["sim_prev_all"].cpu())
        else:
            out.update({k: v.cpu() for k, v in S.map_similarity(P, pP, q_kinds, k_kinds, q_weights).items()})
        out["out_sim_prev"][0] = float(cosine(out_img.flatten(), po_img.flatten()))
        if out_txt is not None and po_txt is not None:
            out["out_sim_prev"][1] = float(cosine(out_txt.flatten(), po_txt.flatten()))
    return out

