"""Capture attention from a Hugging Face transformers vision-language model.

    with AttentionCapture(model, mode="stats") as cap:
        model(**inputs)
    cap.result[0].data["entropy"]      # [heads, seq]

Modes and what they cost (H heads, S positions, per captured layer and sample):

``full``       probabilities kept as float32 on the CPU: H*S*S*4 bytes (plus the S*S mask). Needs eager
               attention.
``stats``      :func:`~unicache_lib.stats.layer_statistics` computed inside the hook, in float32 on
               the model's device; only O(H*S) numbers survive the layer. Needs eager attention.
``recompute``  keeps the model on its fast kernel (sdpa): a registered attention function calls
               sdpa for the output and recomputes ``softmax(q k^T * scale + mask)`` from the layer's
               post-rotary queries and keys for the statistics (or, with ``keep="full"``, the map).
               The mask is the one transformers builds for sdpa (registered under the same name),
               so sliding windows, bidirectional image blocks, prefix-LM and padding masks are kept and
               the output is bit-identical to plain sdpa. Costs one extra QK^T per captured layer.

**Masks.** Statistics use the mask the model actually applied, read at each attention call (eager: the
``attention_mask`` the module receives; recompute: the mask passed to sdpa, or sdpa's own implicit
causal mask), never ``module.is_causal``. A map with mass on keys that mask hides raises.

**Families.** Which modules attend, in which part, and where the image sits comes from the model's
family adapter (:mod:`unicache_lib.families`); a model of an unknown family is refused with the list of
supported ones. Parts: ``language`` (the decoder's self-attention), ``cross`` (cross-attention layers
over the vision tokens, Mllama) and ``vision`` (the vision tower). ``part="language"`` captures the
language model, i.e. its self- *and* cross-attention layers.

The model is restored exactly on exit (hooks removed, attention implementation reset), also when
the body raises.
"""
from __future__ import annotations

import inspect
import re
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterable

import torch

from .. import stats as S
from ..core.compat import attention_functions, config_attn_implementation, restore_attention_functions, transformers
from ..core.errors import CaptureError, InputError
from ..core.hooks import forward_hooks
from ..core.modality import TEXT, Spans
from ..core.models import attn_implementations, language_attn_implementation, set_attn_implementations, unwrap
from ..families import Site, family_of
from ..inputs import check_image_tokens, check_spans, resolve_layers
from .record import CaptureResult, Record

MODES = ("full", "stats", "recompute")
PARTS = ("language", "cross", "vision")
_RECOMPUTE_NAME = "unicache_recompute"


def expand_parts(part: str | Iterable[str]) -> tuple[str, ...]:
    """``"language"`` -> self- and cross-attention of the language model; ``"all"`` -> every part."""
    asked = PARTS if part == "all" else ((part,) if isinstance(part, str) else tuple(part))
    bad = set(asked) - set(PARTS)
    if bad:
        raise InputError(f"part must be one of {PARTS} or 'all', got {sorted(bad)}")
    out = set(asked) | ({"cross"} if "language" in asked else set())
    return tuple(p for p in PARTS if p in out)


def attention_sites(model: torch.nn.Module, part: str | Iterable[str] = "language",
                    modules: Iterable[str] | Callable | None = None) -> list:
    """The attention modules to hook, as :class:`~unicache_lib.families.Site` (name, layer, part,
    module), in layer order per part.

    Args:
        part: ``"language"`` (self + cross attention of the language model), ``"cross"``,
            ``"vision"``, ``"all"`` or a list of those.
        modules: explicit module names (exact or regex), or a callable ``(name, module) -> bool``;
            overrides the family's list (a module the family does not list gets the layer index
            in its name and the part ``language``, or ``vision`` when its name says so).
    Raises:
        UnsupportedModelError: the model is of no registered family (the message lists them).
    """
    model = unwrap(model)
    fam = family_of(model)
    if modules is None:
        sites = fam.sites(model, expand_parts(part))
    else:
        known = {s.name: s for s in fam.sites(model, PARTS)}
        sites = []
        for name, mod in model.named_modules():
            if not (modules(name, mod) if callable(modules) else any(name == m or re.fullmatch(m, name) for m in modules)):
                continue
            if name in known:
                sites.append(known[name])
                continue
            m = re.search(r"(?:layers|blocks|layer)\.(\d+)\.", name + ".")
            sites.append(Site(name, int(m.group(1)) if m else len(sites),
                              "vision" if ("vision" in name or "visual" in name) else "language", mod))
    if not sites:
        raise CaptureError(
            f"no attention modules matched (part={part!r}, modules={modules!r}) in {type(model).__name__}. "
            f"Pass modules=[...] with names from model.named_modules(), e.g. "
            f"'model.language_model.layers.0.self_attn'"
        )
    return sorted(sites, key=lambda s: (s.part == "vision", s.layer))


def find_attention_modules(model: torch.nn.Module, part: str | Iterable[str] = "language",
                           modules: Iterable[str] | Callable | None = None) -> dict[str, tuple[int, torch.nn.Module]]:
    """``{qualified name: (layer index, module)}`` of :func:`attention_sites`."""
    return {s.name: (s.layer, s.module) for s in attention_sites(model, part, modules)}


def visible_from_mask(mask: torch.Tensor | None, sq: int, sk: int, row: int = 0) -> torch.Tensor | None:
    """The bool ``[Sq, Sk]`` visibility of batch row ``row`` of an attention mask as transformers
    passes it (bool: True = attend; float: additive, large negative = hidden), or None for no mask."""
    if mask is None:
        return None
    if mask.dim() != 4:
        raise CaptureError(f"expected a 4-D attention mask [batch, 1, q, k], got shape {tuple(mask.shape)}")
    m = mask[row if mask.shape[0] > 1 else 0]
    if m.shape[0] != 1 and not bool((m == m[:1]).all()):
        raise CaptureError("per-head attention masks are not supported by capture")
    m = m[0][..., -sq:, :sk] if m.shape[-2] >= sq else m[0][..., :sk]
    return (m if m.dtype == torch.bool else torch.isfinite(m) & (m > torch.finfo(m.dtype).min / 2)).expand(sq, sk)


class AttentionCapture:
    """Context manager that records attention of a transformers model, one record per sample,
    attention module and forward call.

    Args:
        model: a transformers model of a supported family (DataParallel / DDP / compiled wrappers are
            unwrapped).
        mode: ``"full"``, ``"stats"`` or ``"recompute"`` (see the module doc for costs).
        layers: layer indices to capture (negative allowed: ``-1`` is the last); None = all. Capture big
            models in batches of layers by running the same inputs with different subsets. An index
            that does not exist raises :class:`~unicache_lib.inputs.LayerError` (a ``ValueError``)
            with the valid range.
        part: ``"language"`` (default: self- and cross-attention of the language model), ``"cross"``,
            ``"vision"`` or ``"all"``.
        modules: explicit module names / regexes / filter callable (overrides the family's list).
        spans: modality spans of the self-attention sequence, a callable ``input_ids -> Spans``,
            ``"auto"`` (default: from the family adapter and the forward's inputs) or None (skip the
            four-block statistics). Cross-attention keys are always the image span. Spans (or a
            callable's spans) whose image positions are not the image tokens of the forward's
            ``input_ids`` raise :class:`~unicache_lib.core.modality.SpanError` before the model runs.
        sample_ids: ids for successive samples; default ``"0", "1", ...``.
        query_stride / key_stride: keep every k-th query row / key column of full maps.
        keep: with ``mode="recompute"``, ``"stats"`` (default) or ``"full"``.
    """

    def __init__(self, model, mode: str = "stats", layers: Iterable[int] | None = None, part="language",
                 modules=None, spans: Spans | Callable | str | None = "auto", sample_ids: Iterable[str] | None = None,
                 query_stride: int = 1, key_stride: int = 1, keep: str = "stats"):
        for bad, why in ((mode not in MODES, f"mode must be one of {MODES}, got {mode!r}"),
                         (keep not in ("stats", "full"), f"keep must be 'stats' or 'full', got {keep!r}"),
                         (query_stride < 1 or key_stride < 1, "strides must be >= 1")):
            if bad:
                raise InputError(why)
        self.model = unwrap(model)
        self.family = family_of(self.model)
        if mode == "recompute" and not self.family.attention_interface:
            raise CaptureError(f"{self.family.name} computes attention inside its own modules, not through transformers' "
                               f"attention interface, so mode 'recompute' cannot reach it: use mode 'stats' or 'full'")
        self.mode, self.keep = mode, keep
        sites = attention_sites(self.model, part, modules)
        if layers is not None:  # negative indices count from the last; a bad index is a LayerError (ValueError)
            want = set(resolve_layers(layers, sorted({s.layer for s in sites if s.part != "vision"}
                                                     or {s.layer for s in sites}), f"the model's {part} part"))
            sites = [s for s in sites if s.layer in want]
        self.sites = sites
        self._family_sites = {s.name for s in self.family.sites(self.model, PARTS)}
        self.spans = spans
        self.sample_ids = iter(sample_ids) if sample_ids is not None else None
        self.query_stride, self.key_stride = query_stride, key_stride
        self.result = CaptureResult()
        self._stack: ExitStack | None = None
        self._by_module = {id(s.module): s for s in sites}
        self._gates = {}
        self._current: list[str] = []
        self._n_forward = 0
        self._inputs: dict = {}
        self._seen: set = set()

    # ---- sample bookkeeping -------------------------------------------------------------------
    def _begin_forward(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        am = kwargs.get("attention_mask")
        emb = kwargs.get("inputs_embeds")  # e.g. inputs_embeds: batch from the embeddings
        bsz = ids.shape[0] if ids is not None else emb.shape[0] if emb is not None else 1
        if am is not None and torch.is_tensor(am) and am.dim() == 2 and bool((am == 0).any()):
            raise CaptureError(
                "the batch is padded (attention_mask has zeros): padding positions would mix into the "
                "statistics and shift positions between samples. Capture one sample per forward (batch size 1)."
            )
        self._inputs = dict(kwargs, input_ids=ids)
        self._check_length(ids if ids is not None else emb)
        self._check_inputs(ids)
        self._seen = set()
        nxt = [next(self.sample_ids, None) if self.sample_ids is not None else None for _ in range(bsz)]
        self._current = [str(n) if n is not None else str(self._n_forward + i) for i, n in enumerate(nxt)]
        self._n_forward += bsz

    def _check_length(self, x) -> None:
        """A sequence longer than the language model's ``max_position_embeddings`` runs on positions the model was
        never trained on (rotary angles it has not seen): refused rather than measured."""
        if x is None or not torch.is_tensor(x) or x.dim() < 2:
            return
        cfg = unwrap(self.model).config
        limit = getattr(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg, "max_position_embeddings",
                        None)
        if isinstance(limit, int) and x.shape[1] > limit:
            raise CaptureError(f"the sequence has {x.shape[1]} tokens, more than the model's max_position_embeddings "
                               f"= {limit}: positions past it were never trained. Shorten the prompt (or fewer image "
                               f"tokens), or use a checkpoint with a longer context")

    def _check_inputs(self, ids) -> None:
        """Before the model runs: an image without image tokens in the prompt, and user spans whose
        image positions are not the prompt's image tokens, are refused with what to do
        (:mod:`unicache_lib.inputs`)."""
        if ids is None:
            return
        check_image_tokens(self.family, self.model.config, ids, self._inputs)
        if self.spans is None or isinstance(self.spans, str):
            return
        for row in range(ids.shape[0]):
            sp = self.spans if isinstance(self.spans, Spans) else self.spans(ids[row : row + 1])
            if isinstance(sp, Spans):
                check_spans(sp, self.family, self.model.config, ids[row : row + 1], self._inputs)

    def _spans_for(self, row: int, site, sk: int) -> Spans | None:
        """Modality of the keys of one batch row of one attention call (None: no block statistics)."""
        if site.part == "vision":
            return None
        if site.part == "cross":
            return self.family.cross_spans(sk)
        if self.spans is None or isinstance(self.spans, Spans):
            return self.spans
        ids = self._inputs.get("input_ids")
        if ids is None:
            raise CaptureError("spans are derived from input_ids, but the forward got none: pass spans=Spans(...)")
        if isinstance(self.spans, str):
            if self.spans != "auto":
                raise InputError(f"spans must be a Spans, a callable, 'auto' or None, got {self.spans!r}")
            return self.family.spans(self.model.config, ids[row : row + 1], self._inputs)
        return self.spans(ids[row : row + 1])

    # ---- recording ----------------------------------------------------------------------------
    def _record(self, site, probs: torch.Tensor, mask, mode: str):
        """``probs [B, H, Sq, Sk]`` (any dtype/device), or one :class:`~unicache_lib.stats.LogitRows` per batch
        row (recompute), and the mask applied -> one record per batch row."""
        if torch.is_tensor(probs) and probs.dim() != 4:
            raise CaptureError(f"{site.name}: expected attention weights [batch, heads, q, k], got {tuple(probs.shape)}")
        for b in range(len(probs)):
            sample = self._current[b] if b < len(self._current) else str(b)
            key = (sample, site.part, site.layer)
            if key in self._seen:
                raise CaptureError(
                    f"{site.name} attended more than once in one forward (e.g. window or chunked attention in a vision "
                    f"tower): its map is computed piecewise and one record per layer would be wrong. Capture another "
                    f"part (part='language') or pick modules that attend once per forward."
                )
            self._seen.add(key)
            P = probs[b]
            if torch.is_tensor(P):
                P = S.as_probs(P.detach(), check=mode == "full")  # stats mode checks inside layer_statistics
            sq, sk = P.shape[-2:]
            vis = visible_from_mask(mask, sq, sk, b)
            gate = self._gates.get(site.name)
            if gate is not None:  # rows whose output is discarded (text before the image): dead rows
                live = (gate[b if gate.shape[0] > 1 else 0].reshape(-1)[-sq:] != 0).to(P.device)
                vis = (torch.ones(sq, sk, dtype=torch.bool, device=P.device) if vis is None else vis) & live[:, None]
            vis = vis.to(P.device) if vis is not None else None
            cross = site.part == "cross"  # queries are text positions, keys the vision tokens
            if cross and vis is not None and bool(vis.any()) and not bool(vis.any(0).all()):
                seen = vis.any(0)  # keys no query can see (padded tiles): not part of the image, dropped
                P = P.materialize() if isinstance(P, S.LogitRows) else P
                P, vis, sk = P[..., seen], vis[:, seen], int(seen.sum())
            causal = vis if vis is not None else False
            sp = self._spans_for(b, site, sk)
            m = site.module  # a layer that may attend over a sliding window (its own setting, or its config's)
            if sp is not None and len(sp) > sk and (getattr(m, "sliding_window", None)
                                                     or getattr(getattr(m, "config", None), "sliding_window", None)):
                sp = Spans(sp.kinds[-sk:])  # a sliding-window layer's cache holds only the last keys
            if sp is not None:
                sp.check(sk, f"{site.name} attention map")
            if mode == "full":
                P = P.materialize() if isinstance(P, S.LogitRows) else P
                S.check_mask(P, S.Visibility.of(P, causal), f"{site.name} attention map")
                v = vis if vis is not None else torch.ones(sq, sk, dtype=torch.bool)
                data = {"probs": P[:, :: self.query_stride, :: self.key_stride].cpu().clone(),
                        "visible": v[:: self.query_stride, :: self.key_stride].cpu().clone()}
            else:
                data = {k: v.cpu() for k, v in S.layer_statistics(P, sp, causal, None if cross else torch.arange(sk - sq, sk),
                                                                  [TEXT] * sq if cross else None).items()}
            self.result.records.append(Record(
                sample=sample, layer=site.layer, part=site.part, mode=mode, data=data, spans=sp, seq_len=sk,
                heads=P.shape[0], query_stride=self.query_stride if mode == "full" else 1,
                key_stride=self.key_stride if mode == "full" else 1,
            ))

    def _mask_of(self, module, args, kwargs):
        if "attention_mask" in kwargs:
            return kwargs["attention_mask"]
        try:
            return inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments.get("attention_mask")
        except TypeError:
            return None

    def _hook(self, module, args, kwargs, output):
        site = self._by_module[id(module)]
        if not isinstance(output, tuple):
            if site.name in self._family_sites:  # an attention module that never hands out its weights
                raise CaptureError(f"{site.name} ({type(module).__name__}) never returns its attention weights, under any "
                                   f"implementation: capture it with mode='recompute'")
            raise CaptureError(
                f"{site.name} ({type(module).__name__}) returned a single tensor, not (output, weights): it is not "
                f"an attention module. Hook the layer's self_attn (see find_attention_modules(model))"
            )
        weights = output[1] if len(output) > 1 else None
        if weights is None:
            impl = config_attn_implementation(getattr(module, "config", None)) or language_attn_implementation(self.model)
            fix = "vision_attn_implementation='eager'" if site.part == "vision" else "attn_implementation='eager'"
            raise CaptureError(
                f"attention weights are not returned under {impl!r} ({site.name}): load with {fix} "
                f"or use capture mode 'recompute'"
            )
        # eager attention applies exactly the mask it receives (none at all when it gets None)
        self._record(site, weights, self._mask_of(module, args, kwargs), self.mode)

    def _gate_hook(self, name, kwarg):
        def pre(module, args, kwargs):
            self._gates[name] = kwargs.get(kwarg)
        return pre

    def _recompute_fn(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        out = transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw)
        site = self._by_module.get(id(module))
        if site is not None and kw.get("softcap") is not None:
            raise CaptureError(
                f"{site.name} soft-caps its attention logits (softcap={kw['softcap']}), which sdpa ignores: under sdpa the "
                f"model computes another attention than its own, and a recomputed map would describe that one. Load with "
                f"attn_implementation='eager' and capture in mode 'stats' or 'full'")
        if site is not None:
            with torch.no_grad():
                q, k = query, key
                if k.shape[1] != q.shape[1]:  # grouped-query attention: repeat key heads
                    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                scale = scaling if scaling is not None else q.shape[-1] ** -0.5
                sq, sk = q.shape[-2], k.shape[-2]
                # exactly sdpa's rule (transformers' sdpa_attention_forward): causal only without a mask
                flag = kw.get("is_causal")
                flag = flag if flag is not None else getattr(module, "is_causal", True)
                mask = attention_mask[..., :sk] if attention_mask is not None else None
                if sq > 1 and attention_mask is None and flag:  # torch's is_causal: top-left aligned lower triangle
                    mask = ~torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1)[None, None]
                # the map of each batch row from its logits, one chunk of query rows at a time (never whole
                # in stats mode); keep="full" materialises it. A mask of another layout (not 4-D, per head) is
                # refused by _record (visible_from_mask) before any statistic is taken
                maps = [S.LogitRows(q[b], k[b], scale, None if mask is None else mask[b if mask.shape[0] > 1 else 0, 0])
                        for b in range(q.shape[0])]
                self._record(site, maps, mask, "full" if self.keep == "full" else "stats")
        return out

    # ---- context management --------------------------------------------------------------------
    def __enter__(self) -> "AttentionCapture":
        if self._stack is not None:
            raise CaptureError("this AttentionCapture is already active: a capture cannot be entered inside itself "
                               "(its hooks would be installed twice and the outer exit would leave some behind). Use "
                               "one `with AttentionCapture(...)` block, or a second AttentionCapture object")
        # attention modules that would drop out attention weights now: in train() mode with a dropout > 0
        dropping = [f"{s.name} (dropout {p:g})" for s, p in ((s, _dropout(s.module)) for s in self.sites)
                    if s.module.training and isinstance(p, (int, float)) and p > 0]
        if dropping:
            raise CaptureError(f"the model is in train() mode with attention dropout ({', '.join(dropping[:2])}"
                               f"{', ...' if len(dropping) > 2 else ''}): the weights it returns are dropped-out "
                               f"probabilities whose rows do not sum to 1, not attention. Call model.eval() before "
                               f"capturing")
        captured = {s.name for s in self.sites}
        hooks = [(self.model, "forward_pre", self._begin_forward)] + [
            (layer, "forward_pre", self._gate_hook(name, kwarg))
            for name, (layer, kwarg) in self.family.row_gates(self.model).items() if name in captured]
        if self.mode != "recompute":
            ask = self.family.weights_argument  # modules that return weights only when asked
            for s in self.sites:
                hooks += [(s.module, "forward_pre", _ask_weights(*ask))] if ask is not None else []
                hooks.append((s.module, "forward", self._hook))
        with ExitStack() as stack:  # undone here if installing fails half-way
            stack.enter_context(forward_hooks(hooks))
            if self.mode == "recompute":
                stack.enter_context(_attn_impl(self.model, self._recompute_fn, {s.part for s in self.sites}))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc):
        self._stack.close()
        self._stack = None
        if exc[0] is None and len(self.result) == 0:
            raise CaptureError("the capture recorded nothing: run the model inside the `with` block "
                               "(and check that the chosen layers run in that forward)")
        return False


def _dropout(m):
    """An attention module's dropout rate: its ``attention_dropout``, else its ``dropout`` (a module or a number)."""
    p = getattr(m, "attention_dropout", None)
    return p if p is not None else getattr(getattr(m, "dropout", None), "p", getattr(m, "dropout", 0.0))


def _ask_weights(index: int, name: str):
    """A pre-hook that turns on the module's own switch for returning its weights (``output_attentions``,
    positional at ``index`` or by keyword); what the module computes is unchanged."""
    def pre(module, args, kwargs):
        if len(args) > index:
            args = args[:index] + (True,) + args[index + 1:]
        else:
            kwargs = dict(kwargs, **{name: True})
        return args, kwargs
    return pre


def full_capture_bytes(model, inputs: dict, layers=None, part="language") -> int:
    """Bytes a ``full`` capture keeps for one forward of ``inputs``: per captured attention module
    ``heads x Sq x Sk`` float32 probabilities plus the ``Sq x Sk`` mask. Cross-attention keys are the
    vision tokens (counted from the family)."""
    fam = family_of(model)
    S = int(inputs["input_ids"].shape[-1])
    sites = [s for s in attention_sites(model, part) if layers is None or s.layer in set(layers)]
    heads = [getattr(s.module, "num_heads", None) or model.config.get_text_config().num_attention_heads for s in sites]
    return sum(S * (fam.cross_keys(model.config, inputs) if s.part == "cross" else S) * (4 * int(h) + 1)
               for s, h in zip(sites, heads))


def _size(n_bytes: float) -> str:
    """Bytes in the unit that shows them: ``3.2 GB``, ``14 MB``, ``12 KB``."""
    for unit, k in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n_bytes >= k:
            return f"{n_bytes / k:.{1 if unit == 'GB' else 0}f} {unit}"
    return f"{n_bytes:.0f} bytes"


def check_memory(n_bytes: int, budget_gb: float | None, what: str = "a full capture", say: bool = True) -> None:
    """Print the estimate (unless ``say`` is False: a capture that is one step of a larger measurement); raise
    :class:`CaptureError` naming the alternatives when it is over budget."""
    if say:
        print(f"{what}: about {_size(n_bytes)} of attention maps"
              + (f" (budget {_size(budget_gb * 2**30)})" if budget_gb is not None else " (no budget set)"))
    if budget_gb is not None and n_bytes > budget_gb * 2**30:
        raise CaptureError(
            f"{what} would keep {_size(n_bytes)} of maps, over MEMORY_BUDGET_GB={budget_gb} ({_size(budget_gb * 2**30)}): "
            f"use mode='stats' (statistics only, O(heads x seq) per layer), capture a subset of layers (LAYERS=[...]), "
            f"keep the maps of fewer samples, or raise the budget")


@contextmanager
def _attn_impl(model, fn, parts=("language",)):
    """Route every attention call of the captured sub-models through ``fn`` (registered in
    transformers' ``AttentionInterface``, with sdpa's mask function registered under the same name so
    the model builds the masks sdpa would get), restoring every sub-model's implementation on exit."""
    subs = ({"text_config"} if {"language", "cross"} & set(parts) else set()) | (
        {"vision_config"} if "vision" in parts else set())
    old = attn_implementations(model)
    # the registries are global: keep what was there (an enclosing capture's function) to put it back
    before = attention_functions(_RECOMPUTE_NAME)
    transformers.AttentionInterface.register(_RECOMPUTE_NAME, fn)
    transformers.masking_utils.AttentionMaskInterface.register(_RECOMPUTE_NAME, transformers.masking_utils.sdpa_mask)
    set_attn_implementations(model, {k: (_RECOMPUTE_NAME if k in subs else v) for k, v in old.items()}
                             if isinstance(old, dict) else _RECOMPUTE_NAME)
    try:
        yield
    finally:
        set_attn_implementations(model, old)
        restore_attention_functions(before, _RECOMPUTE_NAME)  # no reference to this capture (and its model) stays
