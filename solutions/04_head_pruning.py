"""Solutions to the exercises of notebook 04 (pruning attention heads), on ``tiny-llava``.

Run ``python solutions/04_head_pruning.py [--quick] [--only K]``. For your own model change ``MODEL``.
"""
from __future__ import annotations

import functools
import sys

import _common  # noqa: F401  (repository root on sys.path)
import numpy as np
import pandas as pd

MODEL = "tiny-llava"
SEED = 0
SAMPLE_SEED = 2024


def _n(quick):
    """(held-out questions, gradient questions) — the notebook's quick test uses 100 / 16, its full run 1000 / 128."""
    return (100, 16) if quick else (1000, 128)


@functools.lru_cache(maxsize=None)
def _setup(n_questions: int):
    """Model, head space, statistics records of the standard set, the held-out questions and their reference
    answers (the notebook's section 1 and 2 inputs)."""
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.pruning import HeadSpace
    from unicache_lib.pruning import evaluate as E
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world import samples as sample_set
    from unicache_lib.world.questions import heldout_set

    model, processor = load_understanding(MODEL, attn_implementation="eager")
    space = HeadSpace.of(model)
    recs = capture_samples(model, processor, sample_set.load(seed=SAMPLE_SEED), mode="stats", progress=False).records
    qas = heldout_set(n_questions, seed=12345 + SEED)
    return model, processor, space, recs, qas, E.answer_logprobs(model, processor, qas)


def _accuracy(keep, n_questions):
    from unicache_lib.pruning import HeadMask
    from unicache_lib.pruning import evaluate as E

    model, processor, space, _, qas, ref = _setup(n_questions)
    with HeadMask(space, keep):
        return E.understanding_metrics(E.answer_logprobs(model, processor, qas), ref, processor, qas)["accuracy"]


def prune_in_band(score, layers, n_heads):
    """The starter cell's gap: a keep mask (torch float ``[layers, heads]``, 1 = keep) pruning the ``n_heads``
    lowest-scoring heads of ``score`` among the rows ``layers`` only (ties: the lower layer, then head, first)."""
    import torch

    score = np.asarray(score, float)
    inside = np.zeros(score.shape, bool)
    inside[list(layers)] = True
    flat = np.where(inside & np.isfinite(score), score, np.inf).ravel()  # heads outside the band never chosen
    keep = np.ones(score.size)
    keep[np.argsort(flat, kind="stable")[:n_heads]] = 0
    return torch.tensor(keep.reshape(score.shape), dtype=torch.float32)


def exercise_1(quick: bool = False) -> dict:
    """Exercise 1: write ``prune_in_band`` (the keep mask that prunes the lowest-scoring heads inside some layers
    only), then prune by ``high_entropy`` in the deep band only, then in the shallow band only. Are diffuse heads
    as costly to lose in deep layers as in shallow ones?

    The ``high_entropy`` scorer ranks heads by their rows' normalised entropy (most diffuse = pruned first).
    :func:`prune_in_band` limits the pruning to one band (:func:`~unicache_lib.analysis.layers.band_layers`: on 4
    layers, shallow = layer 0, deep = layer 3): an argsort of the scores with every head outside the band set to
    +inf; it agrees with ``space.keep_mask(..., eligible=...)`` here (checked below). 2 and 4 heads (of 32; a
    quarter and a half of the band's heads) are pruned in the shallow band and, separately, in the deep band, and
    the held-out accuracy is compared.

    Expected on tiny-llava, measured (100 questions in quick mode; unpruned 0.97): no — shallow diffuse heads
    are costly and deep ones free. Pruning layer 3's 2 or 4 most diffuse heads costs nothing (0.97 -> 0.97),
    pruning layer 0's costs 29 and 62 points (0.68, 0.35): the shallow "near-uniform" heads spread the image
    content over the sequence, and every layer above depends on that.
    """
    from unicache_lib.analysis.layers import band_layers
    from unicache_lib.pruning import SCORERS, ScoringContext

    nq = _n(quick)[0]
    _, _, space, recs, _, _ = _setup(nq)
    scores = SCORERS["high_entropy"]()(ScoringContext(space, recs, seed=SEED))
    bands = band_layers(len(space.units))
    base = _accuracy(space.ones(), nq)
    rows = []
    from unicache_lib.analysis.pruning_claims import band_mask_problems

    for band in ("shallow", "deep"):
        eligible = np.zeros(space.shape, bool)
        eligible[bands[band]] = True
        for n_heads in (2, 4):
            keep = prune_in_band(scores, bands[band], n_heads)
            assert not band_mask_problems(keep, scores, bands[band], n_heads)  # the starter cell's check
            assert (keep == space.keep_mask(scores, n_heads / space.n_heads, eligible=eligible)).all()
            acc = _accuracy(keep, nq)
            rows.append({"band": band, "layers": bands[band], "heads pruned": int((keep == 0).sum()),
                         "accuracy": acc, "drop": base - acc})
    t = pd.DataFrame(rows)
    return {"unpruned accuracy": round(base, 3), "table": "\n" + t.round(3).to_string(index=False), "_t": t, "_base": base}


def _image_share_scorer():
    """A scorer of our own, registered once: keep the heads whose text rows read the image most."""
    from unicache_lib.pruning import SCORERS, HeadScorer
    from unicache_lib.pruning.scorers.base import register

    if "image_share" in SCORERS:
        return SCORERS["image_share"]

    def my_score(ctx):  # the starter cell's gap, the body of `my_score`: per head, its text rows' mean image share
        by = {(u.layer, u.part): i for i, u in enumerate(ctx.space.units)}
        acc = [[] for _ in ctx.space.units]
        for r in ctx.records:
            if (r.layer, r.part) in by:
                acc[by[r.layer, r.part]].append(np.nanmean(r.data["image_share"].float().numpy(), -1))
        return np.stack([np.mean(a, 0) for a in acc])

    @register
    class ImageShare(HeadScorer):
        name, needs = "image_share", "records"
        description = "keep the heads whose text queries put the most attention on image keys"

        def score(self, ctx):
            return my_score(ctx)

    return ImageShare


def _sweep(scores: dict, nq: int, fractions=(0.0, 0.1, 0.2, 0.3)) -> pd.DataFrame:
    from unicache_lib.pruning import evaluate as E

    model, processor, space, _, qas, ref = _setup(nq)
    U = E.sweep_understanding(model, processor, space, scores, list(fractions), qas, ref, progress=False)
    U["family"] = U.scorer.str.replace(r"#\d+$", "", regex=True)
    return U


def exercise_2(quick: bool = False) -> dict:
    """Exercise 2: replace ``attention_combined`` with your own scorer (subclass ``HeadScorer``, decorate it with
    ``register``) and rerun section 2. Does it beat ``gradient``?

    The scorer here, ``image_share``, keeps the heads whose text queries put the most mass on image keys (a VQA
    answer must come from the image). It is registered in ``SCORERS`` (for good: put the class in a new file
    under ``unicache_lib/pruning/scorers/`` and import it in that package's ``__init__``) and swept beside
    ``gradient`` and ``attention_combined`` with :func:`~unicache_lib.pruning.evaluate.sweep_understanding`.

    Expected on tiny-llava, measured (quick: 100 questions, 16 gradient questions): no — mean accuracy over
    10-30% pruned is 0.98 for ``gradient``, 0.94 for ``attention_combined`` and 0.80 for ``image_share``, which
    falls to 0.68 at 30%. Reading the image is not the same as mattering for the answer: the heads that read
    the image least include heads the answer cannot do without (see exercise 1's shallow heads).
    """
    from unicache_lib.pruning import SCORERS, ScoringContext
    from unicache_lib.pruning import evaluate as E
    from unicache_lib.world.questions import heldout_set

    nq, ng = _n(quick)
    model, processor, space, recs, _, _ = _setup(nq)
    cls = _image_share_scorer()
    ctx = ScoringContext(space, recs, E.understanding_loss_fns(model, processor, heldout_set(ng, seed=SEED + 777)), SEED)
    scores = {n: SCORERS[n]()(ctx) for n in (cls.name, "gradient", "attention_combined")}
    U = _sweep(scores, nq)
    acc = U.pivot_table(index="family", columns="fraction", values="accuracy")
    mean_pruned = acc.drop(columns=0.0).mean(1).sort_values(ascending=False)
    return {"registered": cls.name in SCORERS, "accuracy": "\n" + acc.round(3).to_string(),
            "mean accuracy over pruned fractions": mean_pruned.round(3).to_dict(), "_mean": mean_pruned}


def exercise_3(quick: bool = False) -> dict:
    """Exercise 3: the gradient scorer used ``N_GRADIENT`` questions. How few can it use before its curve falls
    to random's?

    The gradient scorer is rebuilt from 2, 8, 32 (and 128 in the full run) questions disjoint from the scored
    ones and swept beside the random scorer (3 seeds; 2 in quick mode); the summary is each curve's mean
    accuracy over the pruned fractions (10-30%).

    Expected on tiny-llava, measured (quick: 100 scored questions): about 8 is enough and 2 is not — mean
    accuracy over 10-30% pruned is 0.97 with 8 questions and 0.98 with 32 (as with 128), but 0.84 with 2,
    most of the way down to random's 0.74. It never reaches random at the sizes tried; below ~8 questions
    the ranking degrades quickly.
    """
    from unicache_lib.pruning import SCORERS, ScoringContext
    from unicache_lib.pruning import evaluate as E
    from unicache_lib.world.questions import heldout_set

    nq, _ = _n(quick)
    model, processor, space, _, _, _ = _setup(nq)
    grad_qas = heldout_set(128, seed=SEED + 777)
    sizes = (2, 8, 32) if quick else (2, 8, 32, 128)  # the starter cell's gap `n_grad`, one value at a time
    scores = {f"gradient n={n}": SCORERS["gradient"]()(ScoringContext(
        space, loss_fns=E.understanding_loss_fns(model, processor, grad_qas[:n]), seed=SEED)) for n in sizes}
    for s in range(2 if quick else 3):
        scores[f"random#{s}"] = SCORERS["random"]()(ScoringContext(space, seed=SEED + s))
    U = _sweep(scores, nq)
    mean_pruned = U[U.fraction > 0].groupby("family").accuracy.mean()
    return {"mean accuracy over pruned fractions": mean_pruned.round(3).to_dict(), "_mean": mean_pruned, "_sizes": sizes}


def band(acc):
    """The starter cell's gap of exercise 4: ``(lo, hi)``, the 95% t-interval of the mean of ``acc`` (one accuracy
    per random seed)."""
    from scipy import stats as st

    acc = np.asarray(acc, float)
    half = st.t.ppf(0.975, acc.size - 1) * acc.std(ddof=1) / np.sqrt(acc.size)
    return acc.mean() - half, acc.mean() + half


def exercise_4(quick: bool = False) -> dict:
    """Exercise 4: write random's band (section 2's rule: the 95% t-interval of the mean of one accuracy per seed),
    then recompute it over the first 2, 3, ... seeds. How many seeds does the band need before
    ``attention_combined``'s interval clears it at 10%?

    :func:`band` is checked against :func:`~unicache_lib.analysis.pruning_claims.random_band` (what section 2
    prints). ``attention_combined``'s accuracy at 10% pruned has a 95% Wilson interval over the questions; random's
    10 seeds (the notebook's ``RANDOM_SEEDS``) are swept at 10% and the band recomputed over the first n.

    Expected on tiny-llava, measured (1,000 questions, as in the notebook, also in quick mode): random's
    draws spread widely at 10% (accuracies from 0.61 to 0.98), so with 3 seeds the band is [0.40, 1.21] (the
    [0.402, 1.000] this lesson once showed, clipped) and holds every scorer. It narrows as 1/sqrt(seeds):
    ``attention_combined`` (0.971 [0.959, 0.980]) first clears it at 6 seeds, falls back inside at 7 (a low draw
    widens it) and stays clear from 8 on; at 10 seeds the band is [0.744, 0.935]. Read the seeds needed off the
    spread, not off one lucky count.
    """
    from unicache_lib.analysis.pruning_claims import random_band
    from unicache_lib.intervals import proportion_interval
    from unicache_lib.pruning import SCORERS, ScoringContext

    nq = 1000  # the notebook's N_QUESTIONS, also in quick mode: 100 questions leave the scorer's own interval too wide
    _, _, space, recs, _, _ = _setup(nq)
    scores = {"attention_combined": SCORERS["attention_combined"]()(ScoringContext(space, recs, seed=SEED))}
    scores |= {f"random#{s}": SCORERS["random"]()(ScoringContext(space, seed=SEED + s)) for s in range(10)}
    U = _sweep(scores, nq, fractions=(0.1,))
    acc = U[U.family == "random"].accuracy.to_numpy()
    assert np.allclose(band(acc), random_band(acc))
    ac = proportion_interval(U[U.family == "attention_combined"].correct_q.iloc[0], "questions")
    rows = [{"seeds": n, "band lo": band(acc[:n])[0], "band hi": band(acc[:n])[1], "clears": ac.lo > band(acc[:n])[1]}
            for n in range(2, len(acc) + 1)]
    t = pd.DataFrame(rows)
    first = next((int(r.seeds) for r in t.itertuples() if r.clears and t[t.seeds >= r.seeds].clears.all()), None)
    return {"attention_combined at 10%": str(ac), "random per seed": np.round(acc, 3).tolist(),
            "table": "\n" + t.round(3).to_string(index=False), "seeds needed": first, "_t": t, "_first": first}


def next_steps(quick: bool = False) -> dict:
    """Next steps (★★★, on your own checkpoint; not an exercise): run the notebook with papermill on your
    vision-language model (``-p MODEL /path -y 'GENERATORS: []'``) and read section 3: do the near-uniform shallow
    heads still beat their random control, on accuracy and on the deeper layers?

    Shown on a random-weight stand-in of the LLaVA family (3 layers, 4 heads, grouped-query attention: 2 key/value
    heads), built like the tests' ``random_llava_dir``: the section-3 procedure, i.e. the shallow band's
    near-uniform heads (normalised entropy >= the band's median) masked exactly, against as many random shallow
    heads (:func:`~unicache_lib.pruning.downstream.random_heads`), with the deeper layers' entropy move of each
    (:func:`~unicache_lib.pruning.downstream.downstream_changes`) and the paired difference over samples.

    Expected on the stand-in: the procedure runs end to end on another depth and on grouped-query attention, and
    gives one deeper-layer move per sample for both selections; the numbers mean nothing (random weights). On
    your trained model, a "near-uniform minus random" interval that straddles 0 means the deeper-layer half of
    P3 is not supported there either.
    """
    import tempfile
    from pathlib import Path

    import torch
    from transformers import LlavaForConditionalGeneration

    from unicache_lib.analysis.layers import band_layers
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.intervals import difference_interval
    from unicache_lib.pruning import HeadSpace, ScoringContext
    from unicache_lib.pruning.downstream import downstream_changes, random_heads
    from unicache_lib.pruning.scorers import head_statistics
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world import samples as sample_set
    from unicache_lib.zoo import tiny_llava as tl

    d = Path(tempfile.mkdtemp()) / "random-llava"
    tok = tl.build_tokenizer()
    torch.manual_seed(SEED)
    LlavaForConditionalGeneration(tl.build_config(tok, lm_layers=3, lm_heads=4, kv_heads=2)).save_pretrained(d)
    tl.build_processor(tok).save_pretrained(d)
    checkpoint = str(d)  # here a stand-in folder; yours is your model's path or hub id
    model, processor = load_understanding(checkpoint, attn_implementation="eager", verify=False)
    space = HeadSpace.of(model)
    samples = sample_set.load(per_type=1 if quick else 4, seed=SAMPLE_SEED)
    base = capture_samples(model, processor, samples, progress=False).records
    shallow = band_layers(len(space.units))["shallow"]
    ent = head_statistics(ScoringContext(space, base, seed=SEED))["entropy"][shallow]
    uniform = np.zeros(space.shape, bool)
    uniform[shallow] = ent >= np.median(ent)
    band = np.zeros(space.shape, bool)
    band[shallow] = True
    moves = {}
    for label, sel in (("near-uniform", uniform), ("random", random_heads(band, int(uniform.sum()), SEED))):
        ch = downstream_changes(model, processor, space, samples, torch.tensor(~sel, dtype=torch.float32), shallow, base)
        moves[label] = ch.groupby("sample").d_entropy.mean()
    iv = difference_interval(moves["near-uniform"].to_numpy(), moves["random"].reindex(moves["near-uniform"].index).to_numpy(), "samples")
    return {"stand-in": str(d), "layers x heads": tuple(space.shape), "shallow band": shallow, "heads pruned": int(uniform.sum()),
            "near-uniform minus random (deeper entropy move)": str(iv), "_moves": moves, "_n": len(samples)}


if __name__ == "__main__":
    _common.run_all(sys.modules[__name__], _common.parse(__doc__))
