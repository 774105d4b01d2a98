"""Prefill a context, remove cache entries, continue with the question on the compressed cache.

The context is everything up to and including the last image token; the question (and the
assistant prefix) comes after, as in a multi-turn chat where the image is cached once and
questions arrive later. Eviction happens between the two, so every answer token is produced on
the compressed cache. Positions continue from the *original* context length (rotary embeddings of
kept keys were applied at their original positions), which is why the answer is decoded with an
own loop rather than ``generate()`` (that would re-feed the context).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..capture.runner import build_prompt


@dataclass
class PromptSplit:
    """``context_ids [1, C]`` (ends with the last image token), ``question_ids [1, Q]``, the image
    inputs, and which context positions are image tokens (``image_positions [n_image]``)."""

    context_ids: torch.Tensor
    question_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_positions: torch.Tensor
    extra: dict


def split_prompt(processor, image, question: str, image_token_id: int | None = None) -> PromptSplit:
    enc = processor(images=[image], text=[build_prompt(processor, question)], return_tensors="pt")
    ids = enc["input_ids"]
    tid = image_token_id if image_token_id is not None else processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    img = (ids[0] == tid).nonzero().flatten()
    if len(img) == 0:
        raise ValueError("the prompt has no image tokens: check the processor's image token")
    cut = int(img[-1]) + 1
    extra = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
    return PromptSplit(ids[:, :cut], ids[:, cut:], enc["pixel_values"], img, extra)


@dataclass
class Prefill:
    """The context's cache, its last-position logits, and per-layer attention ``[H, C, C]`` (float32;
    empty when not requested)."""

    cache: object
    attentions: list
    split: PromptSplit

    def context(self, seed: int = 0, future=None):
        from .policies.base import EvictionContext

        return EvictionContext(self.split.context_ids.shape[1], self.split.image_positions,
                               len(self.cache.layers), self.attentions, seed, future)


@torch.no_grad()
def prefill(model, split: PromptSplit, attentions: bool = True) -> Prefill:
    """Run the context once. ``attentions`` needs an eager model (``output_attentions``)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=split.context_ids, pixel_values=split.pixel_values, past_key_values=cache, use_cache=True,
                output_attentions=attentions, **split.extra)
    att = [a[0].float() for a in out.attentions] if attentions else []
    if attentions and any(a is None for a in out.attentions or [None]):
        raise RuntimeError("attention weights are not returned under sdpa: load with attn_implementation='eager'")
    return Prefill(out.past_key_values, att, split)


def evict(cache, keep: list[torch.Tensor]):
    """A copy of ``cache`` holding, in layer ``l``, only the positions ``keep[l]`` (sorted, same count in
    every layer: one causal mask serves all layers). The original cache is left intact."""
    if len(keep) != len(cache.layers):
        raise ValueError(f"{len(keep)} keep lists for {len(cache.layers)} cache layers")
    counts = {len(k) for k in keep}
    if len(counts) != 1:
        raise ValueError(f"every layer must keep the same number of positions, got {sorted(counts)}")
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    for layer, idx in zip(new.layers, keep):
        idx = torch.as_tensor(idx, dtype=torch.long).sort().values.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
    return new


def kv_bytes(cache) -> int:
    """Bytes of keys and values held."""
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)


@torch.no_grad()
def answer(model, cache, split: PromptSplit, max_new_tokens: int = 1, eos_token_id: int | None = None,
           output_attentions: bool = False):
    """Feed the question on ``cache`` (which is extended in place) and decode greedily.

    Returns ``(first_logits [vocab] float32, generated ids list, attentions of the question pass or None)``.
    Positions continue from the original context length whatever the cache holds.
    """
    c = split.context_ids.shape[1]
    held = cache.get_seq_length()
    q = split.question_ids
    pos = torch.arange(c, c + q.shape[1])[None]
    out = model(input_ids=q, past_key_values=cache, position_ids=pos, attention_mask=torch.ones(1, held + q.shape[1], dtype=torch.long),
                use_cache=True, output_attentions=output_attentions)
    first = out.logits[0, -1].float()
    ids = [int(first.argmax())]
    nxt, p = ids[0], c + q.shape[1]
    for _ in range(max_new_tokens - 1):
        if eos_token_id is not None and nxt == eos_token_id:
            break
        held = cache.get_seq_length()
        o = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, position_ids=torch.tensor([[p]]),
                  attention_mask=torch.ones(1, held + 1, dtype=torch.long), use_cache=True)
        nxt = int(o.logits[0, -1].argmax())
        ids.append(nxt)
        p += 1
    return first, ids, (out.attentions if output_attentions else None)
