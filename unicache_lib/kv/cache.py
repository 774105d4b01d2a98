"""Prefill a context, remove cache entries, continue with the question on the compressed cache.

    split = split_prompt(processor, image, question, model=model)   # kv/prompt.py: context | question
    pre = prefill(model, split)                                     # the context's cache (+ attention)
    keep = POLICIES["h2o"]().select(pre.context(), budget=0.25)     # or policy.apply(model, pre, ctx, budget)
    first, ids, _ = answer(model, evict(pre.cache, keep), split)     # kv/decode.py: the question on it

The context is everything up to and including the last image token; the question (and the
assistant prefix) comes after, as in a multi-turn chat where the image is cached once and
questions arrive later. Eviction happens between the two, so every answer token is produced on
the compressed cache (:mod:`~.decode`).

Where the image KV lives depends on the family (:mod:`unicache_lib.families`): for models that
splice image tokens into the sequence it is those positions in every self-attention layer; for a
cross-attention VLM (Mllama) it is the vision-token keys and values of the cross-attention layers,
while the self-attention cache holds only text.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..capture.runner import to_model
from ..capture.vlm import AttentionCapture
from ..core.compat import transformers
from ..core.errors import ContractError, InputError, PrefillPruningUnsupported
from ..core.hooks import forward_hooks
from ..core.models import language_attn_implementation, placement
from ..families.base import ImageKV  # declared with the adapters, which return it
from ..inputs import check_fraction
# the prompt's split (kv/prompt.py) and the answer on a cache (kv/decode.py), importable from here too
from .decode import answer, forward_question, is_ragged, layer_masks  # noqa: F401
from .prompt import PromptSplit, full_positions, split_inputs, split_prompt, split_prompts  # noqa: F401


@dataclass
class Prefill:
    """The context's cache, per image-KV layer the context's attention ``[H, C, K]`` (float32; empty
    when not requested), the split, and where the image KV lives."""

    cache: object
    attentions: list
    split: PromptSplit
    image_kv: ImageKV = None
    positions: torch.Tensor | None = None
    encode: object = None  # (rows, cols) -> [rows * cols, D]: the picture re-encoded coarser (EvictionContext.encode)
    first_keys: object = None  # (embeddings [n, hidden]) -> [n, H_kv * D]: the first layer's keys (EvictionContext)

    def context(self, seed: int = 0, future=None):
        kv = self.image_kv
        layers = self.cache.layers
        reads = [(lambda li=li: (layers[li].keys[0], layers[li].values[0])) for li in kv.layers]
        return EvictionContext(kv.length, kv.positions, len(kv.layers), self.attentions, seed, future,
                               cache_layers=kv.layers, n_cache_layers=len(self.cache.layers),
                               keep_always=kv.keep_always, grid=kv.grid, kv=reads, encode=self.encode,
                               first_keys=self.first_keys)


@dataclass
class EvictionContext:
    """What a policy may look at (:meth:`Prefill.context` builds it).

    ``seq_len``: length C of the image-holding cache layers; ``image_positions [n_image]`` in them;
    ``n_layers``: how many layers hold image KV (policy layer ``i`` is cache layer
    ``cache_layers[i]``, all cache layers by default); ``attentions``: per such layer ``[H, Cq, C]``
    float32 prefill attention (empty if not captured); ``future``: per such layer ``[C]`` attention mass
    the question's queries put on each key (oracle only); ``keep_always``: positions every policy keeps
    (default: every non-image position); ``grid``: indices into the image block of the tokens that tile the
    picture row by row (None: the family's image tokens form no single grid); ``kv``: per such layer a
    zero-argument callable returning that layer's cached ``(keys, values)``, each ``[H_kv, C, D]`` (read
    lazily: a 7B model's float32 copies of every layer would not fit beside it); ``features``: ``[n_image, D]``
    the image embeddings the language model receives (prefill-stage policies only); ``encode``: ``(rows, cols) ->
    [rows * cols, D]``, the picture re-encoded at a coarser patch grid by the family's vision tower (the
    downsampled-image control; :meth:`~unicache_lib.families.base.VLMFamily.image_features_at`); ``first_keys``:
    ``(embeddings [n, hidden]) -> [n, H_kv * D]``, the keys the first language-model layer computes for them
    (:meth:`~unicache_lib.families.base.VLMFamily.first_layer_keys`).
    """

    seq_len: int
    image_positions: torch.Tensor
    n_layers: int
    attentions: list
    seed: int = 0
    future: list | None = None
    cache_layers: list | None = None
    n_cache_layers: int | None = None
    keep_always: torch.Tensor | None = None
    grid: torch.Tensor | None = None
    kv: list | None = None
    features: torch.Tensor | None = None
    encode: object = None
    first_keys: object = None

    @property
    def n_image(self) -> int:
        return len(self.image_positions)

    def k(self, budget: float) -> int:
        """Image positions kept at ``budget`` (a fraction of the image tokens in [0, 1]; a string or a
        count is refused by :func:`~unicache_lib.inputs.check_fraction`)."""
        budget = check_fraction(budget, "budget", meaning="of the image tokens kept")
        k = int(round(budget * self.n_image))
        if k == 0 and budget > 0 and self.n_image:  # a budget meant to keep something that keeps nothing: said, never run silently
            raise InputError(f"budget {budget:g} keeps no image token of this picture's {self.n_image}: round({budget:g} "
                             f"x {self.n_image}) = 0; the smallest budget that keeps one is 1/{self.n_image} = "
                             f"{1 / self.n_image:.3g} (or '1t' through unicache_lib.inputs.budget_shares)")
        return k

    def assemble(self, chosen: list) -> list:
        """Per cache layer: the always-kept positions plus the chosen image positions (indices into
        the image block, 0..n_image-1), as sorted cache positions; None for cache layers that hold no
        image KV (left as they are)."""
        img = self.image_positions
        other = non_image(self.seq_len, img) if self.keep_always is None else self.keep_always
        per = [torch.cat([other, img[torch.as_tensor(np.asarray(ch), dtype=torch.long).reshape(-1)]]).sort().values
               for ch in chosen]
        if self.cache_layers is None or list(self.cache_layers) == list(range(self.n_cache_layers or len(per))):
            return per
        placed = dict(zip(self.cache_layers, per))
        return [placed.get(li) for li in range(self.n_cache_layers)]

    def image_reads(self, layer: int) -> torch.Tensor:
        """``[n_image]``: attention each image key receives from all context queries, mean over heads."""
        if not self.attentions:
            raise InputError("this policy needs the prefill attention: prefill(..., attentions=True) on an eager model")
        return self.attentions[layer].mean(0).sum(0)[self.image_positions]

    def image_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of the image positions in policy layer ``layer``, each ``[H_kv, n_image, D]``
        float32 (keys after the rotary embedding, as cached)."""
        if not self.kv:
            raise InputError("this policy reads the cached keys and values: build the context with Prefill.context()")
        k, v = self.kv[layer]()
        idx = self.image_positions.to(k.device)
        return k.index_select(-2, idx).float(), v.index_select(-2, idx).float()


@dataclass
class Compressed:
    """What a policy leaves of a prefilled context (:meth:`~.policies.base.EvictionPolicy.apply`): the ``cache`` to
    answer on and the ``split`` to answer it with (the prefill's own, or a pruned one); ``keep``: per cache layer the
    context positions kept (None: a layer left as it is); ``bias``: cache layer -> the additive attention term on its
    keys for every later query (``[C]``; a merge's ``log(size)``), or None; ``prefill_tokens`` / ``prefill_ms``: the
    positions and time of a prefill the policy ran itself (on the kept tokens only), None when it reused the full one."""

    cache: object
    split: PromptSplit
    keep: list
    bias: dict | None = None
    prefill_tokens: int | None = None
    prefill_ms: float | None = None

    @property
    def kept(self) -> list:
        """Per image-KV layer, the context positions kept."""
        return [k for k in self.keep if k is not None]


@torch.no_grad()
def prefill(model, split: PromptSplit, attentions: bool = True, locate: bool = True) -> Prefill:
    """Run the context once. ``attentions`` needs an eager model (the maps are captured). ``locate=False``
    leaves ``image_kv`` unset (the caller locates it, e.g. after pruning the sequence)."""
    return prefill_contexts(model, [split], attentions, locate)[0]


@torch.no_grad()
def prefill_contexts(model, splits: list[PromptSplit], attentions: bool = True, locate: bool = True) -> list[Prefill]:
    """The contexts of ``splits`` in one forward, one :class:`Prefill` each, as :func:`prefill` gives it for one.

    One split is batch 1 (the family's own positions, any family). Several (:func:`~.batch.prefill_batch`, the
    harness's batches) must share one context length and a family :func:`~.batch.check_batchable` lets batch, so
    nothing is padded: every sample's positions, maps and cache are those of its own prefill (its cache is its row of
    the batch's, ``[1, H, C, D]`` per layer; its maps ``[H, C, C]`` float32 when ``attentions``). The family is the
    one the splits were made for (``split.family``)."""
    fam, one = splits[0].family, len(splits) == 1
    dev, dtype = placement(model)
    extra = splits[0].extra if one else {k: _stack([sp.extra[k] for sp in splits]) for k in splits[0].extra}
    ids = splits[0].context_ids if one else torch.cat([sp.context_ids for sp in splits])
    # on the model's device: the context's inputs, and (one prompt) the whole prompt's, for the family's positions
    extra, whole = to_model(extra, dev, dtype), to_model(splits[0].inputs, dev, dtype) if one else None
    full_pos = None if whole is None else fam.position_ids(model, splits[0].full_ids.to(dev), whole)
    kw = dict(input_ids=ids.to(dev), past_key_values=transformers.DynamicCache(config=model.config), use_cache=True,
              **extra)
    if splits[0].pixel_values is not None:
        pv = splits[0].pixel_values if one else torch.cat([sp.pixel_values for sp in splits])
        kw["pixel_values"] = pv.to(dev, dtype)
    if full_pos is not None:
        kw["position_ids"] = full_pos[..., : ids.shape[1]]
    who = ("prefill", "call prefill(..., attentions=False)") if one else ("prefill_batch", "attentions=False")
    out, records = forward_context(model, fam, kw, attentions, *who, None if one else range(len(splits)))
    if one:
        maps = [[r.probs for r in records]]
        return [located(fam, model, out.past_key_values, maps[0], splits[0], full_pos) if locate
                else Prefill(out.past_key_values, maps[0], splits[0], None, full_pos)]
    maps = [[r.probs for r in records if int(r.sample) == b] for b in range(len(splits))]
    pres = []
    for b, sp in enumerate(splits):
        row = copy_layers(out.past_key_values)
        for layer in row.layers:
            layer.keys, layer.values = layer.keys[b:b + 1], layer.values[b:b + 1]
        pres.append(located(fam, model, row, maps[b], sp, None))
    return pres


def _stack(values: list):
    """Batch rows of one processor output: tensors concatenated on dim 0, anything else taken from the first."""
    v0 = values[0]
    return torch.cat(values, 0) if torch.is_tensor(v0) and v0.dim() >= 1 else v0


def forward_context(model, family, kw: dict, attentions: bool, who: str, instead: str, sample_ids=None):
    """``(model(**kw), the captured attention records sorted by layer)``; with ``attentions`` False no records. The
    maps need eager attention: another implementation is refused, naming ``who`` and the call to make ``instead``.
    ``family``: the model's adapter (``split.family``)."""
    if not attentions:
        return model(**kw), []
    impl = language_attn_implementation(model)
    if impl != "eager":
        raise ContractError(f"{who} reads the context's attention, which {impl!r} does not return: load with "
                            f"attn_implementation='eager' (or {instead} for policies that need none)")
    with AttentionCapture(model, "full", part=family.image_part, spans=None, sample_ids=sample_ids) as cap:
        out = model(**kw)
    return out, sorted(cap.result.records, key=lambda r: r.layer)


def located(fam, model, cache, maps: list, split: PromptSplit, positions) -> Prefill:
    """The :class:`Prefill` of a fresh prefill of ``split`` (``cache`` of batch 1), its image KV located."""
    image_kv = locate_image_kv(fam, model, cache, split)
    image_kv.grid = fam.grid_tokens(model.config, split.inputs)
    if image_kv.key_index is not None:  # the family trimmed the cache (e.g. padded tiles): trim the maps alike
        maps = [m[..., image_kv.key_index] for m in maps]
    return Prefill(cache, maps, split, image_kv, positions, picture_encoder(fam, model, split),
                   partial(fam.first_layer_keys, model))


def picture_encoder(fam, model, split: PromptSplit):
    """``(rows, cols) -> [rows * cols, D]``: the split's picture re-encoded at a coarser patch grid by the family's tower
    (:meth:`~unicache_lib.families.base.VLMFamily.image_features_at`); None when the split holds no single picture."""
    pv = split.pixel_values
    return None if pv is None or pv.dim() != 4 or pv.shape[0] != 1 else partial(_encode_picture, fam, model, pv)


@torch.no_grad()
def _encode_picture(fam, model, pixel_values, rows: int, cols: int):
    dev, dtype = placement(model)
    return fam.image_features_at(model, pixel_values.to(dev, dtype), rows, cols)


@torch.no_grad()
def prefill_pruned(model, split: PromptSplit, choose, renumber: bool = True) -> tuple[Prefill, PromptSplit, torch.Tensor]:
    """Prefill the context with image tokens dropped *before* the language model (prefill-stage pruning, as
    DivPrune or VisionZip do it): the prefill itself runs on the kept tokens only.

    ``choose(features)``: ``features [n_image, D]`` float32, the image embeddings the language model would
    receive; returns indices into the image block to keep, or ``(indices, embeddings [k, D])`` for the kept tokens to
    take instead of their own (a merge, e.g. pooling). ``renumber``: the kept context gets consecutive
    positions, as when the pruned sequence is fed to the model (the published methods' setting), and the
    question continues from its length; else every kept token keeps its original position and the question
    continues from the original length, as after cache eviction. Returns the prefill of the kept context (no
    attention maps), the split to answer on and the kept context positions ``[C']`` (indices into the
    original context).
    Families with their own position scheme (M-RoPE), their own mask (a dict or 4-D mask handed to the
    language model) or cross-attention image KV are refused: the pruned sequence would be fed wrong positions
    or masks.
    """
    fam = split.family
    if fam.cross_attention or full_positions(fam, model, split) is not None:
        raise PrefillPruningUnsupported(f"{fam.name}: prefill-stage pruning is implemented for families that splice image tokens into a "
                         f"sequence with positions 0..S-1; this one {'keeps its image KV in cross-attention layers' if fam.cross_attention else 'numbers positions itself (M-RoPE)'}. "
                         f"Use a cache-stage policy (evicted after the prefill) instead.")
    img = split.image_positions
    C = split.context_ids.shape[1]
    state = {}

    def prune(module, args, kwargs):
        if "keep" in state:  # only the prefill call
            return None
        emb = kwargs.get("inputs_embeds")
        if emb is None or emb.shape[1] != C:
            raise ContractError(f"{fam.name}: the language model was not handed the {C} context embeddings as "
                               f"inputs_embeds, so the image tokens cannot be pruned before it")
        mask = kwargs.get("attention_mask")
        if mask is not None and not (torch.is_tensor(mask) and mask.dim() == 2):
            raise PrefillPruningUnsupported(f"{fam.name}: the model hands its language model a prebuilt {type(mask).__name__} mask; "
                             f"prefill-stage pruning only rewrites a 2-D padding mask. Use a cache-stage policy.")
        picked = choose(emb[0, img.to(emb.device)].float())
        # (indices, the embeddings those tokens take): a merge such as pooling
        picked, merged = picked if isinstance(picked, tuple) else (picked, None)
        chosen = torch.as_tensor(picked, dtype=torch.long).reshape(-1).cpu()
        if len(set(chosen.tolist())) != len(chosen) or (len(chosen) and (chosen.min() < 0 or chosen.max() >= len(img))):
            raise ContractError(f"a prefill-stage policy must choose distinct indices in 0..{len(img) - 1}")
        keep = torch.cat([non_image(C, img), img[chosen]]).sort().values
        state["keep"] = keep
        if merged is not None:
            if tuple(merged.shape) != (len(chosen), emb.shape[-1]):
                raise ContractError(f"a merging prefill-stage policy must return [{len(chosen)}, {emb.shape[-1]}] embeddings, "
                                   f"got {tuple(merged.shape)}")
            emb = emb.clone()
            emb[0, img[chosen].to(emb.device)] = merged.to(emb.dtype)
        kwargs["inputs_embeds"] = emb[:, keep.to(emb.device)]
        if mask is not None:
            kwargs["attention_mask"] = mask[:, keep.to(mask.device)]
        kwargs["cache_position"] = torch.arange(len(keep), device=emb.device)
        kwargs["position_ids"] = None if renumber else keep[None].to(emb.device)  # None: consecutive
        return args, kwargs

    with forward_hooks([(fam.language_model(model), "forward_pre", prune)]):
        out = prefill(model, split, attentions=False, locate=False)
    keep = state["keep"]
    # answered with the original split (positions from the original length) unless renumbered
    reduced = PromptSplit(split.context_ids[:, keep], split.question_ids, None, torch.isin(keep, img).nonzero().flatten(),
                          {}, {}, fam)
    out.split = reduced if renumber else split
    out.image_kv = locate_image_kv(fam, model, out.cache, reduced)
    return out, out.split, keep


def locate_image_kv(family, model, cache, split: PromptSplit) -> ImageKV:
    """Where the image KV of a fresh prefill lives (the family may trim the cache, e.g. padded tiles)."""
    custom = family.image_kv(model, cache, split)
    if custom is not None:
        return custom
    C = split.context_ids.shape[1]
    _check_windows(cache, C + split.question_ids.shape[1])
    return ImageKV(list(range(len(cache.layers))), split.image_positions, non_image(C, split.image_positions), C)


def _check_windows(cache, needed: int) -> None:
    for i, layer in enumerate(cache.layers):
        w = getattr(layer, "sliding_window", None)
        if w is not None and needed >= w:
            raise InputError(
                f"cache layer {i} is a sliding-window layer (window {w}) and the context plus question need {needed} "
                f"positions: it no longer holds the whole image, so evicting from it is not defined. Use a shorter "
                f"prompt or a model without sliding windows for eviction experiments."
            )


def non_image(n: int, img: torch.Tensor) -> torch.Tensor:
    """The positions ``0..n-1`` not in ``img``, sorted."""
    return torch.tensor(sorted(set(range(n)) - set(img.tolist())), dtype=torch.long)


def copy_layers(cache):
    """A shallow copy of ``cache`` with its own layer objects (tensors shared), so keys and values can be reassigned."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    return new


def evict(cache, keep: list):
    """A copy of ``cache`` holding, in layer ``l``, only the positions ``keep[l]`` (None = the layer is
    left as it is). Layers may keep different counts (a depth schedule): :func:`answer` then gives each its own
    mask. The original cache is left intact."""
    if len(keep) != len(cache.layers):
        raise InputError(f"{len(keep)} keep lists for {len(cache.layers)} cache layers")
    new = copy_layers(cache)
    for layer, idx in zip(new.layers, keep):
        if idx is None:
            continue
        idx = torch.as_tensor(idx, dtype=torch.long).sort().values.to(layer.keys.device)
        if len(idx) and (int(idx[-1]) >= layer.keys.shape[-2] or int(idx[0]) < 0):
            raise InputError(f"keep positions up to {int(idx[-1])} for a cache layer of {layer.keys.shape[-2]}")
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
        if hasattr(layer, "cumulative_length"):  # sliding-window layers count what they hold
            layer.cumulative_length = layer.keys.shape[-2]
    return new


def kv_bytes(cache) -> int:
    """Bytes of keys and values held."""
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)
