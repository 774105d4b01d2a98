"""Merging instead of dropping (`key_coverage_merge`, issue #50 item 3) on held-out questions, beside its dropping twin.

On ``make evaluate``'s held-out questions (``benchmarks/evaluate.py: question_set``: disjoint from the design set and
from notebook 05's), at 10, 25 and 50% of the image tokens: each method's accuracy as a share of the full cache's
(ratio over questions, 95% interval) and `key_coverage_merge` minus `key_coverage` (the same kept positions, the
evicted ones dropped), paired over questions (Newcombe), with DivPrune beside them. The rule was written before the
run (#50): at 10% merging must lift the share above its dropping twin (the difference's interval above 0) and to at
least 0.97 of full (holds: the whole interval at or above; does not hold: the whole interval below; else
inconclusive). Nothing was tuned: the merge rule has no setting.

    python benchmarks/merge_eviction.py                    # 2,700 questions on tiny-llava
    python benchmarks/merge_eviction.py --questions 200    # a smoke run (written under outputs/)
    python benchmarks/merge_eviction.py --model runs/tiny-llava-576   # another LLaVA checkpoint (scenes at its size)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "merge_eviction.csv"
METHODS = ("full", "key_coverage", "key_coverage_merge", "divprune")
BUDGETS = (0.1, 0.25, 0.5)
BAR = {0.1: 0.97}


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    from evaluate import committed_or_outputs, question_set, write_result

    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import against_peers, run_eviction, share_of_full
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import scene_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2700)
    ap.add_argument("--model", default="tiny-llava")
    ap.add_argument("--batch", type=int, default=32, help="batch size of the cache-stage policies (answers as batch 1)")
    ap.add_argument("--out", type=Path, default=None, help=f"default {OUT.relative_to(HERE.parent)} for 2,700 on tiny-llava")
    a = ap.parse_args(argv)
    out = committed_or_outputs(ap, a, OUT)
    torch.set_num_threads(1)
    model, processor = load_understanding(a.model, attn_implementation="eager")
    qas = question_set(a.questions, size=scene_size(model))
    n_img = int(model.config.image_seq_length)
    t0 = time.time()
    R = run_eviction(model, processor, qas, BUDGETS, {m: POLICIES[m]() for m in METHODS}, None, 0, batch_size=a.batch)
    minutes = (time.time() - t0) / 60
    rows = []
    for b in BUDGETS:
        for m in METHODS[1:]:
            iv = share_of_full(R, m, b)
            bar = BAR.get(b) if m == "key_coverage_merge" else None
            verdict = "" if bar is None else "holds" if iv.lo >= bar else "does not hold" if iv.hi < bar else "inconclusive"
            rows.append({"budget": b, "tokens": round(b * n_img), "method": m, "share_of_full": iv.value, "lo": iv.lo,
                         "hi": iv.hi, "n": iv.n, "target": bar, "verdict": verdict})
    shares = pd.DataFrame(rows)
    vs = against_peers(R, "key_coverage_merge", ["key_coverage", "divprune"])
    print(f"{len(qas)} held-out questions (make evaluate's set), {a.model} ({n_img} image tokens); {minutes:.1f} min")
    print(shares.round(4).to_string(index=False))
    print("key_coverage_merge minus each method (accuracy, paired over questions; KV bytes equal to key_coverage's):")
    print(vs[["budget", "peer", "method_acc", "peer_acc", "diff", "lo", "hi", "verdict"]].round(4).to_string(index=False))
    kl = R[R.method.isin(METHODS[1:3])].groupby(["method", "budget"]).kl.mean().unstack()
    print("mean KL(full || method) at the first answer token:")
    print(kl.to_string(float_format=lambda v: f"{v:.2e}"))
    write_result(out, pd.concat([shares.assign(kind="share", model=a.model), vs.rename(columns={"peer": "method"}).assign(
        kind="minus", model=a.model)]).to_csv(index=False).encode(), ap.prog)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
