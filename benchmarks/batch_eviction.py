"""Batched eviction against batch 1, side by side in one run: ``run_eviction`` on the same questions with
``batch_size = 1`` and ``batch_size = B`` (interleaved repeats, the order shuffled each round), the speed-up with its
BCa interval over repeats, and a check that both give the same answers (the rows' ``correct`` / ``agree`` columns and
kept bytes equal) before any time is reported.

    python benchmarks/batch_eviction.py                     # 32 questions, full cache + key_coverage at 25%, 1 and 2 threads
    python benchmarks/batch_eviction.py --questions 64 --batch 16 --policies full key_coverage snapkv

On a GPU the same call batches the forwards that dominate there; prefill-stage policies and kvpress presses still
run one question at a time (``run_eviction``'s docstring).
"""
from __future__ import annotations

import argparse
import sys
import statistics
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import committed_or_outputs, write_result  # noqa: E402 - one rule for where a result goes

OUT = Path(__file__).resolve().parent / "results" / "batch_eviction.txt"


def main(argv=None) -> int:
    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llava")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--policies", nargs="+", default=["full", "key_coverage"])
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT.name} in results/ (the committed run)")
    a = ap.parse_args(argv)
    a.out = committed_or_outputs(ap, a, OUT)
    model, processor = load_understanding(a.model, attn_implementation="eager")
    qas = heldout_set(a.questions, seed=31)
    pols = {n: POLICIES[n]() for n in a.policies}

    def run(bs):
        return run_eviction(model, processor, qas, [a.budget], pols, None, 0, progress=False, batch_size=bs)

    one, many = run(1), run(a.batch)
    same = ["question", "method", "budget", "correct", "agree", "kv_bytes"]
    if not one[same].equals(many[same]):
        raise SystemExit("batched rows differ from batch-1 rows: no timing is reported")
    lines = [f"{a.model}: run_eviction on {a.questions} questions, policies {', '.join(a.policies)} at {a.budget:.0%}; "
             f"batch {a.batch} vs batch 1 (answers equal: {len(one)} rows, accuracy {one.correct.mean():.3f} in both)"]
    for th in a.threads:
        torch.set_num_threads(th)
        t = interleaved_timings({"batch 1": lambda: run(1), f"batch {a.batch}": lambda: run(a.batch)}, a.repeats)
        s = speedup_interval(t["batch 1"], t[f"batch {a.batch}"])
        lines.append(f"  {th} thread(s), {a.repeats} interleaved repeats: batch 1 {statistics.median(t['batch 1']):.2f} s "
                     f"[{min(t['batch 1']):.2f}-{max(t['batch 1']):.2f}], batch {a.batch} "
                     f"{statistics.median(t[f'batch {a.batch}']):.2f} s [{min(t[f'batch {a.batch}']):.2f}-"
                     f"{max(t[f'batch {a.batch}']):.2f}]: speed-up {s.value:.2f}x [{s.lo:.2f}, {s.hi:.2f}]")
    print("\n".join(lines))
    write_result(a.out, ("\n".join(lines) + "\n").encode(), ap.prog)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
