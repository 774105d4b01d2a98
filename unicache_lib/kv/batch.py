"""Eviction on a batch of prompts: one prefill and one question pass serve many questions.

    pres = prefill_batch(model, splits)                    # splits: split_prompt(...) per question
    caches = [evict(p.cache, policy.select(p.context(), 0.25)) for p in pres]
    first = answer_batch(model, caches, splits)            # [B, vocab]: each question's first answer token

How it stays equal to batch 1:

- **Prefill**: questions are grouped by context length, so a prefill batch needs no padding: every sample's
  positions, attention maps and cache are those of its own prefill (one record per batch row). Each sample gets
  its own :class:`~.cache.Prefill` whose cache is its row of the batch's cache, so a policy chooses exactly as
  at batch 1, per sample and per layer.
- **Answer**: the evicted caches are stacked (every sample keeps the same count per layer when the contexts
  are equal; shorter ones are left-padded and masked otherwise), the questions right-padded, each position
  numbered from its own original context length, and each answer read at its own last question token, under a
  per-sample attention mask.

The harness (:func:`~.evaluate.run_eviction`) answers here only a batch of more than one question; one question is
answered by batch 1's own :func:`~.decode.answer`. Greedy answers equal batch-1 answers on the shipped model on a CPU
(``tests/test_kv.py`` checks ``torch.equal`` on the ids); logits agree to float rounding (a batched matrix product may
sum in another order), so on a GPU in half precision an answer whose two best tokens nearly tie can differ from
batch 1's. Memory: a prefill batch holds every sample's float32 attention maps at once (``[H, C, C]`` per layer and
sample: about 1.5 GB per sample on a 7B model with 576 image tokens), so size ``batch_size`` to the device. Families
that number positions themselves (M-RoPE), keep the image KV in cross-attention layers or need their own question
forward are refused with what to use instead (batch size 1).
"""
from __future__ import annotations

import contextlib
import copy

import torch

from ..core.compat import transformers
from ..core.errors import InputError, UnsupportedError
from ..core.models import placement
from ..families.base import VLMFamily
from .cache import Prefill, prefill_contexts
from .decode import is_ragged, layer_masks
from .prompt import PromptSplit


def check_batchable(family) -> None:
    """Raise :class:`~unicache_lib.core.errors.UnsupportedError` (saying to use batch size 1) when the family adapter
    ``family`` (a split's ``family``, or ``family_of(model)``) cannot run eviction in batches here."""
    why = None
    if family.cross_attention:
        why = "keeps its image KV in cross-attention layers"
    elif type(family).forward_text is not VLMFamily.forward_text or type(family).image_kv is not VLMFamily.image_kv:
        why = "needs its own question forward or cache layout"
    elif type(family).position_ids is not VLMFamily.position_ids:
        why = "numbers its positions itself (M-RoPE)"
    if why:
        raise UnsupportedError(f"{family.name}: batched eviction is implemented for families whose image tokens sit in "
                               f"one sequence with positions 0..S-1; this one {why}. Use batch_size=1.")


def groups_by_context(splits: list[PromptSplit], batch_size: int) -> list[list[int]]:
    """Indices of ``splits`` in batches of at most ``batch_size``, each batch of one context length (and the same
    image input shapes), in first-seen order: a prefill batch without padding."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    buckets: dict = {}
    for i, sp in enumerate(splits):
        key = (sp.context_ids.shape[1], None if sp.pixel_values is None else tuple(sp.pixel_values.shape[1:]))
        buckets.setdefault(key, []).append(i)
    return [ix[j:j + batch_size] for ix in buckets.values() for j in range(0, len(ix), batch_size)]


@torch.no_grad()
def prefill_batch(model, splits: list[PromptSplit], attentions: bool = True) -> list[Prefill]:
    """Run the contexts of ``splits`` (one context length; see :func:`groups_by_context`) as one batch. Returns one
    :class:`~.cache.Prefill` per sample, as :func:`~.cache.prefill` would (:func:`~.cache.prefill_contexts`)."""
    if len({sp.context_ids.shape[1] for sp in splits}) != 1:
        raise InputError("prefill_batch runs contexts of one length (no padding): group them with groups_by_context")
    check_batchable(splits[0].family)
    return prefill_contexts(model, splits, attentions)


@torch.no_grad()
def answer_batch(model, caches: list, splits: list[PromptSplit], output_attentions: bool = False,
                 bias: dict | None = None):
    """The first answer token of every question on its (evicted) cache, in one forward.

    ``caches``: per sample a cache of batch 1 (e.g. :func:`~.cache.evict`'s), left as they are; ``splits``: the
    samples' splits (questions of any length); ``bias``: cache layer -> ``[B, C]`` additive attention terms on the
    first keys (a merge's ``log(size)``, :func:`~.decode.layer_masks`). Returns ``first [B, vocab]`` float32 and, with
    ``output_attentions`` (eager), per sample the question pass's attention of every layer, ``[1, H, Q_b, K_b]`` as
    :func:`~.decode.answer` gives it (its padding removed)."""
    if len(caches) != len(splits) or not caches:
        raise InputError(f"{len(caches)} caches for {len(splits)} questions")
    dev = placement(model)[0]
    with layer_masks(model, splits[0].family, bias) if bias else contextlib.nullcontext():
        return _answer_batch(model, dev, caches, splits, output_attentions)


def _answer_batch(model, dev, caches, splits, output_attentions):
    check_batchable(splits[0].family)
    if any(is_ragged(c) for c in caches):
        raise UnsupportedError("caches whose layers hold different counts (a depth schedule) are answered one at a "
                               "time: use batch_size=1")
    B = len(caches)
    held = [c.get_seq_length() for c in caches]
    K = max(held)
    qlen = [sp.question_ids.shape[1] for sp in splits]
    Q = max(qlen)
    pad_id = 0 if getattr(model.config, "pad_token_id", None) is None else int(model.config.pad_token_id)
    ids = torch.full((B, Q), pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros(B, K + Q, dtype=torch.long, device=dev)
    pos = torch.zeros(B, Q, dtype=torch.long, device=dev)
    for b, sp in enumerate(splits):
        ids[b, : qlen[b]] = sp.question_ids[0].to(dev)
        mask[b, K - held[b]: K + qlen[b]] = 1  # cache left-padded, question right-padded
        c = sp.context_ids.shape[1]
        pos[b] = torch.arange(c, c + Q, device=dev)  # positions continue from the original context
    stacked = transformers.DynamicCache(config=model.config)
    n_layers = {len(c.layers) for c in caches}
    if len(n_layers) != 1:
        raise InputError(f"caches of different depths: {sorted(n_layers)} layers")
    stacked.layers = [copy.copy(layer) for layer in caches[0].layers]

    def left_pad(t):  # zeros in front of a cache that holds fewer than K positions
        return torch.cat([t.new_zeros(*t.shape[:-2], K - t.shape[-2], t.shape[-1]), t], -2)
    for li, layer in enumerate(stacked.layers):
        layer.keys = torch.cat([left_pad(c.layers[li].keys) for c in caches])
        layer.values = torch.cat([left_pad(c.layers[li].values) for c in caches])
    out = model(input_ids=ids, past_key_values=stacked, position_ids=pos, attention_mask=mask, use_cache=True,
                output_attentions=output_attentions)
    first = torch.stack([out.logits[b, qlen[b] - 1] for b in range(B)]).float()
    if not output_attentions:
        return first, None
    keys = [torch.cat([torch.arange(K - held[b], K), torch.arange(K, K + qlen[b])]).to(dev) for b in range(B)]
    return first, [[a[b:b + 1, :, : qlen[b]].index_select(-1, keys[b]).float().cpu() for a in out.attentions]  # as answer()
                   for b in range(B)]
