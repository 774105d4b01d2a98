"""Budgets by depth (issue #63): does a per-layer image budget, derived from how widely each layer's question reads the
image, beat one budget in every layer at the same KV bytes? Decided at 64 and 128 of tiny-llava-576's 576 image tokens.

    make evaluate-depth                     # design (tunes gamma), then 2 ranks, then the merge and the verdicts
    python benchmarks/depth_budgets.py --design                       # 1. the schedule, from the design split only
    torchrun --nproc_per_node 2 benchmarks/depth_budgets.py --questions 2700   # 2. the held-out questions, sharded
    python benchmarks/depth_budgets.py --merge                        # 3. the verdicts, by DEPTH_RULES

1. **Design** (``heldout_set(DESIGN_N, seed=DESIGN_SEED)``, disjoint from every scored set): per layer, how many image
   keys the question reads — ``exp`` of the entropy of its attention over the image keys (mean over heads and question
   tokens, renormalised over the image), averaged over questions (:func:`~unicache_lib.kv.policies.depth.reading_widths`).
   Why this measurement: eviction must keep what the question will read, and a layer that spreads its reading over
   more keys needs more of them kept to carry the same share; it is lesson 02's normalised entropy, taken over the
   image keys and expressed in tokens so that it reads as a budget. The schedule keeps ``width_l ** gamma`` shares
   (equal bytes); ``gamma`` is chosen on the design split from :data:`GAMMAS` (0 = uniform) by the mean KL(full || evicted)
   at both budgets (accuracy on a few hundred questions moves in steps of one question; KL is continuous).
2. **Held-out**: ``--questions`` new questions (seed :data:`QUESTION_SEED`, none in the design split, notebook 05's set,
   the design set of ``key_coverage`` or the earlier decisive run's set), every method below at 64 and 128 tokens.
3. **Merge**: :data:`DEPTH_RULES`, written before any held-out number, decided on 95% intervals over questions (ratio
   of means for shares of full, paired Newcombe intervals for differences): holds / does not hold / inconclusive.

Methods: the full cache, the oracle, random, DivPrune, uniform ``key_coverage`` and ``key_coverage_merge``, the depth
schedule on ``key_coverage_merge``, PyramidKV's linear shape on ``key_coverage_merge``,
DIPrune's keep-all-then-drop on it (first layer whole: more bytes, reported as such), and kvpress's own
``PyramidKVPress`` configured like the SnapKV peer (window sized to the context, ``beta = 20``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import KEEP, count, launch_rank, parse_budgets, read_shards, write_shard  # noqa: E402
from evaluate import write_owned as evaluate_write_owned  # noqa: E402  (the decisive runs' shard format)

from unicache_lib.core.errors import InputError, UnicacheError  # noqa: E402
from unicache_lib.paths import check_output_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "evaluate_depth"
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "tiny-llava-576"
BUDGETS = "64t,128t"
DESIGN_SEED, DESIGN_N = 7300, 300
QUESTION_SEED = 9600  # new: not 9000 (the earlier decisive run), 7000 / 7300 (design sets), 2024 (notebook 05)
FULL = 2700
GAMMAS = (-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0)
DESIGN_FILE = RESULTS / f"depth_design_{MODEL}.json"
BASE = "key_coverage_merge"
DEPTH = f"{BASE}@profile"
TOOL = "depth_budgets.py"


def write_owned(path: Path, data: bytes, out: Path | None) -> Path:
    """:func:`evaluate.write_owned` as this tool (its name in the output folder's marker and in refusals)."""
    return evaluate_write_owned(path, data, out, TOOL)

# Written before any held-out number (issue #63). (id, method, tokens, against, threshold): against "full" -> the share
# of the full cache's accuracy must reach the threshold; a method -> the paired accuracy difference must exceed it;
# "bytes" -> the method's KV bytes must equal that method's on every question (measured).
DEPTH_RULES = (
    ("D1", DEPTH, 64, "full", 0.99),
    ("D2", DEPTH, 128, "full", 0.995),
    ("D3", DEPTH, 64, BASE, 0.0),
    ("D4", DEPTH, 64, f"{BASE}@pyramid", 0.0),
    ("D4", DEPTH, 64, "kvpress:pyramidkv", 0.0),
    ("D5", DEPTH, 64, "bytes", BASE),
    ("D5", DEPTH, 128, "bytes", BASE),
)


def _model():
    from unicache_lib.runtime.loaders import load_understanding
    torch.manual_seed(0)
    return load_understanding(MODEL, attn_implementation="eager")


def design_set(size: int) -> list:
    from unicache_lib.world.questions import heldout_set
    return heldout_set(DESIGN_N, seed=DESIGN_SEED, size=size)


def question_set(n: int, size: int) -> list:
    """``n`` new held-out questions: drawn from :data:`QUESTION_SEED`, those that coincide with the design split, the
    ``key_coverage`` design set, notebook 05's set or the earlier decisive run's set (same question on the same
    image) dropped."""
    from evaluate import QUESTION_SEED as EARLIER, question_set as earlier_set

    def key(q):
        return q.question, q.scene.uint8().tobytes()
    taken = {key(q) for q in design_set(size) + earlier_set(FULL, seed=EARLIER, size=size)}
    pool = earlier_set(int(n * 1.1) + 10, seed=QUESTION_SEED, size=size)
    kept = [q for q in pool if key(q) not in taken][:n]
    if len(kept) < n:
        raise SystemExit(f"only {len(kept)} of {n} questions are new: raise the pool")
    return kept


def policies(widths=None, gamma=None) -> dict:
    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.policies.depth import by_profile, keep_then_drop, pyramid

    L = len(widths) if widths is not None else 4
    out = {n: POLICIES[n]() for n in ("full", "oracle", "random", "divprune", "key_coverage", BASE)}
    if widths is not None:
        out[DEPTH] = POLICIES[BASE]().with_depth(by_profile(widths, gamma))
        out[DEPTH].name = DEPTH
    out[f"{BASE}@pyramid"] = POLICIES[BASE]().with_depth(pyramid(L))
    out[f"{BASE}@pyramid"].name = f"{BASE}@pyramid"
    out[f"{BASE}@keep_then_drop"] = POLICIES[BASE]().with_depth(keep_then_drop(1))
    out[f"{BASE}@keep_then_drop"].name = f"{BASE}@keep_then_drop"
    return out


def pyramid_press():
    """kvpress's PyramidKVPress, configured like the SnapKV peer (:func:`~unicache_lib.kv.peers.observation_window`)."""
    import kvpress
    from unicache_lib.kv.peers import observation_window
    return {"kvpress:pyramidkv": lambda cr, n: kvpress.PyramidKVPress(compression_ratio=cr,
                                                                      window_size=observation_window(n))}


def results_folder(out: Path | None, full: bool) -> Path:
    """Where a step writes what it decides (the design, the merged verdicts and shares): the committed
    :data:`RESULTS` only for the default ``--out`` (``out`` None) and a full-size run (``full``: the design, or
    :data:`FULL` held-out questions), else ``out/results``, so a run given its own ``--out`` writes nothing outside it."""
    return RESULTS if out is None and full else (OUT if out is None else out) / "results"


def design(results: Path = RESULTS, out: Path | None = None) -> dict:
    """Measure the reading widths per layer on the design split and choose gamma there; written to
    ``results`` (:func:`results_folder`; :func:`write_owned`, ``out`` the ``--out`` given)."""
    from unicache_lib.families import family_of
    from unicache_lib.kv.cache import answer, evict, prefill, split_prompt
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.kv.policies import POLICIES
    from unicache_lib.kv.policies.depth import by_profile, reading_widths
    from unicache_lib.world.questions import scene_size

    model, processor = _model()
    n_image = family_of(model).image_tokens_per_picture(model.config)
    budgets = parse_budgets(BUDGETS, n_image)
    qas = design_set(scene_size(model))
    futures = []
    for q in qas:
        sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
        pre = prefill(model, sp, attentions=False)
        ctx = pre.context()
        full = evict(pre.cache, POLICIES["full"]().select(ctx, 1.0))
        atts = answer(model, full, sp, output_attentions=True)[2]
        futures.append(([a[0].float().mean(0)[:, :ctx.seq_len].mean(0) for a in atts], ctx.image_positions))
    widths = reading_widths(futures)
    pols = {}
    for g in GAMMAS:
        p = POLICIES[BASE]().with_depth(by_profile(widths, g))
        p.name = f"gamma={g:g}"
        pols[p.name] = p
    R = run_eviction(model, processor, qas, budgets, pols, seed=0, progress=False)
    acc = R.groupby(["method", "budget"]).correct.mean().unstack()
    kl = R.groupby(["method", "budget"]).kl.mean().unstack()
    # chosen by the mean KL(full || evicted) over both budgets: on a design split of a few hundred questions accuracy
    # moves in steps of one question, KL is continuous; ties go to the gentler schedule
    best = min(GAMMAS, key=lambda g: (round(float(kl.loc[f"gamma={g:g}"].mean()), 6), abs(g)))
    counts = {f"{b * n_image:.0f}": by_profile(widths, best).counts(len(widths), n_image, round(b * n_image))
              for b in budgets}
    rec = {"model": MODEL, "design_seed": DESIGN_SEED, "n": len(qas), "widths": [round(float(w), 3) for w in widths],
           "n_image": n_image, "gamma": best, "counts": counts,
           "accuracy": {k: {f"{b * n_image:.0f}": round(float(v), 4) for b, v in row.items()} for k, row in acc.iterrows()},
           "kl": {k: {f"{b * n_image:.0f}": round(float(v), 5) for b, v in row.items()} for k, row in kl.iterrows()}}
    write_owned(results / DESIGN_FILE.name, json.dumps(rec, indent=1).encode(), out)
    return rec


def run_shard(n: int, rank: int, world: int, out: Path = OUT, design_file: Path = DESIGN_FILE,
              given: Path | None = None) -> Path:
    from unicache_lib.families import family_of
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.store import shard_samples
    from unicache_lib.world.questions import scene_size

    rec = json.loads(design_file.read_text())
    model, processor = _model()
    n_image = family_of(model).image_tokens_per_picture(model.config)
    budgets = parse_budgets(BUDGETS, n_image)
    qas = question_set(n, scene_size(model))
    ids = shard_samples(list(range(n)), rank, world)
    t0 = time.perf_counter()
    R = run_eviction(model, processor, [qas[i] for i in ids], budgets, policies(rec["widths"], rec["gamma"]),
                     pyramid_press(), seed=0, progress=rank == 0, question_ids=ids)
    R["question"] = [ids[i] for i in R["question"]]
    meta = {"n": n, "rank": rank, "world": world, "model": MODEL, "budgets": list(budgets), "gamma": rec["gamma"],
            "widths": rec["widths"],  # the design the schedules came from: ranks of two designs are refused by the merge
            "question_seed": QUESTION_SEED, "n_image": n_image, "seconds": round(time.perf_counter() - t0, 1)}
    if given is None:
        return write_shard(out, R[KEEP], meta)
    return write_shard(out, R[KEEP], meta, given, TOOL)


def shard_names(rank: int, world: int) -> list[str]:
    return [f"rows-rank{rank}-of-{world}.csv", f"rows-rank{rank}-of-{world}.json"]


def decide(R: pd.DataFrame, n_image: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(verdicts by DEPTH_RULES, each method's share of full accuracy and KV fraction per budget)``."""
    from unicache_lib.intervals import difference_interval, n_to_settle, ratio_interval
    from unicache_lib.kv.evaluate import correct_matrix

    tok = {round(b * n_image): b for b in sorted(R.budget.unique())}
    full = correct_matrix(R, "full")
    rows = []
    for cid, method, t, against, thr in DEPTH_RULES:
        b = tok[t]
        if against == "bytes":
            mine = R[(R.method == method) & (R.budget == b)].sort_values("question").kv_bytes.to_numpy()
            theirs = R[(R.method == thr) & (R.budget == b)].sort_values("question").kv_bytes.to_numpy()
            same = bool(len(mine) == len(theirs) and (mine == theirs).all())
            rows.append({"claim": cid, "method": method, "tokens": t, "against": f"bytes of {thr}", "value": float(
                mine.mean() / theirs.mean()), "lo": np.nan, "hi": np.nan, "n": len(mine), "threshold": 1.0,
                "verdict": "holds" if same else "does not hold"})
            continue
        if against == "full":
            iv = ratio_interval(correct_matrix(R, method, b), full, "questions")
        else:
            if not (R.method == against).any():
                rows.append({"claim": cid, "method": method, "tokens": t, "against": against, "value": np.nan,
                             "lo": np.nan, "hi": np.nan, "n": 0, "threshold": thr, "verdict": "not measurable here"})
                continue
            iv = difference_interval(correct_matrix(R, method, b), correct_matrix(R, against, b), "questions")
        verdict = "holds" if iv.lo >= thr and (against == "full" or iv.lo > thr) else \
            "does not hold" if iv.hi < thr or (against != "full" and iv.hi <= thr) else "inconclusive"
        rows.append({"claim": cid, "method": method, "tokens": t, "against": against, "value": iv.value, "lo": iv.lo,
                     "hi": iv.hi, "n": iv.n if hasattr(iv, "n") else len(full), "threshold": thr, "verdict": verdict,
                     "n_to_settle": n_to_settle(iv, thr) if verdict == "inconclusive" else np.nan})
    shares = []
    for m in R.method.unique():
        for t, b in tok.items():
            if m == "full":
                continue
            iv = ratio_interval(correct_matrix(R, m, b), full, "questions")
            d = R[(R.method == m) & (R.budget == b)]
            shares.append({"method": m, "tokens": t, "accuracy": d.correct.mean(), "share_of_full": iv.value,
                           "lo": iv.lo, "hi": iv.hi, "n": len(d), "kv_fraction": d.kv_fraction.mean()})
    return pd.DataFrame(rows), pd.DataFrame(shares).sort_values(["tokens", "share_of_full"], ascending=[True, False])


def merged(out: Path):
    """``(rows, n, world, metas)`` of one complete run in ``out``: every (method, budget) holds every one of the ``n``
    questions exactly once (a duplicated or missing question is refused, naming the cell)."""
    R, metas, n, world = read_shards(out, ("n", "world", "model", "budgets", "gamma"), "evaluate-depth")
    cells = R.groupby(["method", "budget"]).question.agg(["nunique", "size"])
    bad = cells[(cells["nunique"] != n) | (cells["size"] != n)]
    if len(bad):
        (m, b), r = next(iter(bad.iterrows()))
        raise SystemExit(f"the shards in {out} do not hold each of the {n} questions exactly once: {m} at budget "
                         f"{b:.4f} has {r['size']} rows for {r['nunique']} questions; remove the shards and run again")
    return R, n, world, metas


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--design", action="store_true", help="measure the widths and choose gamma on the design split")
    ap.add_argument("--merge", action="store_true", help="merge the shards and decide DEPTH_RULES")
    ap.add_argument("--questions", type=count, default=FULL)
    ap.add_argument("--out", default=None, help="the folder every step writes to: the ranks' shards, and the design's "
                    "and the merge's results under its results/ (default outputs/evaluate_depth; only then does the "
                    "design or a full-size merge replace the committed files in benchmarks/results)")
    args = ap.parse_args(argv)
    if args.out is not None and not args.out.strip():
        ap.error("--out is empty: name the folder the ranks write (default outputs/evaluate_depth)")
    given = None if args.out is None else Path(args.out)
    args.out = OUT if given is None else given
    rank, world = launch_rank(ap)
    if given is not None:  # before anything loads: not a repository folder, nothing of yours replaced
        names = ([f"results/{DESIGN_FILE.name}"] if args.design else
                 [f"results/evaluate_depth_{MODEL}.csv", f"results/evaluate_depth_shares_{MODEL}.csv"] if args.merge
                 else shard_names(rank, world))
        try:
            given = check_output_path(given, "--out", TOOL, roots=(ROOT,), files=names)
        except InputError as e:
            print(f"{TOOL}: error: {e}", file=sys.stderr)
            return 2
        args.out = given
    torch.set_num_threads(1)
    if args.design:
        rec = design(results_folder(given, full=True), given)
        print(json.dumps({k: rec[k] for k in ("widths", "gamma", "counts")}))
        print(pd.concat({"accuracy": pd.DataFrame(rec["accuracy"]).T, "kl": pd.DataFrame(rec["kl"]).T}, axis=1).to_string())
        return 0
    if args.merge:
        try:
            R, n, world, metas = merged(args.out)
            results = results_folder(given, full=n == FULL)  # --out given, or another size: never the committed results
            verdicts, shares = decide(R, metas[0]["n_image"])
            write_owned(results / f"evaluate_depth_{MODEL}.csv",
                        verdicts.assign(model=MODEL, gamma=metas[0]["gamma"]).to_csv(index=False).encode(), given)
            write_owned(results / f"evaluate_depth_shares_{MODEL}.csv",
                        shares.assign(model=MODEL).to_csv(index=False).encode(), given)
        except (UnicacheError, SystemExit) as e:  # one line, no traceback: what is wrong and what to do
            print(f"depth_budgets.py --merge: {e}", file=sys.stderr)
            return 2
        print(f"{n} questions over {world} process(es), slowest shard {max(m['seconds'] for m in metas) / 60:.1f} min; "
              f"verdicts and shares written to {results}")
        print(verdicts.round(4).to_string(index=False))
        print(shares.round(4).to_string(index=False))
        return 0
    own = results_folder(given, full=True) / DESIGN_FILE.name  # a design run with this --out, else the committed one
    design_file = own if own.exists() else DESIGN_FILE
    print(f"rank {rank} of {world}: {run_shard(args.questions, rank, world, args.out, design_file, given)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
