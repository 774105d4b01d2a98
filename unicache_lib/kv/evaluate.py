"""Run every eviction policy (and kvpress peer) at every budget on real questions, for real.

For each question: prefill the context once (eager, with attention), answer on the full cache
(the reference, and the "future" the oracle and the simulation use), then for each (method,
budget) evict a copy of the cache and answer on it. One tidy row per (question, method, budget).

The path, in stages (:class:`_EvictionRun`): **prefill** (:func:`~.cache.prefill_contexts`: one question, or several
of one context length in one forward) -> **choose, then evict or merge** (the policy's own
:meth:`~.policies.base.EvictionPolicy.apply`, which may instead prune the image before a prefill of its own) ->
**answer** (:func:`~.decode.answer`, or :func:`~.batch.answer_batch` for more than one). The family adapter is
resolved once, when the prompts are split (``split.family``).
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd
import torch

from ..core.errors import ContractError, InputError, UnknownNameError
from ..core.models import language_attn_implementation, quiet
from ..core.scoring import kl_divergence, same_answer
from ..families import family_of
from ..inputs import budget_shares, check_fractions
from ..intervals import difference_interval, extreme_of, ratio_interval
from ..progress import bar
from ..world.scenes import grid_cover
from .batch import answer_batch, check_batchable, groups_by_context
from .cache import PrefillPruningUnsupported, kv_bytes, prefill, prefill_contexts
from .decode import answer
from .prompt import split_prompt, split_prompts
from .peers import MASKED_LABEL, attention_implementation, compression_ratio, masks_only
from .policies import POLICIES


def _future(atts, n_context: int) -> list[torch.Tensor]:
    """Per layer ``[C]``: the question queries' attention on each context key (mean over heads and
    queries), i.e. what the rest of the prompt reads from the cache."""
    return [a[0].float().mean(0)[:, :n_context].mean(0) for a in atts]


def run_eviction(model, processor, qas, budgets, policies=None, peers: dict | None = None, seed: int = 0,
                 progress: bool | None = None, batch_size: int = 1, question_ids=None) -> pd.DataFrame:
    """Columns: question, method, kind (``policy`` / ``kvpress``), budget, correct, agree (same answer as
    the full cache), kl (KL(full || evicted) at the first answer token), kv_bytes, kv_fraction (of the
    full cache), ms (question + answer on the compressed cache), retained (share of the question's
    attention on context keys that the kept positions carry; policies only), memory (``freed``, or
    ``masked, full memory`` for a press that only masks keys: its kv_fraction is 1.0 by construction),
    prefill_tokens (context positions the prefill ran on) and prefill_ms (that prefill without attention
    capture: a cache-stage policy or press pays the full prefill, a prefill-stage policy only its kept tokens).
    ``peers``: name -> ``(compression_ratio, n_context) -> press`` (:func:`~.peers.press_factories`).
    A prefill-stage policy the family cannot run (:class:`~.cache.PrefillPruningUnsupported`) is left out with a
    warning; ``result.attrs["skipped"]`` maps its name to the reason.

    ``batch_size > 1``: questions of one context length are prefilled together and every cache-stage policy's
    answers come from one forward per batch (:mod:`~.batch`); ``ms`` and ``prefill_ms`` are then the batch's time
    divided by its size. Prefill-stage policies and kvpress presses still run one question at a time, and so does a
    batch of one. Answers equal batch 1's; ``kl`` agrees to float rounding. Families :func:`~.batch.check_batchable`
    refuses need ``batch_size=1``.

    ``question_ids``: each question's id in a larger set (a shard of a decisive run), so a seeded policy (``random``)
    draws ``seed + id`` and a sharded run equals a one-process one; default: its place in ``qas``.
    """
    check_fractions(budgets, "budget", meaning="of the image tokens kept")  # before any question runs
    budgets = list(budgets)
    policies = policies if policies is not None else {n: c() for n, c in POLICIES.items()}
    fam = family_of(model)
    budget_shares(budgets, fam.image_tokens_per_picture(model.config))  # two budgets that keep one token count: refused
    if peers and fam.cross_attention:
        raise InputError(f"{fam.name}: kvpress presses compress self-attention caches during prefill; the image KV of a "
                         f"cross-attention VLM lives in its cross-attention layers, which the presses do not touch. "
                         f"Run without peers (PEERS=False).")
    qas = list(qas)
    ids = list(range(len(qas))) if question_ids is None else [int(i) for i in question_ids]
    if len(ids) != len(qas):
        raise InputError(f"question_ids has {len(ids)} ids for {len(qas)} questions: give one per question")
    run = _EvictionRun(model, processor.tokenizer, budgets, policies, peers, seed, ids)
    for items in _batches(model, fam, processor, qas, batch_size, progress):
        run.batch(items)
    out = pd.DataFrame([r for qi in sorted(run.rows) for r in run.rows[qi]])
    out.attrs["skipped"] = run.skipped
    return out


def _batches(model, fam, processor, qas: list, batch_size: int, progress):
    """The questions as ``(index, question, split)`` batches: one at a time, or up to ``batch_size`` of one context
    length (a family that cannot batch is told so before its processor is asked for a batch)."""
    if batch_size == 1:
        yield from ([(qi, q, split_prompt(processor, q.scene.uint8(), q.question, model=model))]
                    for qi, q in enumerate(bar(qas, progress, desc="eviction")))
        return
    if qas:
        check_batchable(fam)
    splits = [sp for i in range(0, len(qas), 256)  # one processor call per 256 questions
              for sp in split_prompts(processor, [q.scene.uint8() for q in qas[i:i + 256]],
                                      [q.question for q in qas[i:i + 256]], model)]
    yield from ([(i, qas[i], splits[i]) for i in g]
                for g in bar(groups_by_context(splits, batch_size), progress, desc=f"eviction (batches of {batch_size})"))


def _answer(model, done: list, output_attentions: bool = False):
    """The last stage, answer: ``(first [B, vocab], per question the attentions or None)`` on each
    :class:`~.cache.Compressed` cache with its ``bias`` (one forward for more than one)."""
    if len(done) == 1:
        c = done[0]
        first, _, atts = answer(model, c.cache, c.split, output_attentions=output_attentions, bias=c.bias)
        return first[None], [atts]
    bias = {li: torch.stack([c.bias[li] for c in done]) for li in done[0].bias} if done[0].bias else None
    return answer_batch(model, [c.cache for c in done], [c.split for c in done], output_attentions, bias=bias)


class _EvictionRun:
    """The rows of :func:`run_eviction`, one batch of questions at a time, in stages: prefill, then per policy and
    budget choose and evict or merge (:meth:`~.policies.base.EvictionPolicy.apply`), then answer."""

    def __init__(self, model, tok, budgets, policies, peers, seed, ids):
        self.model, self.tok, self.budgets, self.policies, self.peers, self.seed = model, tok, budgets, policies, peers, seed
        self.ids = ids  # question index -> the id its seeded draws use
        self.rows: dict[int, list] = {}
        self.skipped: dict[str, str] = {}

    def batch(self, items: list) -> None:
        """``items``: ``(question index, question, split)``; one context length when more than one."""
        model, n = self.model, len(items)
        sps = [sp for _, _, sp in items]
        pres = prefill_contexts(model, sps, attentions=True)  # stage 1: prefill (one forward for the batch)
        plain = [p.context() for p in pres]
        full = POLICIES["full"]()
        fulls = [full.apply(model, p, c, 1.0) for p, c in zip(pres, plain)]  # the reference: every position kept
        full_bytes = [kv_bytes(c.cache) for c in fulls]
        refs, atts = _answer(model, fulls, output_attentions=True)
        futures = [_future(a, c.seq_len) for a, c in zip(atts, plain)]
        ctxs = [p.context(seed=self.seed + self.ids[qi], future=f) for (qi, _, _), p, f in zip(items, pres, futures)]
        t0 = time.perf_counter()
        prefill_contexts(model, sps, attentions=False)
        full_prefill_ms = 1e3 * (time.perf_counter() - t0) / n
        rows = [self.rows.setdefault(qi, []) for qi, _, _ in items]

        def row(b, method, kind, budget, logits, nbytes, ms, retained, memory="freed", prefill_tokens=None, prefill_ms=None):
            qi, q, sp = items[b]
            return {"question": qi, "qtype": q.qtype, "scene": q.scene.scene_type, "method": method, "kind": kind,
                    "budget": budget, "correct": same_answer(self.tok.convert_ids_to_tokens(int(logits.argmax())), q.answer),
                    "agree": int(logits.argmax()) == int(refs[b].argmax()),
                    "kl": float(kl_divergence(refs[b], logits)), "kv_bytes": nbytes,
                    "kv_fraction": nbytes / full_bytes[b], "ms": ms, "retained": retained, "memory": memory,
                    "prefill_tokens": sp.context_ids.shape[1] if prefill_tokens is None else prefill_tokens,
                    "prefill_ms": full_prefill_ms if prefill_ms is None else prefill_ms}

        for name, pol in self.policies.items():
            pol.__post_init__()  # its fields checked again: one set by assignment (pol.alpha = -1) never met __init__
            for bud in self.budgets:
                if name in self.skipped:
                    continue
                try:  # stage 2: the policy chooses, then drops, merges, or prunes before a prefill of its own
                    done = [pol.apply(model, p, c, bud) for p, c in zip(pres, ctxs)]
                except PrefillPruningUnsupported as e:
                    self.skipped[name] = str(e)
                    warnings.warn(f"{name} skipped: {e}", stacklevel=3)
                    continue
                nbytes = [kv_bytes(c.cache) for c in done]  # before the answer extends a cache
                # stage 3: answer as prefilled: together from the shared prefill, one at a time after a prefill of its own
                at = [[b] for b in range(n)] if done[0].prefill_ms is not None else [list(range(n))]
                for group in at:
                    t0 = time.perf_counter()
                    logits = _answer(model, [done[b] for b in group])[0]
                    ms = 1e3 * (time.perf_counter() - t0) / len(group)
                    for j, b in enumerate(group):
                        c = done[b]
                        rows[b].append(row(b, name, "policy", bud, logits[j], nbytes[b], ms, _retained(futures[b], c.kept),
                                           prefill_tokens=c.prefill_tokens, prefill_ms=c.prefill_ms))
        for name, make in (self.peers or {}).items():
            for b, (_, _, sp) in enumerate(items):
                C, n_img = sp.context_ids.shape[1], ctxs[b].n_image
                for bud in self.budgets:
                    press = make(compression_ratio(C, n_img, bud), C)
                    impl = "sdpa" if masks_only(name) else language_attn_implementation(model)
                    with attention_implementation(model, impl):
                        with quiet(loggers=("kvpress",)), press(model):  # "model not tested" for LLaVA, once per call
                            pp = prefill(model, sp, attentions=False)
                        nbytes = kv_bytes(pp.cache)
                        t0 = time.perf_counter()
                        logits, _, _ = answer(model, pp.cache, sp)
                        ms = 1e3 * (time.perf_counter() - t0)
                    if masks_only(name) and nbytes != full_bytes[b]:
                        raise ContractError(f"{name} was expected to mask keys and keep the full cache, but it holds "
                                            f"{nbytes} of {full_bytes[b]} bytes: check the kvpress version")
                    rows[b].append(row(b, name, "kvpress", bud, logits, nbytes, ms, float("nan"),
                                       MASKED_LABEL if masks_only(name) else "freed"))


def _retained(future: list, keeps: list) -> float:
    """Share of the question's attention on context keys that the kept positions carry, mean over layers
    (``future``: per layer ``[C]``; ``keeps``: per layer the kept positions)."""
    return float(np.mean([float(f[k].sum() / f.sum()) for f, k in zip(future, keeps)]))


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Mean of every metric per (method, budget), with the question count."""
    g = df.groupby(["kind", "method", "budget"])
    out = g[["correct", "agree", "kl", "kv_fraction", "ms", "retained", "prefill_tokens", "prefill_ms"]].mean()
    out["n"] = g.size()
    return out.rename(columns={"correct": "accuracy"})


def correct_matrix(df: pd.DataFrame, method: str, budget: float | None = None) -> np.ndarray:
    """``[n_questions]`` 0/1 correctness of ``method`` at ``budget`` (the full cache: any budget), by question."""
    d = df[df.method == method]
    if budget is not None and method != "full":
        d = d[d.budget == budget]
    d = d.drop_duplicates("question").sort_values("question")
    if d.empty:
        raise UnknownNameError(f"no rows for {method!r} at budget {budget}")
    return d.correct.to_numpy(dtype=float)


def per_question_accuracy(df: pd.DataFrame, method: str) -> np.ndarray:
    """``[n_questions]``: ``method``'s accuracy per question averaged over the budgets it ran at (sorted by
    question), e.g. for a paired comparison of two policies over all budgets at once (claim U7)."""
    d = df[(df.kind == "policy") & (df.method == method)]
    if d.empty:
        raise UnknownNameError(f"no policy rows for {method!r}: run it in run_eviction first")
    return d.groupby("question").correct.mean().sort_index().to_numpy(dtype=float)


def against_peers(df: pd.DataFrame, method: str, peers: list[str]) -> pd.DataFrame:
    """Paired accuracy difference ``method - peer`` per (budget, peer), 95% interval over questions (Newcombe's score
    interval for 0/1 answers). Columns: budget, peer, method_acc, peer_acc, diff, lo, hi, verdict (``ahead`` / ``behind`` where the
    interval excludes 0, else ``tie``)."""
    rows = []
    for b, p in _peer_cells(df, method, peers):
        a, c = correct_matrix(df, method, b), correct_matrix(df, p, b)
        iv = difference_interval(a, c, "questions")
        rows.append({"budget": b, "peer": p, "method_acc": a.mean(), "peer_acc": c.mean(), "diff": iv.value,
                     "lo": iv.lo, "hi": iv.hi, "verdict": "ahead" if iv.lo > 0 else "behind" if iv.hi < 0 else "tie"})
    return pd.DataFrame(rows)


def _peer_cells(df: pd.DataFrame, method: str, peers: list[str]) -> list[tuple]:
    """``(budget, peer)`` for every budget ``method`` ran at (ascending) and every peer that ran there, in order."""
    return [(b, p) for b in sorted(df[df.method == method].budget.unique()) for p in peers
            if ((df.method == p) & (df.budget == b)).any()]


def worst_peer_difference(df: pd.DataFrame, method: str, peers: list[str]):
    """The smallest ``mean(method) - mean(peer)`` accuracy difference over every (budget, peer) cell, with its
    interval from each cell's paired interval over questions (:func:`~unicache_lib.intervals.extreme_of`)."""
    return extreme_of([difference_interval(correct_matrix(df, method, b), correct_matrix(df, p, b), "questions")
                       for b, p in _peer_cells(df, method, peers)])


def share_of_full(df: pd.DataFrame, method: str, budget: float):
    """``method``'s accuracy at ``budget`` / the full cache's, paired over questions, with its interval."""
    return ratio_interval(correct_matrix(df, method, budget), correct_matrix(df, "full"), "questions")


@torch.no_grad()
def kept_patches(model, processor, qa, budget: float, policies: dict, seed: int = 0) -> dict:
    """What each policy keeps of one question's image, and what the model then answers: for the lesson's first
    picture. ``qa``: a question (``scene``, ``question``, ``answer``); ``policies``: name -> policy (cache- or
    prefill-stage). Returns name -> ``{"share": [n_grid] float32 (share of the image-KV layers that keep each
    patch, row-major over the picture), "answer": str, "correct": bool, "objects": how many of the scene's objects
    keep at least one of their patches in at least half of the layers}``, plus ``"full"`` (every patch, the full
    cache's answer). Raises when the family's image tokens form no single grid over the picture (nothing to
    draw on)."""
    split = split_prompt(processor, qa.scene.uint8(), qa.question, model=model)
    pre = prefill(model, split, attentions=True)
    ctx = pre.context(seed=seed)
    if ctx.grid is None:
        raise InputError("this family's image tokens form no single grid over the picture: there is no patch to draw "
                         "(run the measurements of this notebook; only the picture needs a grid)")
    grid = ctx.grid.cpu()
    pos_to_img = {int(p): i for i, p in enumerate(ctx.image_positions.tolist())}
    tok = processor.tokenizer

    side = int(round(len(grid) ** 0.5))
    if len(qa.scene.masks) != len(qa.scene.objects):
        raise InputError("the picture's objects have no masks (your folder has no masks.npz): which objects a policy "
                         "keeps is not measurable with these samples; add one mask per listed object")
    on = grid_cover(np.asarray(qa.scene.masks), (side, side)) > 0  # [n_objects, n_grid]: patches each object touches

    def said(logits, share=None):
        a = tok.convert_ids_to_tokens(int(logits.argmax()))
        objects = len(on) if share is None else int(sum((share[o] >= 0.5).any() for o in on))
        return {"answer": a, "correct": same_answer(a, qa.answer), "objects": objects}

    full = POLICIES["full"]().apply(model, pre, ctx, 1.0)
    out = {"full": {"share": np.ones(len(grid), np.float32), **said(answer(model, full.cache, split)[0])}}
    for name, pol in policies.items():
        pol.__post_init__()  # its fields checked again (one set by assignment)
        done = pol.apply(model, pre, ctx, budget)  # drop, merge, or prune before a prefill of its own
        per_layer = done.kept
        logits = answer(model, done.cache, done.split, bias=done.bias)[0]
        counts = np.zeros(ctx.n_image, np.float32)  # how many layers keep each image token
        np.add.at(counts, [pos_to_img[p] for k in per_layer for p in k.tolist() if p in pos_to_img], 1)
        share = counts[grid.numpy()] / len(per_layer)
        out[name] = {"share": share, **said(logits, share)}
    return out
