"""The question on a (compressed) cache: positions continue from the original context; decoded greedily.

    first, ids, _ = answer(model, cache, split)                 # one question
    first, ids, _ = answer(model, cache, split, bias=bias)      # with a merge's log(size) terms (layer_masks)

Positions continue from the *original* context (rotary embeddings of kept keys were applied at their original
positions; M-RoPE families continue from the image's largest position), which is why the answer is decoded with an
own loop rather than ``generate()`` (that would re-feed the context). A cache whose layers hold different counts (a
depth schedule) is answered with one mask per layer (:func:`layer_masks`). Many questions in one forward:
:func:`~.batch.answer_batch`.
"""
from __future__ import annotations

import contextlib

import torch

from ..capture.vlm import AttentionCapture
from ..core.errors import InputError
from ..core.hooks import forward_hooks
from ..core.models import placement
from .prompt import PromptSplit, full_positions


@torch.no_grad()
def answer(model, cache, split: PromptSplit, max_new_tokens: int = 1, eos_token_id: int | None = None,
           output_attentions: bool = False, bias: dict | None = None):
    """Feed the question on ``cache`` (which is extended in place) and decode greedily.

    Returns ``(first_logits [vocab] float32, generated ids list, attentions or None)``; with
    ``output_attentions`` (eager) the question pass's attention of every image-KV layer,
    ``[1, H, Q, K]`` each (K = the keys that layer holds). Positions continue from the original
    context whatever the cache holds. ``bias``: cache layer -> an additive attention term on its first keys for every
    query of the answer (a merge's ``log(size)``, :attr:`~.cache.Compressed.bias`; :func:`layer_masks`).
    """
    with layer_masks(model, split.family, bias) if bias else contextlib.nullcontext():
        return _answer(model, cache, split, max_new_tokens, eos_token_id, output_attentions)


def _answer(model, cache, split, max_new_tokens, eos_token_id, output_attentions):
    fam = split.family
    dev = placement(model)[0]
    c = split.context_ids.shape[1]
    q = split.question_ids.to(dev)
    pos = fam.text_positions(full_positions(fam, model, split), c, q.shape[1], dev)
    with (AttentionCapture(model, "full", part=fam.image_part, spans=None) if output_attentions
          else contextlib.nullcontext()) as cap:
        out = forward_question(fam, model, q, cache, pos)
    atts = [r.probs[None] for r in sorted(cap.result.records, key=lambda r: r.layer)] if output_attentions else None
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
    with layer_masks(model, family, every_layer=True) if is_ragged(cache) else contextlib.nullcontext():
        return model(input_ids=ids, past_key_values=cache, position_ids=positions,
                     attention_mask=torch.ones(1, held + ids.shape[1], dtype=torch.long, device=ids.device),
                     use_cache=True)


def is_ragged(cache) -> bool:
    """Whether the cache's self-attention layers hold different numbers of positions."""
    return len({layer.keys.shape[-2] for layer in cache.layers if getattr(layer, "keys", None) is not None}) > 1


@contextlib.contextmanager
def layer_masks(model, family, bias: dict[int, torch.Tensor] | None = None, every_layer: bool = False):
    """While open, the language model's self-attention in layer ``l`` gets a mask of its own: sized to the keys *that
    layer* holds (a cache whose layers keep different counts, :mod:`~.policies.depth`: the model builds one mask for
    the first layer's length, so a layer of another length gets its own causal mask; batch 1, no padding), plus
    ``bias[l]`` (``[C]`` or ``[B, C]``: one term per cached position, the first ``C`` keys; keys beyond get 0; read at
    each call). A layer is touched when it has a term, or always with ``every_layer``. A missing mask (sdpa without
    padding) is made causal first, a boolean one additive. ``family``: the model's adapter (``split.family``, or
    ``family_of(model)``). The hooks are removed on exit, even on error."""
    bias = {} if bias is None else bias
    sites = {s.layer: s.module for s in family.sites(model, ("language",))}
    missing = sorted(set(bias) - set(sites))
    if missing:
        raise InputError(f"log_size_bias: no self-attention module in layers {missing}")

    def hook_for(layer):
        def pre(module, args, kwargs):
            if layer not in bias and not every_layer:  # read at call time: a press fills it while its prefill runs
                return args, kwargs
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            q = hidden.shape[1]
            cache = kwargs.get("past_key_values")
            keys = getattr(cache.layers[layer], "keys", None) if cache is not None and len(cache.layers) > layer else None
            held = 0 if keys is None else keys.shape[-2]  # (a layer not yet filled holds nothing)
            mask = kwargs.get("attention_mask")
            dtype = hidden.dtype
            low = torch.finfo(dtype).min
            if mask is None or mask.shape[-1] != held + q:  # none, or built for another layer's length (ragged)
                if mask is not None and mask.shape[0] > 1:
                    raise InputError(f"layer {layer} holds {held} positions but the batch's mask covers "
                                     f"{mask.shape[-1] - q}: caches of different lengths per layer run one at a time")
                kv = held + q
                allowed = torch.arange(kv, device=hidden.device)[None, :] <= held + torch.arange(q, device=hidden.device)[:, None]
                mask = torch.zeros(1, 1, q, kv, dtype=dtype, device=hidden.device).masked_fill(~allowed, low)
            elif mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, low)
            if layer in bias:
                b = bias[layer].to(mask.device, mask.dtype)
                b = b.reshape(-1, 1, 1, b.shape[-1])
                if b.shape[-1] > mask.shape[-1]:
                    raise InputError(f"log_size_bias: layer {layer} has a term for {b.shape[-1]} positions but attends "
                                     f"over {mask.shape[-1]}")
                pad = torch.zeros(b.shape[0], 1, 1, mask.shape[-1] - b.shape[-1], dtype=mask.dtype, device=mask.device)
                mask = mask + torch.cat([b, pad], -1)
            kwargs["attention_mask"] = mask
            return args, kwargs
        return pre

    with forward_hooks([(m, "forward_pre", hook_for(li)) for li, m in sites.items()]):
        yield
