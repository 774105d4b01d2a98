"""The design grid of a prefill-stage cover (issue #31, item 1): choose the kept image tokens *before* the prefill
with `key_coverage`'s k-center idea, so the prefill runs on the kept tokens only.

Design set: ``heldout_set(100, seed=7000)``, as ``tune_key_coverage.py`` (disjoint from every scored set). Each
variant is ``key_coverage_prefill`` with its fields set (:class:`~unicache_lib.kv.policies.key_coverage_prefill.
KeyCoveragePrefill`): a greedy k-center (Euclidean) over one representation of the image tokens the language model
receives, started at one token; rows: accuracy and KL to the full-cache answer at 5 / 10 / 25 %, beside `key_coverage` (the
cache-stage cover, which pays the full prefill) and DivPrune (the published prefill-stage peer).

Representations: the projected features (``key_coverage_features`` today), the same L2-normalised per token, and
the keys of the language model's first layer (its input norm and key projection applied to the features: one
matrix product, no attention; before the rotary embedding). Starts: the largest-norm token, or the token farthest
from the mean.

    python benchmarks/tune_prefill_cover.py      # about a minute on 2 CPU cores
"""
from __future__ import annotations

from unicache_lib.kv import POLICIES
from unicache_lib.kv.evaluate import run_eviction, summary
from unicache_lib.runtime.loaders import load_understanding
from unicache_lib.world.questions import heldout_set

# the sweep over key_coverage_prefill's fields: (points, start); its defaults are ("first_keys", "norm")
SPACES = {"features": "features", "unit": "unit_features", "keys0": "first_keys"}
STARTS = ("norm", "outlier")


def main():
    design = heldout_set(100, seed=7000)
    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    variants = {f"{sp}, {st}": POLICIES["key_coverage_prefill"](points=points, start=st)
                for sp, points in SPACES.items() for st in STARTS}
    policies = {"full": POLICIES["full"](), "key_coverage": POLICIES["key_coverage"](), "divprune": POLICIES["divprune"](),
                **variants}
    s = summary(run_eviction(model, processor, design, [0.05, 0.1, 0.25], policies, None, 0, progress=False)).loc["policy"]
    print(f"design set: {len(design)} questions (heldout_set(100, seed=7000)), tiny-llava; prefill-stage covers "
          "(space, start) beside key_coverage (cache stage) and DivPrune")
    print("accuracy\n" + s["accuracy"].unstack("budget").round(3).to_string())
    print("KL(full || evicted), nats\n" + s["kl"].unstack("budget").round(3).to_string())


if __name__ == "__main__":
    main()
