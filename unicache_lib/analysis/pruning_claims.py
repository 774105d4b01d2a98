"""Notebook 04's claims about head pruning (P1-P3) as data, the near-uniform-heads experiment behind P3, and the
measurements on a :class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's cells read as a few calls.

:data:`RULES` is the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and rule written
once there); :func:`declare` writes them on a board. :func:`near_uniform_experiment` prunes the shallow band's most
uniform heads and, as the control, as many random shallow heads, and measures answers and the deeper layers'
statistics; :func:`measure` records P1-P3 from the pruning sweep and that experiment. Intervals resample held-out
questions (paired) or standard samples (paired). :func:`against_random` applies section 2's rule (a scorer against
random's band over seeds); :func:`attention_share` times the pruned attention modules' share of a forward.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from scipy import stats

from ..claims import rules_of
from ..core.errors import InputError
from ..core.hooks import forward_hooks
from ..capture.runner import capture_samples
from ..intervals import difference_interval, proportion_interval
from ..pruning.downstream import downstream_changes, random_heads
from ..pruning import HeadMask, evaluate as E

RULES = rules_of("04_head_pruning")
NEAR_UNIFORM = "near-uniform shallow heads"


SEPARATION_RULE = ("a scorer is ahead of random at a fraction when its accuracy's 95% Wilson interval over the "
                   "questions lies wholly above random's band (the 95% t-interval of random's mean accuracy over its "
                   "seeds), behind when wholly below, inconclusive when the two overlap")


def random_band(acc_by_seed, level: float = 0.95) -> tuple[float, float]:
    """Random's band at one fraction: the ``level`` t-interval of the mean of one accuracy per random seed
    (``acc_by_seed [seeds]``, at least 2); it narrows as 1/sqrt(seeds)."""
    a = np.asarray(acc_by_seed, float)
    if a.size < 2:
        raise InputError(f"random's band needs at least 2 seeds, got {a.size}: raise RANDOM_SEEDS")
    half = stats.t.ppf(0.5 + level / 2, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size)
    return float(a.mean() - half), float(a.mean() + half)


def against_random(U: pd.DataFrame) -> pd.DataFrame:
    """:data:`SEPARATION_RULE` on the pruning sweep ``U`` (``family``, ``fraction``, ``accuracy`` and ``correct_q``,
    per-question outcomes; one row per random seed). One row per (pruned fraction, scorer family other than random):
    ``accuracy`` with its Wilson ``lo``/``hi`` over questions, random's ``band_lo``/``band_hi`` and mean, ``seeds``
    and ``verdict`` ("ahead of random", "behind random" or "inconclusive")."""
    rows = []
    for f in sorted(x for x in U.fraction.unique() if x > 0):
        at = U[U.fraction == f]
        r = at[at.family == "random"].accuracy.to_numpy()
        b_lo, b_hi = random_band(r)
        for fam, d in at[at.family != "random"].groupby("family"):
            iv = proportion_interval(d.correct_q.iloc[0], "questions")  # a scorer is deterministic: one row
            rows.append({"fraction": f, "scorer": fam, "accuracy": iv.value, "lo": iv.lo, "hi": iv.hi,
                         "random": float(r.mean()), "band_lo": b_lo, "band_hi": b_hi, "seeds": len(r),
                         "verdict": "ahead of random" if iv.lo > b_hi else "behind random" if iv.hi < b_lo
                         else "inconclusive"})
    return pd.DataFrame(rows)


def attention_share(space, run, repeats: int = 5, threads: int = 1) -> dict:
    """How much of ``run()`` (one forward of the model, e.g. answering a batch) the pruned units take: seconds inside
    ``space.modules`` (each attention module whole: its q/k/v/o projections and the attention itself, what physical
    pruning shrinks) over the whole call, timed by forward hooks with ``threads`` torch threads (restored after).
    ``repeats`` timed runs after a warm-up, each interleaved with an unhooked run so the hooks' own cost shows.
    Returns ``share`` (median), ``shares`` (per run), ``hook_overhead`` (median hooked / unhooked time - 1) and
    ``cap(fraction)``: the speed-up that removing ``fraction`` of every unit's heads would give if attention's cost
    shrank in proportion and nothing else changed, ``1 / (1 - fraction * share)``."""
    sync = torch.cuda.synchronize if any(p.is_cuda for p in space.model.parameters()) else (lambda: None)
    inside, starts = [0.0], {}

    def pre(mod, args, kwargs):
        sync()
        starts[id(mod)] = time.perf_counter()

    def post(mod, args, kwargs, output):
        sync()
        inside[0] += time.perf_counter() - starts.pop(id(mod))

    def timed() -> float:  # seconds of one run()
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        return time.perf_counter() - t0

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    shares, overhead = [], []
    try:
        with torch.no_grad():
            run()  # warm-up
            for _ in range(repeats):
                plain = timed()
                inside[0] = 0.0
                with forward_hooks([(m, "forward_pre", pre) for m in space.modules]
                                   + [(m, "forward", post) for m in space.modules]):
                    hooked = timed()
                shares.append(inside[0] / hooked)
                overhead.append(hooked / plain - 1)
    finally:
        torch.set_num_threads(before)
    share = float(np.median(shares))
    return {"share": share, "shares": shares, "hook_overhead": float(np.median(overhead)),
            "cap": lambda fraction: 1.0 / (1.0 - fraction * share)}


def band_mask_problems(keep, score, layers, n_heads: int) -> list[str]:
    """What is wrong with ``keep`` as the mask that prunes the ``n_heads`` lowest of ``score [layers, heads]`` among the
    rows ``layers`` only (lesson 04's exercise 1 checks a learner's mask with it): the shape, the count pruned, a head
    pruned outside those rows, a kept head in them scoring below a pruned one. Empty when it is right."""
    keep = np.asarray(keep, float)
    score = np.asarray(score, float)
    if keep.shape != score.shape:
        return [f"shape {keep.shape}, want {score.shape}"]
    inside = np.zeros(score.shape, bool)
    inside[list(layers)] = True
    pruned, kept = score[(keep == 0) & inside], score[(keep == 1) & inside & np.isfinite(score)]
    checks = [(f"{int((keep == 0).sum())} heads pruned, want {n_heads}", (keep == 0).sum() != n_heads),
              ("a head pruned outside the band", ((keep == 0) & ~inside).any()),
              ("a kept head scores lower than a pruned one", pruned.size and kept.size and pruned.max() > kept.min()),
              ("values other than 0 and 1", not np.isin(keep, (0, 1)).all())]
    return [text for text, bad in checks if bad]


def declare(board) -> None:
    """Write every rule of :data:`RULES` on ``board`` (before any measurement)."""
    board.declare(RULES)


def near_uniform_experiment(model, processor, space, qas, ref_logp, samples, entropy, shallow, random_seeds: int,
                            seed: int = 0) -> dict:
    """P3's experiment. ``entropy [layers, heads]``: each head's normalised entropy (:func:`head_statistics`);
    ``shallow``: the shallow band's layers. Prunes the shallow heads at or above the band's median entropy, and, as
    the control, ``random_seeds`` draws of as many random shallow heads; for each, the answers on ``qas`` (accuracy,
    KL against ``ref_logp``) and the deeper layers' statistics on ``samples`` against the unpruned capture. Returns
    ``table`` (one row per selection), ``changes`` (selection -> per-(sample, layer) changes), ``random`` (the control's
    labels), ``n`` (heads pruned), ``entropy`` (mean normalised entropy of the pruned heads) and ``per_layer`` (the
    deeper layers' entropy move, near-uniform against the random mean)."""
    ent = entropy[shallow]
    uniform = np.zeros(space.shape, bool)
    uniform[shallow] = ent >= np.median(ent)
    in_band = np.zeros(space.shape, bool)
    in_band[shallow] = True
    n = int(uniform.sum())
    base = capture_samples(model, processor, samples).records
    selections = {NEAR_UNIFORM: uniform} | {f"random shallow heads #{s}": random_heads(in_band, n, seed + s)
                                            for s in range(random_seeds)}
    rows, changes = {}, {}
    for label, sel in selections.items():
        keep = torch.tensor(~sel, dtype=torch.float32)
        with HeadMask(space, keep):
            m = E.understanding_metrics(E.answer_logprobs(model, processor, qas), ref_logp, processor, qas)
        ch = changes[label] = downstream_changes(model, processor, space, samples, keep, skip_layers=shallow, base=base)
        rows[label] = {"heads pruned": int(sel.sum()), **m, "deep d_entropy": ch.d_entropy.mean(),
                       "deep d_image_share": ch.d_image_share.mean()}
    rand = [k for k in selections if k.startswith("random")]
    per_layer = pd.concat({"near-uniform": changes[NEAR_UNIFORM].groupby("layer").d_entropy.mean(),
                           "random (mean)": pd.concat([changes[k] for k in rand]).groupby("layer").d_entropy.mean()}, axis=1)
    return {"table": pd.DataFrame(rows).T, "changes": changes, "random": rand, "n": n,
            "entropy": float(ent[ent >= np.median(ent)].mean()), "per_layer": per_layer}


def per_sample_moves(exp: dict) -> tuple[pd.Series, pd.Series]:
    """The deeper layers' entropy move per sample: near-uniform pruning and the random draws' mean, aligned."""
    per = {k: v.groupby("sample").d_entropy.mean() for k, v in exp["changes"].items()}
    rand = pd.concat([per[k] for k in exp["random"]], axis=1).mean(1)
    return per[NEAR_UNIFORM].reindex(rand.index), rand


def measure(board, U: pd.DataFrame, fractions, families, exp: dict, base_acc: float) -> dict:
    """P1-P3 from the pruning sweep ``U`` (per scorer family and fraction, ``correct_q``: per-question outcomes, one row
    per seed) and the near-uniform experiment ``exp`` (:func:`near_uniform_experiment`); ``families``: the scorer
    families of the sweep. Returns family -> per-question accuracy averaged over the pruned fractions ``[N]``."""
    def correct(family, fraction):
        d = U[(U.family == family) & (U.fraction == fraction)]
        return np.mean(np.stack(d.correct_q.to_list()).astype(float), 0)  # averaged over seeds for a repeated scorer

    c0, c10 = (correct("attention_combined", f) for f in (0.0, 0.1))  # FRACTIONS must hold 0.0 and 0.1
    board.measure("P1", difference_interval(c0, c10, "questions"), criterion="a")
    if 0.2 in fractions:
        c20 = correct("attention_combined", 0.2)
        board.measure("P1", difference_interval(c10, c20, "questions"), criterion="b",
                      shown=f"drop at 10%: {100 * (c0 - c10).mean():.1f} pt, at 20%: {100 * (c0 - c20).mean():.1f} pt")
    else:
        board.measure("P1", None, criterion="b", note="FRACTIONS has no 0.2")
    pruned_f = [f for f in fractions if f > 0]
    mean_over_f = {fam: np.mean([correct(fam, f) for f in pruned_f], 0) for fam in families}
    board.measure("P2", difference_interval(mean_over_f["attention_combined"], mean_over_f["weight_norm"], "questions"),
                  criterion="a")
    board.measure("P2", difference_interval(mean_over_f["attention_combined"], mean_over_f["random"], "questions"),
                  criterion="b", shown=", ".join(f"{k} {v.mean():.3f}" for k, v in
                                                 sorted(mean_over_f.items(), key=lambda kv: -kv[1].mean())))
    p3 = exp["table"]
    u = p3.loc[NEAR_UNIFORM]
    board.measure("P3", difference_interval(c0, u["correct_q"].astype(float), "questions"), criterion="a")
    deep_move, rand_move = per_sample_moves(exp)
    board.measure("P3", difference_interval(deep_move.to_numpy(), rand_move.to_numpy(), "samples"), criterion="b",
                  shown=f"{int(u['heads pruned'])} heads: accuracy {base_acc:.3f}→{u['accuracy']:.3f} (random shallow: "
                        f"{p3.loc[exp['random'], 'accuracy'].mean():.3f}), deeper entropy moves {deep_move.mean():.3f} vs "
                        f"random {rand_move.mean():.3f}")
    return mean_over_f
