"""Run every eviction policy (and kvpress peer) at every budget on real questions, for real.

For each question: prefill the context once (eager, with attention), answer on the full cache
(the reference, and the "future" the oracle and the simulation use), then for each (method,
budget) evict a copy of the cache and answer on it. One tidy row per (question, method, budget).
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .cache import answer, evict, kv_bytes, prefill, split_prompt
from .policies import POLICIES


def _future(atts, n_context: int) -> list[torch.Tensor]:
    """Per layer ``[C]``: the question queries' attention on each context key (mean over heads and
    queries), i.e. what the rest of the prompt reads from the cache."""
    return [a[0].float().mean(0)[:, :n_context].mean(0) for a in atts]


def run_eviction(model, processor, qas, budgets, policies=None, peers: dict | None = None, seed: int = 0,
                 progress: bool = True) -> pd.DataFrame:
    """Columns: question, method, kind (``policy`` / ``kvpress``), budget, correct, agree (same answer as
    the full cache), kl (KL(full || evicted) at the first answer token), kv_bytes, kv_fraction (of the
    full cache), ms (question + answer on the compressed cache), retained (share of the question's
    attention on context keys that the kept positions carry; policies only), memory (``freed``, or
    ``masked, full memory`` for a press that only masks keys: its kv_fraction is 1.0 by construction).
    ``peers``: name -> ``(compression_ratio, n_context) -> press`` (:func:`~.peers.press_factories`)."""
    from ..capture.vlm import language_attn_implementation
    from .peers import MASKED_LABEL, attention_implementation, compression_ratio, masks_only, needs_sdpa

    from ..families import family_of
    from ..inputs import check_fractions

    check_fractions(budgets, "budget", meaning="of the image tokens kept")  # before any question runs
    budgets = list(budgets)
    policies = policies if policies is not None else {n: c() for n, c in POLICIES.items()}
    fam = family_of(model)
    if peers and fam.cross_attention:
        raise ValueError(f"{fam.name}: kvpress presses compress self-attention caches during prefill; the image KV of a "
                         f"cross-attention VLM lives in its cross-attention layers, which the presses do not touch. "
                         f"Run without peers (PEERS=False).")
    tok = processor.tokenizer
    rows = []
    for qi, q in enumerate(tqdm(qas, desc="eviction", disable=not progress)):
        sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
        pre = prefill(model, sp, attentions=True)
        C, n_img = sp.context_ids.shape[1], pre.context().n_image
        full_cache = evict(pre.cache, POLICIES["full"]().select(pre.context(), 1.0))
        full_bytes = kv_bytes(full_cache)
        ref, _, atts = answer(model, full_cache, sp, output_attentions=True)
        ref_lp = torch.log_softmax(ref, -1)
        future = _future(atts, pre.context().seq_len)
        ctx = pre.context(seed=seed + qi, future=future)

        def row(method, kind, b, logits, nbytes, ms, retained, memory="freed"):
            lp = torch.log_softmax(logits, -1)
            pred = tok.convert_ids_to_tokens(int(logits.argmax()))
            return {"question": qi, "qtype": q.qtype, "method": method, "kind": kind, "budget": b,
                    "correct": pred == q.answer, "agree": int(logits.argmax()) == int(ref.argmax()),
                    "kl": float((ref_lp.exp() * (ref_lp - lp)).sum()), "kv_bytes": nbytes,
                    "kv_fraction": nbytes / full_bytes, "ms": ms, "retained": retained, "memory": memory}

        for name, pol in policies.items():
            for b in budgets:
                keep = pol.select(ctx, b)
                cache = evict(pre.cache, keep)
                nbytes = kv_bytes(cache)
                t0 = time.perf_counter()
                logits, _, _ = answer(model, cache, sp)
                ms = 1e3 * (time.perf_counter() - t0)
                kept = [k for k in keep if k is not None] if len(keep) != len(future) else keep
                ret = float(np.mean([float(f[k].sum() / f.sum()) for f, k in zip(future, kept)]))
                rows.append(row(name, "policy", b, logits, nbytes, ms, ret))
        for name, make in (peers or {}).items():
            for b in budgets:
                press = make(compression_ratio(C, n_img, b), C)
                impl = "sdpa" if needs_sdpa(name) else language_attn_implementation(model)
                with attention_implementation(model, impl):
                    with press(model):
                        pp = prefill(model, sp, attentions=False)
                    nbytes = kv_bytes(pp.cache)
                    t0 = time.perf_counter()
                    logits, _, _ = answer(model, pp.cache, sp)
                    ms = 1e3 * (time.perf_counter() - t0)
                if masks_only(name) and nbytes != full_bytes:
                    raise RuntimeError(f"{name} was expected to mask keys and keep the full cache, but it holds "
                                       f"{nbytes} of {full_bytes} bytes: check the kvpress version")
                rows.append(row(name, "kvpress", b, logits, nbytes, ms, float("nan"), MASKED_LABEL if masks_only(name) else "freed"))
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Mean of every metric per (method, budget), with the question count."""
    g = df.groupby(["kind", "method", "budget"])
    out = g[["correct", "agree", "kl", "kv_fraction", "ms", "retained"]].mean()
    out["n"] = g.size()
    return out.rename(columns={"correct": "accuracy"})
