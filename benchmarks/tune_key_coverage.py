"""The design grid behind the `key_coverage` eviction policy, on the design questions only.

Design set: ``heldout_set(100, seed=7000)`` (disjoint from notebook 05's scored set, ``heldout_set(150,
seed=2024)``; checked below). Each variant is a k-center cover of one layer's cached image keys/values,
started at the most-read image position; rows: accuracy and KL to the full-cache answer at 5 / 10 / 25 %.

    python benchmarks/tune_key_coverage.py      # about a minute on 2 CPU cores
"""
from __future__ import annotations

import torch

from unicache_lib.kv import POLICIES
from unicache_lib.kv.evaluate import run_eviction, summary
from unicache_lib.kv.policies.base import EvictionPolicy, top_k
from unicache_lib.kv.policies.key_coverage import farthest_point
from unicache_lib.world.questions import heldout_set
from unicache_lib.zoo.loaders import load_understanding


class Variant(EvictionPolicy):
    """``what``: keys ``k`` / values ``v`` / both ``kv`` / per-head normalised keys ``k_unit``; ``metric``:
    ``euclidean`` or ``cosine``; ``anchors``: share of the budget given to the most-read positions first;
    ``alpha``: farthest-point distances weighted by (reads / max reads) ** alpha."""


    def __init__(self, name, what="k", metric="euclidean", anchors=0.0, alpha=0.0):
        self.name, self.what, self.metric, self.anchors, self.alpha = name, what, metric, anchors, alpha

    def choose(self, ctx, k):
        out = []
        for li in range(ctx.n_layers):
            keys, values = ctx.image_kv(li)
            if self.what == "k_unit":
                keys = torch.nn.functional.normalize(keys, dim=-1)
            x = {"k": keys, "k_unit": keys, "v": values, "kv": torch.cat([keys, values], -1)}[self.what]
            x = x.permute(1, 0, 2).reshape(ctx.n_image, -1)
            if self.metric == "cosine":
                x = torch.nn.functional.normalize(x, dim=-1)
            reads = ctx.image_reads(li)
            m = int(round(self.anchors * k))
            if m == 0 and self.alpha == 0:
                out.append(farthest_point(x, k, int(reads.argmax())))
                continue
            chosen = [int(i) for i in top_k(reads, max(1, m))]
            d = torch.cdist(x, x)
            near = d[chosen].min(0).values
            w = (reads / reads.max()) ** self.alpha
            while len(chosen) < k:
                s = near * w
                s[chosen] = -1.0
                j = int(s.argmax())
                chosen.append(j)
                near = torch.minimum(near, d[j])
            out.append(chosen[:k])
        return out


def main():
    design, scored = heldout_set(100, seed=7000), heldout_set(150, seed=2024)
    shared = {(q.question, q.scene.uint8().tobytes()) for q in design} & {(q.question, q.scene.uint8().tobytes()) for q in scored}
    assert not shared, f"{len(shared)} design questions are also scored"
    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    variants = [Variant("keys, euclidean (chosen)"), Variant("keys + values", "kv"), Variant("values", "v"),
                Variant("keys, cosine", metric="cosine"), Variant("unit keys per head", "k_unit"),
                Variant("keys, 25% anchors first", anchors=0.25), Variant("keys, read-weighted a=0.2", alpha=0.2),
                Variant("keys, read-weighted a=1", alpha=1.0)]
    policies = {"full": POLICIES["full"](), **{v.name: v for v in variants}}
    s = summary(run_eviction(model, processor, design, [0.05, 0.1, 0.25], policies, None, 0)).loc["policy"]
    print(f"design set: {len(design)} questions (heldout_set(100, seed=7000)), tiny-llava")
    print("accuracy\n" + s["accuracy"].unstack("budget").round(3).to_string())
    print("KL(full || evicted), nats\n" + s["kl"].unstack("budget").round(3).to_string())


if __name__ == "__main__":
    main()
