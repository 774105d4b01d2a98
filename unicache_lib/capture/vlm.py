"""Capture attention from a Hugging Face transformers model (LLaVA family first).

    with AttentionCapture(model, mode="stats", spans=spans) as cap:
        model(**inputs)
    cap.result[0].data["entropy"]      # [heads, seq]

Modes and what they cost (H heads, S positions, per captured layer and sample):

``full``       probabilities kept as float32 on the CPU: H*S*S*4 bytes. Needs eager attention.
``stats``      :func:`~unicache_lib.stats.layer_statistics` computed inside the hook, in float32 on
               the model's device; only O(H*S) numbers survive the layer. Needs eager attention.
``recompute``  keeps the model on its fast kernel (sdpa): a registered attention function calls
               sdpa for the output and recomputes ``softmax(q k^T * scale + mask)`` from the layer's
               post-rotary queries and keys for the statistics (or, with ``keep="full"``, the map).
               Costs one extra QK^T per captured layer; nothing changes in the model's output.

The model is restored exactly on exit (hooks removed, attention implementation reset), also when
the body raises.
"""
from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Callable, Iterable

import torch

from .. import stats as S
from ..modality import Spans
from .record import CaptureResult, Record

MODES = ("full", "stats", "recompute")
_RECOMPUTE_NAME = "unicache_recompute"
# default discovery: decoder / encoder layers' attention modules
_ATTN_RE = re.compile(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.(?:self_attn|attn|self_attention)$")


class CaptureError(RuntimeError):
    """A capture that cannot give correct attention (with what to do instead)."""


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DataParallel / DistributedDataParallel / ``torch.compile`` wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            break
    return model


def part_of(name: str) -> str:
    return "vision" if ("vision" in name or "visual" in name) else "language"


def find_attention_modules(model: torch.nn.Module, part: str | Iterable[str] = "language",
                           modules: Iterable[str] | Callable | None = None) -> dict[str, tuple[int, torch.nn.Module]]:
    """Attention modules to hook: ``{qualified name: (layer index, module)}`` in layer order.

    Args:
        part: ``"language"``, ``"vision"``, ``"all"`` or a list of those (default discovery only).
        modules: explicit module names (exact or regex), or a callable ``(name, module) -> bool``;
            overrides the default discovery.
    """
    model = unwrap(model)
    parts = {"language", "vision"} if part == "all" else ({part} if isinstance(part, str) else set(part))
    found = {}
    for name, mod in model.named_modules():
        if modules is not None:
            if callable(modules):
                ok = modules(name, mod)
            else:
                ok = any(name == m or re.fullmatch(m, name) for m in modules)
            if not ok:
                continue
            m = re.search(r"layers\.(\d+)\.", name + ".")
            layer = int(m.group(1)) if m else len(found)
        else:
            m = _ATTN_RE.search(name)
            if not m or part_of(name) not in parts:
                continue
            layer = int(m.group(1))
        found[name] = (layer, mod)
    if not found:
        raise CaptureError(
            f"no attention modules matched (part={part!r}, modules={modules!r}) in {type(model).__name__}. "
            f"Pass modules=[...] with names from model.named_modules(), e.g. "
            f"'model.language_model.layers.0.self_attn'"
        )
    return dict(sorted(found.items(), key=lambda kv: (part_of(kv[0]), kv[1][0])))


class AttentionCapture:
    """Context manager that records attention of a transformers model, one record per sample,
    layer and forward call.

    Args:
        model: a transformers model (DataParallel / DDP / compiled wrappers are unwrapped).
        mode: ``"full"``, ``"stats"`` or ``"recompute"`` (see the module doc for costs).
        layers: layer indices to capture (negative allowed); None = all. Capture big models in
            batches of layers by running the same inputs with different subsets.
        part: ``"language"`` (default), ``"vision"`` or ``"all"``.
        modules: explicit module names / regexes / filter callable (overrides discovery).
        spans: modality spans of the sequence (or a callable ``input_ids -> Spans``) for the
            four-block statistics; None skips them.
        sample_ids: ids for successive samples; default ``"0", "1", ...``.
        query_stride / key_stride: keep every k-th query row / key column of full maps.
        keep: with ``mode="recompute"``, ``"stats"`` (default) or ``"full"``.
    """

    def __init__(self, model, mode: str = "stats", layers: Iterable[int] | None = None, part="language",
                 modules=None, spans: Spans | Callable | None = None, sample_ids: Iterable[str] | None = None,
                 query_stride: int = 1, key_stride: int = 1, keep: str = "stats"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if keep not in ("stats", "full"):
            raise ValueError(f"keep must be 'stats' or 'full', got {keep!r}")
        if query_stride < 1 or key_stride < 1:
            raise ValueError("strides must be >= 1")
        self.model = unwrap(model)
        self.mode, self.keep = mode, keep
        self.targets = find_attention_modules(self.model, part, modules)
        all_layers = sorted({layer for layer, _ in self.targets.values()})
        if layers is not None:
            want = {all_layers[i] if i < 0 else i for i in layers}
            missing = want - set(all_layers)
            if missing:
                raise CaptureError(f"layers {sorted(missing)} do not exist; the model has layers {all_layers}")
            self.targets = {n: (li, m) for n, (li, m) in self.targets.items() if li in want}
        self.spans = spans
        self.sample_ids = iter(sample_ids) if sample_ids is not None else None
        self.query_stride, self.key_stride = query_stride, key_stride
        self.result = CaptureResult()
        self._stack: ExitStack | None = None
        self._by_module = {id(m): (n, li) for n, (li, m) in self.targets.items()}
        self._current: list[str] = []
        self._n_forward = 0
        self._input_ids = None

    # ---- sample bookkeeping -------------------------------------------------------------------
    def _begin_forward(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        am = kwargs.get("attention_mask")
        if ids is None:  # e.g. inputs_embeds: batch from the embeddings
            emb = kwargs.get("inputs_embeds")
            bsz = emb.shape[0] if emb is not None else 1
        else:
            bsz = ids.shape[0]
        if am is not None and torch.is_tensor(am) and am.dim() == 2 and bool((am == 0).any()):
            raise CaptureError(
                "the batch is padded (attention_mask has zeros): padding positions would mix into the "
                "statistics and shift positions between samples. Capture one sample per forward (batch size 1)."
            )
        self._input_ids = ids
        names = []
        for _ in range(bsz):
            nxt = next(self.sample_ids, None) if self.sample_ids is not None else None
            names.append(str(nxt) if nxt is not None else str(self._n_forward))
            self._n_forward += 1
        self._current = names

    def _spans_for(self, row: int) -> Spans | None:
        if self.spans is None:
            return None
        if isinstance(self.spans, Spans):
            return self.spans
        if self._input_ids is None:
            raise CaptureError("spans is a callable of input_ids, but the forward got no input_ids")
        return self.spans(self._input_ids[row : row + 1])

    # ---- recording ----------------------------------------------------------------------------
    def _record(self, name: str, layer: int, probs: torch.Tensor, causal: bool, mode: str):
        """``probs [B, H, Sq, Sk]`` (any dtype/device) -> one record per batch row."""
        if probs.dim() != 4:
            raise CaptureError(f"{name}: expected attention weights [batch, heads, q, k], got {tuple(probs.shape)}")
        part = part_of(name)
        for b in range(probs.shape[0]):
            P = S.as_probs(probs[b].detach(), check=mode == "full")  # stats mode checks inside layer_statistics
            sq, sk = P.shape[-2:]
            sp = self._spans_for(b) if part == "language" else None
            if sp is not None:
                sp.check(sk, f"{name} attention map")
            qpos = torch.arange(sk - sq, sk)
            if mode == "full":
                qi = torch.arange(0, sq, self.query_stride)
                ki = torch.arange(0, sk, self.key_stride)
                data = {"probs": P[:, qi][:, :, ki].cpu() if (self.query_stride > 1 or self.key_stride > 1)
                        else P.cpu().clone()}
            else:
                data = {k: v.cpu() for k, v in S.layer_statistics(P, sp, causal, qpos).items()}
            sample = self._current[b] if b < len(self._current) else str(b)
            self.result.records.append(Record(
                sample=sample, layer=layer, part=part, mode=mode, data=data, spans=sp, seq_len=sk,
                heads=P.shape[0], query_stride=self.query_stride if mode == "full" else 1,
                key_stride=self.key_stride if mode == "full" else 1,
            ))

    def _hook(self, module, args, output):
        name, layer = self._by_module[id(module)]
        if not isinstance(output, tuple):
            raise CaptureError(
                f"{name} ({type(module).__name__}) returned a single tensor, not (output, weights): it is not "
                f"an attention module. Hook the layer's self_attn (see find_attention_modules(model))"
            )
        weights = output[1] if len(output) > 1 else None
        if weights is None:
            impl = getattr(getattr(self.model, "config", None), "_attn_implementation", "?")
            raise CaptureError(
                f"attention weights are not returned under {impl!r} ({name}): load with "
                f"attn_implementation='eager' or use capture mode 'recompute'"
            )
        self._record(name, layer, weights, getattr(module, "is_causal", True), self.mode)

    def _recompute_fn(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                     scaling=scaling, **kw)
        hit = self._by_module.get(id(module))
        if hit is not None:
            with torch.no_grad():
                q, k = query.float(), key.float()
                if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat key heads
                    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                scale = scaling if scaling is not None else q.shape[-1] ** -0.5
                logits = (q @ k.transpose(-1, -2)) * scale
                sq, sk = logits.shape[-2:]
                causal = bool(getattr(module, "is_causal", False))
                if attention_mask is not None:
                    m = attention_mask[..., :sq, :sk]
                    logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
                elif causal and sq > 1:
                    qpos = torch.arange(sk - sq, sk, device=logits.device)
                    logits = logits.masked_fill(torch.arange(sk, device=logits.device)[None, :] > qpos[:, None],
                                                float("-inf"))
                probs = torch.softmax(logits, -1)
                self._record(hit[0], hit[1], probs, causal, "full" if self.keep == "full" else "stats")
        return out

    # ---- context management --------------------------------------------------------------------
    def __enter__(self) -> "AttentionCapture":
        self._stack = ExitStack()
        try:
            self._stack.enter_context(_pre_hook(self.model, self._begin_forward))
            if self.mode == "recompute":
                self._stack.enter_context(_attn_impl(self.model, self._recompute_fn))
            else:
                for name, (_, mod) in self.targets.items():
                    self._stack.callback(mod.register_forward_hook(self._hook).remove)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()
        self._stack = None
        if exc[0] is None and len(self.result) == 0:
            raise CaptureError("the capture recorded nothing: run the model inside the `with` block "
                               "(and check that the chosen layers run in that forward)")
        return False


class _pre_hook:
    def __init__(self, model, fn):
        self.model, self.fn = model, fn

    def __enter__(self):
        self.h = self.model.register_forward_pre_hook(self.fn, with_kwargs=True)

    def __exit__(self, *exc):
        self.h.remove()


class _attn_impl:
    """Route every attention call of ``model`` through ``fn`` (registered in transformers'
    ``AttentionInterface``), restoring the previous implementation on exit."""

    def __init__(self, model, fn):
        self.model, self.fn = model, fn

    def __enter__(self):
        from transformers import AttentionInterface

        self.old = self.model.config._attn_implementation
        AttentionInterface.register(_RECOMPUTE_NAME, self.fn)
        self.model.set_attn_implementation(_RECOMPUTE_NAME)

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.old)
