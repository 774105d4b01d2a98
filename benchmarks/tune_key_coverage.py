"""The design grid behind the `key_coverage` eviction policy, on the design questions only.

Design set: ``heldout_set(100, seed=7000)`` (disjoint from notebook 05's scored set, ``heldout_set(150,
seed=2024)``; checked below). Each row is ``key_coverage`` itself with one of its fields changed
(:class:`~unicache_lib.kv.policies.key_coverage.KeyCoverage`: what is covered, the distance, a share of the budget
first given to the most-read positions, read-weighted distances), a k-center cover of one layer's cached image
keys/values started at the most-read image position; rows: accuracy and KL to the full-cache answer at 5 / 10 / 25 %.

    python benchmarks/tune_key_coverage.py                          # about a minute on 2 CPU cores
    python benchmarks/tune_key_coverage.py --model PATH_OR_HUB_ID   # your checkpoint (eager attention)
"""
from __future__ import annotations

import argparse

from unicache_lib.kv import POLICIES
from unicache_lib.kv.evaluate import run_eviction, summary
from unicache_lib.runtime.loaders import load_understanding
from unicache_lib.world.questions import heldout_set, scene_size

# the sweep: row label -> the fields changed from key_coverage's defaults (the first row is the chosen design)
VARIANTS = {
    "keys, euclidean (chosen)": {},
    "keys + values": {"points": "keys+values"},
    "values": {"points": "values"},
    "keys, cosine": {"metric": "cosine"},
    "unit keys per head": {"points": "unit_keys"},
    "keys, 25% anchors first": {"anchors": 0.25},
    "keys, read-weighted a=0.2": {"alpha": 0.2},
    "keys, read-weighted a=1": {"alpha": 1.0},
}
SCORED = (150, 2024)  # notebook 05's scored set: the design set must not share a question with it


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llava", help="a shipped name, a folder or a hub id (default: tiny-llava)")
    ap.add_argument("--questions", type=int, default=100, help="design questions (default: 100)")
    ap.add_argument("--seed", type=int, default=7000, help="the design set's seed (default: 7000)")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.1, 0.25], help="kept shares of the image tokens")
    a = ap.parse_args(argv)
    model, processor = load_understanding(a.model, attn_implementation="eager")
    size = scene_size(model)
    design, scored = heldout_set(a.questions, seed=a.seed, size=size), heldout_set(*SCORED, size=size)
    shared = {(q.question, q.scene.uint8().tobytes()) for q in design} & {(q.question, q.scene.uint8().tobytes()) for q in scored}
    assert not shared, f"{len(shared)} design questions are also scored"
    policies = {"full": POLICIES["full"](), **{label: POLICIES["key_coverage"](**fields) for label, fields in VARIANTS.items()}}
    s = summary(run_eviction(model, processor, design, a.budgets, policies, None, 0)).loc["policy"]
    print(f"design set: {len(design)} questions (heldout_set({a.questions}, seed={a.seed})), {a.model}")
    print("accuracy\n" + s["accuracy"].unstack("budget").round(3).to_string())
    print("KL(full || evicted), nats\n" + s["kl"].unstack("budget").round(3).to_string())


if __name__ == "__main__":
    main()
