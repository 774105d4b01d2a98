"""The prefill-stage cover (`key_coverage_prefill`, issue #31 item 1) on held-out questions, against its targets.

On ``make evaluate``'s held-out questions (``benchmarks/evaluate.py: question_set``: disjoint from the design set
the cover was tuned on and from notebook 05's), at 10 and 25% of the image tokens: each method's accuracy as a share
of the full cache's (ratio over questions, 95% interval), and `key_coverage_prefill` minus each other method, paired
over questions (Newcombe). Beside it: `key_coverage` (the same idea after the prefill: pays the full prefill), the
cover on the projected features (`key_coverage_features`) and DivPrune (the published prefill-stage peer). The
targets (#31): at least 0.99 of full accuracy at 25% and 0.97 at 10%, decided on the interval (holds: the whole
interval at or above the bar; does not hold: the whole interval below; else inconclusive). Prefill time on the
LLaVA-1.5-7B stand-in is measured by ``benchmarks/caching.py`` (part 1b), not here.

    python benchmarks/prefill_cover.py                 # 2,700 questions, about 10 minutes on one core
    python benchmarks/prefill_cover.py --questions 200 # a smoke run
    python benchmarks/prefill_cover.py --questions 8100 --out benchmarks/results/prefill_cover_8100.csv  # settling
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "prefill_cover.csv"
METHODS = ("full", "key_coverage", "key_coverage_prefill", "key_coverage_features", "divprune")
TARGETS = {0.25: 0.99, 0.1: 0.97}


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    from evaluate import committed_or_outputs, question_set, write_result

    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import against_peers, run_eviction, share_of_full
    from unicache_lib.runtime.loaders import load_understanding

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2700)
    ap.add_argument("--batch", type=int, default=32, help="batch size of the cache-stage policies (answers as batch 1)")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT.relative_to(HERE.parent)} for the full 2,700")
    a = ap.parse_args(argv)
    out = committed_or_outputs(ap, a, OUT)
    torch.set_num_threads(1)
    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    qas = question_set(a.questions)
    R = run_eviction(model, processor, qas, sorted(TARGETS), {m: POLICIES[m]() for m in METHODS}, None, 0,
                     batch_size=a.batch)
    rows = []
    for b, bar in TARGETS.items():
        for m in METHODS[1:]:
            iv = share_of_full(R, m, b)
            verdict = "holds" if iv.lo >= bar else "does not hold" if iv.hi < bar else "inconclusive"
            rows.append({"budget": b, "method": m, "share_of_full": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
                         "target": bar, "verdict": verdict if m == "key_coverage_prefill" else ""})
    shares = pd.DataFrame(rows)
    vs = against_peers(R, "key_coverage_prefill", [m for m in METHODS[1:] if m != "key_coverage_prefill"])
    print(f"{len(qas)} held-out questions (make evaluate's set), tiny-llava")
    print(shares.round(4).to_string(index=False))
    print("key_coverage_prefill minus each method (accuracy, paired over questions):")
    print(vs[["budget", "peer", "method_acc", "peer_acc", "diff", "lo", "hi", "verdict"]].round(4).to_string(index=False))
    write_result(out, pd.concat([shares.assign(kind="share"), vs.rename(columns={"peer": "method"}).assign(kind="minus")])
                 .to_csv(index=False).encode(), ap.prog)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
