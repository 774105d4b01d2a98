"""Decisive runs for notebook 06's reuse targets (R1-R3) and its noise-level claims G3 and G8: the prompt counts
06's own scoreboard says would settle them, on prompt/noise pairs that no one here tuned on and that 06 does not
score (checked), with 06's methods, settings and rules.

    make evaluate-reuse                                   # 2 processes, then the timing, then the merge
    torchrun --nproc_per_node 8 benchmarks/evaluate_reuse.py --prompts 1600     # the scoring, sharded
    python benchmarks/evaluate_reuse.py --timing          # wall-clock rounds: one process, on a quiet machine
    python benchmarks/evaluate_reuse.py --merge           # decide R1-R3, G3, G8 -> benchmarks/results/

Three steps, because they need different things. **Scoring** (PSNR, SSIM, prompt following, attention work and
FLOPs of every method against the uncached images) is deterministic and splits over any number of ranks: prompts go
in fixed chunks of :data:`CHUNK`, chunk ``c`` to rank ``c % WORLD_SIZE``, each prompt with its own noise seed, so a
merged run equals a one-process run row for row (``tests/test_benchmarks.py``). **Timing** is wall-clock and must run
alone: ``--repeats`` interleaved rounds of every method on the first :data:`CHUNK` prompts, exactly as 06 times them.
**The merge** builds 06's tables from both and decides the claims with 06's own code
(:func:`unicache_lib.analysis.caching_claims.measure_reuse`), writing ``benchmarks/results/evaluate_reuse.csv`` (one
row per claim and criterion: value, interval, n, verdict, and for one still inconclusive the n that would settle it
and its CPU hours) and ``evaluate_reuse_methods.csv`` (every method's means per generator). A run of another size
than :data:`FULL`, or without its timing run, writes under ``outputs/evaluate_reuse/results`` instead, and says so.

The prompts: 06 scores combinations 0-35 of ``prompt_set(90, 0, 0)`` with noise seeds 0-31 and calibrates MagCache on
32-35; ``step_skip`` was tuned on 36-51 with seeds 1000-1015. This run cycles through the 38 combinations 52-89 with
noise seeds from :data:`NOISE_SEED` on, so neither the texts nor the noise were seen before. MagCache calibrates on
06's four calibration prompts, so every method is configured exactly as in 06.
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
from evaluate import claim_out, count, launch_rank, read_shards, write_owned, write_shard  # noqa: E402 - the shard files every decisive run shares

from unicache_lib.core.errors import InputError, StoreError, UnicacheError  # noqa: E402
from unicache_lib.core.untrusted import read_inside  # noqa: E402
from unicache_lib.paths import check_output_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "evaluate_reuse"
TOOL = "evaluate_reuse.py"
RESULTS = ROOT / "benchmarks" / "results"
FULL = 1600             # R3's note asks for ~1,460 prompts, R2's ~530, R1 (b)'s ~320
CHUNK = 8               # prompts sampled together; also the timing batch (06's TIMING_PROMPTS)
NOISE_SEED = 20000      # 06 uses 0-35, the step_skip tuning 1000-1015
NEW_COMBOS = slice(52, 90)  # 06 scores 0-31 and calibrates on 32-35; step_skip was tuned on 36-51
GENERATORS = ("tiny-mmdit", "tiny-pixart")
STEPS, GUIDANCE = 20, 3.0  # 06's
FEWER = (0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8)  # 06's fewer-step control: these shares of STEPS
LIST_COLUMNS = ("psnr_per_prompt", "ssim_per_prompt")
UNTIMED = {"speedup": np.nan, "speedup_lo": np.nan, "speedup_hi": np.nan, "repeats": 0}  # no --timing run: unmeasured


def prompt_units(n: int) -> list[tuple[dict, int]]:
    """``n`` (prompt, noise seed) pairs, none of which 06 scores or ``step_skip`` was tuned on (checked)."""
    from unicache_lib.world.text import prompt_set

    everything = prompt_set(90, 0, 0)
    seen = {p["short"] for p in everything[:NEW_COMBOS.start]}
    new = everything[NEW_COMBOS]
    units = [(new[i % len(new)], NOISE_SEED + i) for i in range(n)]
    if {p["short"] for p, _ in units} & seen or min(s for _, s in units) <= 1015:
        raise RuntimeError("the decisive prompts overlap 06's or the tuning set's: change NEW_COMBOS / NOISE_SEED")
    return units


def calibration_prompts() -> list[str]:
    """MagCache's calibration prompts: 06's own (``prompt_set(36, 0, 0)[32:36]``)."""
    from unicache_lib.world.text import prompt_set

    return [p["short"] for p in prompt_set(36, 0, 0)[32:]]


def methods(gen, scored: list[str]) -> dict:
    """06's methods on ``gen``: every reuse policy, every diffusers cache, the fewer-step control and step_skip's
    milder setting."""
    from unicache_lib.analysis.caching_claims import MILD
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.evaluate import methods_for

    fewer = sorted({max(1, round(f * STEPS)) for f in FEWER} - {STEPS})
    out = methods_for(gen, STEPS, GUIDANCE, calibration_prompts(), scored_prompts=scored, fewer_steps=fewer)
    out[MILD] = lambda: ReuseCache(gen.transformer, REUSE_POLICIES["step_skip"](stride=2), STEPS)
    return out


def run_shard(n: int, rank: int, world: int, out: Path = OUT, generators=GENERATORS, progress: bool | None = None,
              given: Path | None = None) -> Path:
    """Scores this rank's chunks on every generator; one row per (generator, method, chunk) with the per-prompt
    values as JSON lists, written atomically. Returns the file."""
    from unicache_lib.progress import bar
    from unicache_lib.reuse.evaluate import score_methods
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.store import shard_samples

    if n % CHUNK:
        raise ValueError(f"--prompts must be a multiple of {CHUNK} (the chunk every rank samples together), got {n}")
    units = prompt_units(n)
    chunks = shard_samples(list(range(n // CHUNK)), rank, world)
    t0, rows = time.perf_counter(), []
    for g in generators:
        torch.manual_seed(0)
        gen = load_generator(g)
        M = methods(gen, [p["short"] for p, _ in units])
        for c in bar(chunks, progress, desc=f"{g} chunks (rank {rank})"):
            part = units[c * CHUNK:(c + 1) * CHUNK]
            got, _, counts = score_methods(gen, M, [p["short"] for p, _ in part], [p["objects"][0] for p, _ in part],
                                           STEPS, GUIDANCE, [s for _, s in part], progress=False)
            for label, row in got.items():
                work, flops = counts.get(label, (np.nan, np.nan))
                rows.append({"generator": g, "method": label, "chunk": c, "note": row.get("note", ""),
                             "work": work, "flops": flops, "ref_work": counts["reference"][0],
                             "ref_flops": counts["reference"][1],
                             **{k: row[k] for k in ("colour", "position", "shape") if k in row},
                             **{k: json.dumps([float(v) for v in row[k]]) for k in LIST_COLUMNS if k in row}})
    meta = {"n": n, "rank": rank, "world": world, "generators": list(generators), "chunk": CHUNK,
            "noise_seed": NOISE_SEED, "seconds": round(time.perf_counter() - t0, 1)}
    return write_shard(out, pd.DataFrame(rows), meta, given, TOOL)


def run_timing(repeats: int, out: Path = OUT, generators=GENERATORS, given: Path | None = None) -> Path:
    """06's timing rounds for every method on the first chunk, one process; written atomically as JSON."""
    from unicache_lib.reuse.evaluate import score_methods, time_methods
    from unicache_lib.runtime.loaders import load_generator

    part = prompt_units(CHUNK)
    res = {}
    for g in generators:
        torch.manual_seed(0)
        gen = load_generator(g)
        texts, objs, seeds = [p["short"] for p, _ in part], [p["objects"][0] for p, _ in part], [s for _, s in part]
        _, usable, _ = score_methods(gen, methods(gen, texts), texts, objs, STEPS, GUIDANCE, seeds, progress=False)
        T = time_methods(gen, usable, texts, STEPS, GUIDANCE, seeds, repeats, order_seed=0)  # 06 runs only `usable`
        res[g] = {k: {c: (v.tolist() if isinstance(v, np.ndarray) else v) for c, v in cols.items()} for k, cols in T.items()}
    data = json.dumps({"repeats": repeats, "generators": list(generators), "timing": res}).encode()
    return write_owned(out / "timing.json", data, given, TOOL)  # atomic; a folder you named: checked and recorded


def merge(out: Path = OUT) -> pd.DataFrame:
    """The shards of one run, checked complete and consistent: one row per (generator, method, chunk)."""
    R, metas, n, world = read_shards(out, ("n", "world", "generators", "chunk", "noise_seed"), "evaluate-reuse",
                                     keep_default_na=False, na_values=[""])
    per_cell = R.groupby(["generator", "method"]).chunk.agg(["nunique", "size"])
    if not ((per_cell["nunique"] == n // CHUNK) & (per_cell["size"] == n // CHUNK)).all():
        raise StoreError(f"the merged shards do not hold every one of the {n // CHUNK} chunks exactly once per method: "
                         f"remove them and run the ranks again")
    R["note"] = R["note"].fillna("")
    R.attrs.update(n=n, world=world, seconds=max(m["seconds"] for m in metas))
    return R.sort_values(["generator", "method", "chunk"], ignore_index=True)


def read_timing(out: Path, generators) -> dict | None:
    """``out/timing.json`` (None when there is none), refused in one line when it is a link, not this run's
    generators, or not what :func:`run_timing` writes."""
    if not os.path.lexists(out / "timing.json"):
        return None
    try:
        t = json.loads(read_inside(out, "timing.json", links=False, limit=2**26, error=StoreError, what="timing file"))
    except (ValueError, UnicodeDecodeError) as e:
        raise StoreError(f"{out / 'timing.json'} is not readable JSON ({e}): run --timing again") from None
    ok = (isinstance(t, dict) and isinstance(t.get("repeats"), int) and t["repeats"] >= 1
          and isinstance(t.get("timing"), dict) and all(isinstance(v, dict) for v in t["timing"].values()))
    if not ok or set(t["timing"]) != set(generators):
        raise StoreError(f"{out / 'timing.json'} is not the timing of these shards (generators "
                         f"{sorted(t['timing']) if ok else '?'}, the shards' {sorted(generators)}): run --timing again")
    return t


def tables(R: pd.DataFrame, timing: dict | None) -> dict[str, pd.DataFrame]:
    """06's per-generator table (:func:`~unicache_lib.reuse.evaluate.run_reuse`'s columns) from the merged rows and
    the timing rounds: means over every prompt, work and FLOPs summed over chunks before the ratio."""
    RU = {}
    for g, G in R.groupby("generator", sort=False):
        rows = []
        for m, M in G.groupby("method", sort=False):
            if M["note"].astype(bool).any():
                rows.append({"method": m, "note": M["note"].iloc[0]})
                continue
            per = {k: np.concatenate([json.loads(v) for v in M[k]]) for k in LIST_COLUMNS}
            rows.append({"method": m, "psnr": float(per["psnr_per_prompt"].mean()), "ssim": float(per["ssim_per_prompt"].mean()),
                         **{k: float(M[k].mean()) for k in ("colour", "position", "shape")},  # equal chunks: mean of means
                         "computed": M.work.sum() / M.ref_work.sum(), "flops": M.flops.sum() / M.ref_flops.sum(),
                         "n": len(per["psnr_per_prompt"]), "note": "", **per,
                         **({k: (np.asarray(v) if k == "seconds" else v) for k, v in timing[g][m].items()}
                            if timing and m in timing[g] else UNTIMED)})
        RU[g] = pd.DataFrame(rows).set_index("method")
    return RU


def decide(R: pd.DataFrame, timing: dict | None, repeats: int) -> tuple[pd.DataFrame, dict]:
    """R1-R3, G3, G8 by 06's rules and code on the merged rows: one row per (claim, criterion)."""
    from unicache_lib.analysis import caching_claims as CC
    from unicache_lib.intervals import n_to_settle
    from unicache_lib.reuse.control import control_table
    from unicache_lib.reuse.evaluate import pareto_check
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.scoreboard import INCONCLUSIVE, Scoreboard

    RU = tables(R, timing)
    families = {g: load_generator(g).family for g in RU}
    CT = {g: control_table(RU[g]) for g in RU}
    diffusers = sorted({m for g in RU for m in RU[g].index if str(m).startswith("diffusers:")})
    pareto = {(g, by): pareto_check(RU[g], [CC.NEW_REUSE, CC.MILD], [d for d in diffusers if d in RU[g].index], by)
              for g in RU for by in ("speedup", "flops")}
    board = Scoreboard()
    CC.declare(board, CC.REUSE_RULES)
    CC.measure_reuse(board, RU, CT, pareto, families, repeats)
    per_prompt_s = R.attrs.get("seconds", float("nan")) * R.attrs.get("world", 1) / max(R.attrs.get("n", 1), 1)
    rows = []
    for cid, row in board.rows.items():
        for crit, m in row.measured.items():
            if m.value is None:
                rows.append({"claim": cid, "criterion": crit, "verdict": row.verdict, "note": row.note})
                continue
            c = row.criteria[crit]
            own = c.decide(m.lo, m.hi)
            need = n_to_settle(m.interval(), c.nearest_threshold(m.value)) if own == INCONCLUSIVE else float("nan")
            rows.append({"claim": cid, "criterion": crit, "value": m.value, "lo": m.lo, "hi": m.hi, "n": m.n,
                         "unit": m.unit, "rule": str(c), "criterion_verdict": own, "verdict": row.verdict,
                         "shown": row.shown, "n_to_settle": need,
                         "cpu_hours_to_settle": need * per_prompt_s / 3600 if m.unit == "prompts" else float("nan"),
                         "note": row.note})
    return pd.DataFrame(rows), RU


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=count, default=FULL, help=f"prompts in all, a multiple of {CHUNK} (R3's note: ~1,460)")
    ap.add_argument("--timing", action="store_true", help="run the timing rounds (one process, nothing else running)")
    ap.add_argument("--repeats", type=int, default=20, help="timing rounds (06: 10)")
    ap.add_argument("--merge", action="store_true", help="merge the shards and the timing, and decide")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--results", default=None,
                    help=f"where the merged CSVs go (default: {os.path.relpath(RESULTS, ROOT)} for a run of {FULL} "
                         "prompts with its timing, which notebook 06 reads; outputs/evaluate_reuse/results for another)")
    args = ap.parse_args(argv)
    for name in ("out", "results"):  # Path('') would be the current folder
        if isinstance(getattr(args, name), str):
            if not getattr(args, name).strip():
                ap.error(f"--{name} is empty: name a folder, or leave --{name} out")
            setattr(args, name, Path(os.path.expanduser(getattr(args, name))))  # ~ as a shell would
    torch.set_num_threads(1)
    if args.timing:
        given = claim_out(ap, args.out, ["timing.json"], TOOL) if args.out != OUT else None
        print(f"timing: {run_timing(args.repeats, args.out, given=given)}")
        return 0
    if args.merge:
        try:  # one line, no traceback: what is wrong and what to do
            R = merge(args.out)
            timing = read_timing(args.out, R.generator.unique())
        except UnicacheError as e:
            print(f"{TOOL}: error: {e}", file=sys.stderr)
            return 2
        tpath = args.out / "timing.json"
        if timing is None:
            print(f"no {tpath}: the wall-clock criteria stay unmeasured (run --timing first)")
        repeats = timing["repeats"] if timing else 0
        given = args.results
        if args.results is None:
            full = R.attrs["n"] == FULL and repeats == ap.get_default("repeats")  # the committed run's timing rounds
            args.results = RESULTS if full else args.out / "results"
            if not full:
                print(f"{R.attrs['n']} prompts, {repeats} timing rounds: not the committed run's {FULL} and "
                      f"{ap.get_default('repeats')}: writing under {args.results}, not {RESULTS} (--results to choose)")
        # a folder the user named is checked like every output folder (evaluate.write_owned); the defaults are ours
        owner, option = ((given, "--results") if given is not None else
                         (args.out, "--out") if args.out != OUT and args.results != RESULTS else (None, "--out"))
        names = ["evaluate_reuse.csv", "evaluate_reuse_methods.csv"]
        if owner is not None:  # before anything is decided or written
            try:
                check_output_path(owner, option, TOOL, roots=(ROOT,),
                                  files=[os.path.relpath(args.results / n, owner) for n in names])
            except InputError as e:
                ap.error(str(e))
        claims, RU = decide(R, timing["timing"] if timing else None, repeats)
        keep = ["psnr", "ssim", "colour", "position", "shape", "computed", "flops", "n", "speedup", "speedup_lo", "speedup_hi"]
        tables = [claims.assign(generators=",".join(RU), steps=STEPS, guidance=GUIDANCE, processes=R.attrs["world"],
                                timing_rounds=repeats).to_csv(index=False),
                  pd.concat({g: t[[c for c in keep if c in t]] for g, t in RU.items()}, names=["generator"]).to_csv()]
        for name, text in zip(names, tables):
            write_owned(args.results / name, text.encode(), owner, TOOL, option)
        print(f"{R.attrs['n']} prompts over {R.attrs['world']} process(es), slowest shard {R.attrs['seconds'] / 60:.1f} min;"
              f" {repeats} timing rounds")
        cols = ["claim", "criterion", "value", "lo", "hi", "n", "verdict", "n_to_settle", "cpu_hours_to_settle"]
        print(claims[[c for c in cols if c in claims]].round(4).to_string(index=False))
        return 0
    rank, world = launch_rank(ap)
    given = claim_out(ap, args.out, [f"rows-rank{rank}-of-{world}.{x}" for x in ("csv", "json")], TOOL) \
        if args.out != OUT else None
    path = run_shard(args.prompts, rank, world, args.out, given=given)
    print(f"rank {rank} of {world}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
