"""Notebook 04's claims about head pruning (P1-P3) as data, the near-uniform-heads experiment behind P3, and the
measurements on a :class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's cells read as a few calls.

:data:`RULES` is the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and rule written
once there); :func:`declare` writes them on a board. :func:`near_uniform_experiment` prunes the shallow band's most
uniform heads and, as the control, as many random shallow heads, and measures answers and the deeper layers'
statistics; :func:`measure` records P1-P3 from the pruning sweep and that experiment. Intervals resample held-out
questions (paired) or standard samples (paired).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..claims import rules_of
from ..capture.runner import capture_samples
from ..intervals import difference_interval
from ..pruning.downstream import downstream_changes, random_heads
from ..pruning import HeadMask, evaluate as E

RULES = rules_of("04_head_pruning")
NEAR_UNIFORM = "near-uniform shallow heads"


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
