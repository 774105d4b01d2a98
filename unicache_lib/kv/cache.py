"""Prefill a context, remove cache entries, continue with the question on the compressed cache.

The context is everything up to and including the last image token; the question (and the
assistant prefix) comes after, as in a multi-turn chat where the image is cached once and
questions arrive later. Eviction happens between the two, so every answer token is produced on
the compressed cache. Positions continue from the *original* context (rotary embeddings of kept
keys were applied at their original positions; M-RoPE families continue from the image's largest
position), which is why the answer is decoded with an own loop rather than ``generate()`` (that
would re-feed the context).

Where the image KV lives depends on the family (:mod:`unicache_lib.families`): for models that
splice image tokens into the sequence it is those positions in every self-attention layer; for a
cross-attention VLM (Mllama) it is the vision-token keys and values of the cross-attention layers,
while the self-attention cache holds only text.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import partial

import torch

from ..capture.runner import to_model
from ..capture.vlm import AttentionCapture
from ..core.errors import ContractError, InputError, PrefillPruningUnsupported, PromptError, UnsupportedModelError
from ..core.hooks import forward_hooks
from ..core.models import language_attn_implementation, transformers
from ..families import FAMILIES, family_of, supported
from ..families.base import ImageKV  # declared with the adapters, which return it
from .policies.base import EvictionContext, copy_layers, non_image
from .policies.merge import layer_masks
from ..inputs import encode, encode_batch


@dataclass
class PromptSplit:
    """``context_ids [1, C]`` (ends with the last image token), ``question_ids [1, Q]``, the processor
    output of the whole prompt (``inputs``), which context positions are image tokens
    (``image_positions [n_image]``) and the family adapter."""

    context_ids: torch.Tensor
    question_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_positions: torch.Tensor
    extra: dict
    inputs: dict = field(default_factory=dict)
    family: object = None

    @property
    def full_ids(self) -> torch.Tensor:
        return torch.cat([self.context_ids, self.question_ids], 1)


def _family_of_processor(processor):
    name = type(processor).__name__
    for fam in FAMILIES.values():
        if name == f"{fam.model_class.replace('ForConditionalGeneration', '')}Processor":
            return fam
    raise UnsupportedModelError(f"cannot tell the model family from a {name}: pass model= (supported: {supported()})")


def split_prompt(processor, image, question: str | None, image_token_id: int | None = None, model=None, *,
                 prompt: str | None = None) -> PromptSplit:
    """Encode one (image, question) prompt and cut it after the last image token.

    ``model`` (recommended) names the family; without it the family is inferred from the processor's
    class. Per-token processor outputs (``token_type_ids``, Mllama's ``cross_attention_mask``) are
    cut with the ids. The image and the prompt (``prompt``: a whole prompt of your own instead of the
    family's template around ``question``) are checked by :func:`unicache_lib.inputs.encode`.
    """
    fam = family_of(model) if model is not None else _family_of_processor(processor)
    enc = encode(processor, image, question, fam, prompt)
    return split_inputs(fam, dict(enc), _image_token_id(processor) if image_token_id is None else image_token_id)


def _image_token_id(processor) -> int:
    """The processor's image token id (its attribute, or its image token through the tokenizer)."""
    tid = getattr(processor, "image_token_id", None)
    return processor.tokenizer.convert_tokens_to_ids(processor.image_token) if tid is None else tid


def split_prompts(processor, images, questions, model) -> list[PromptSplit]:
    """:func:`split_prompt` for many (image, question) pairs, encoded in one processor call
    (:func:`~unicache_lib.inputs.encode_batch`); each split equals :func:`split_prompt`'s for its pair."""
    fam = family_of(model)
    tid = _image_token_id(processor)
    return [split_inputs(fam, enc, tid) for enc in encode_batch(processor, images, questions, fam)]


def split_inputs(family, enc: dict, image_token_id: int) -> PromptSplit:
    """:func:`split_prompt` for inputs already encoded (e.g. built by hand when a processor is not
    available): ``enc`` holds ``input_ids [1, S]`` and the image inputs; ``image_token_id`` is the
    token after whose last occurrence the context ends (``model.config.image_token_id``)."""
    ids = enc["input_ids"]
    if ids.shape[0] != 1:
        raise InputError(f"one prompt at a time: got a batch of {ids.shape[0]}")
    tid = int(image_token_id)
    img = (ids[0] == tid).nonzero().flatten()
    if len(img) == 0:
        raise PromptError(f"the prompt has no image token (id {tid}): the processor did not insert the image; put the "
                          f"family's image marker {family.image_marker!r} in the prompt where the image goes, or build the "
                          f"inputs with split_prompt(processor, image, question, model=model)")
    cut = int(img[-1]) + 1
    S = ids.shape[1]
    extra = {}
    for k, v in enc.items():
        if k in ("input_ids", "attention_mask", "pixel_values", "labels"):
            continue
        if k in family.token_fields and torch.is_tensor(v) and v.dim() >= 2 and v.shape[1] == S:
            v = v[:, :cut]
        extra[k] = v
    image_positions = torch.empty(0, dtype=torch.long) if family.cross_attention else img
    return PromptSplit(ids[:, :cut], ids[:, cut:], enc.get("pixel_values"), image_positions, extra, dict(enc), family)


def placement(model) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of ``model``'s parameters."""
    p = next(model.parameters())
    return p.device, p.dtype


def full_positions(fam, model, split: PromptSplit):
    """The family's own position ids of the whole prompt (M-RoPE), or None where positions are 0..S-1."""
    dev, dtype = placement(model)
    return fam.position_ids(model, split.full_ids.to(dev), to_model(split.inputs, dev, dtype))


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


@torch.no_grad()
def prefill(model, split: PromptSplit, attentions: bool = True, locate: bool = True) -> Prefill:
    """Run the context once. ``attentions`` needs an eager model (the maps are captured). ``locate=False``
    leaves ``image_kv`` unset (the caller locates it, e.g. after pruning the sequence)."""
    fam = family_of(model)
    split.family = fam
    dev, dtype = placement(model)
    full_pos = full_positions(fam, model, split)
    cache = transformers.DynamicCache(config=model.config)
    kw = dict(input_ids=split.context_ids.to(dev), past_key_values=cache, use_cache=True,
              **to_model(split.extra, dev, dtype))
    if split.pixel_values is not None:
        kw["pixel_values"] = split.pixel_values.to(dev, dtype)
    if full_pos is not None:
        kw["position_ids"] = full_pos[..., : split.context_ids.shape[1]]
    out, records = forward_context(model, kw, attentions, "prefill", "call prefill(..., attentions=False)")
    maps = [r.probs for r in records]
    if not locate:
        return Prefill(out.past_key_values, maps, split, None, full_pos)
    return located(fam, model, out.past_key_values, maps, split, full_pos)


def forward_context(model, kw: dict, attentions: bool, who: str, instead: str, sample_ids=None):
    """``(model(**kw), the captured attention records sorted by layer)``; with ``attentions`` False no records. The
    maps need eager attention: another implementation is refused, naming ``who`` and the call to make ``instead``."""
    if not attentions:
        return model(**kw), []
    impl = language_attn_implementation(model)
    if impl != "eager":
        raise ContractError(f"{who} reads the context's attention, which {impl!r} does not return: load with "
                            f"attn_implementation='eager' (or {instead} for policies that need none)")
    with AttentionCapture(model, "full", part=family_of(model).image_part, spans=None, sample_ids=sample_ids) as cap:
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
    if pv is None or pv.dim() != 4 or pv.shape[0] != 1:
        return None
    dev, dtype = placement(model)

    @torch.no_grad()
    def encode(rows, cols):
        return fam.image_features_at(model, pv.to(dev, dtype), rows, cols)
    return encode


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
    fam = family_of(model)
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
        merged = None
        if isinstance(picked, tuple):  # (indices, the embeddings those tokens take): a merge such as pooling
            picked, merged = picked
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
    kept_img = torch.isin(keep, img).nonzero().flatten()
    # answered with the original split (positions from the original length) unless renumbered
    reduced = PromptSplit(split.context_ids[:, keep], split.question_ids, None, kept_img, {}, {}, fam)
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


@torch.no_grad()
def answer(model, cache, split: PromptSplit, max_new_tokens: int = 1, eos_token_id: int | None = None,
           output_attentions: bool = False):
    """Feed the question on ``cache`` (which is extended in place) and decode greedily.

    Returns ``(first_logits [vocab] float32, generated ids list, attentions or None)``; with
    ``output_attentions`` (eager) the question pass's attention of every image-KV layer,
    ``[1, H, Q, K]`` each (K = the keys that layer holds). Positions continue from the original
    context whatever the cache holds.
    """
    fam = family_of(model)
    dev = placement(model)[0]
    c = split.context_ids.shape[1]
    q = split.question_ids.to(dev)
    pos = fam.text_positions(full_positions(fam, model, split), c, q.shape[1], dev)
    atts = None
    if output_attentions:
        with AttentionCapture(model, "full", part=fam.image_part, spans=None) as cap:
            out = forward_question(fam, model, q, cache, pos)
        atts = [r.probs[None] for r in sorted(cap.result.records, key=lambda r: r.layer)]
    else:
        out = forward_question(fam, model, q, cache, pos)
    first = out.logits[0, -1].float()
    ids = [int(first.argmax())]
    nxt, p = ids[0], pos[..., -1:] + 1
    for _ in range(max_new_tokens - 1):
        if eos_token_id is not None and nxt == eos_token_id:
            break
        o = forward_question(fam, model, torch.tensor([[nxt]], device=dev), cache, p)
        nxt = int(o.logits[0, -1].argmax())
        ids.append(nxt)
        p = p + 1
    return first, ids, atts


def forward_question(family, model, ids, cache, positions):
    """One forward of text tokens ``ids [1, n]`` on ``cache`` at rotary ``positions``."""
    custom = family.forward_text(model, ids, cache, positions)
    if custom is not None:
        return custom
    held = cache.get_seq_length()
    with layer_masks(model, every_layer=True) if is_ragged(cache) else contextlib.nullcontext():
        return model(input_ids=ids, past_key_values=cache, position_ids=positions,
                     attention_mask=torch.ones(1, held + ids.shape[1], dtype=torch.long, device=ids.device),
                     use_cache=True)


def is_ragged(cache) -> bool:
    """Whether the cache's self-attention layers hold different numbers of positions."""
    return len({layer.keys.shape[-2] for layer in cache.layers if getattr(layer, "keys", None) is not None}) > 1

