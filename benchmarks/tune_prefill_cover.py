"""The design grid of a prefill-stage cover (issue #31, item 1): choose the kept image tokens *before* the prefill
with `key_coverage`'s k-center idea, so the prefill runs on the kept tokens only.

Design set: ``heldout_set(100, seed=7000)``, as ``tune_key_coverage.py`` (disjoint from every scored set). Each
variant is a greedy k-center (Euclidean) over one representation of the image tokens the language model receives,
started at one token; rows: accuracy and KL to the full-cache answer at 5 / 10 / 25 %, beside `key_coverage` (the
cache-stage cover, which pays the full prefill) and DivPrune (the published prefill-stage peer).

Representations: the projected features (``key_coverage_features`` today), the same L2-normalised per token, and
the keys of the language model's first layer (its input norm and key projection applied to the features: one
matrix product, no attention; before the rotary embedding). Starts: the largest-norm token, or the token farthest
from the mean.

    python benchmarks/tune_prefill_cover.py      # about a minute on 2 CPU cores
"""
from __future__ import annotations

import torch

from unicache_lib.kv import POLICIES
from unicache_lib.kv.evaluate import run_eviction, summary
from unicache_lib.kv.policies.base import EvictionPolicy
from unicache_lib.kv.policies.key_coverage import farthest_point
from unicache_lib.world.questions import heldout_set
from unicache_lib.zoo.loaders import load_understanding


class PrefillCover(EvictionPolicy):
    """``space``: ``features`` / ``unit`` (L2-normalised features) / ``keys0`` (first-layer keys); ``start``: ``norm``
    (largest norm) or ``outlier`` (farthest from the mean)."""

    stage, renumber = "prefill", False

    def __init__(self, name, model, space="features", start="norm"):
        self.name, self.model, self.space, self.start = name, model, space, start

    def represent(self, feats: torch.Tensor) -> torch.Tensor:
        if self.space == "unit":
            return torch.nn.functional.normalize(feats, dim=-1)
        if self.space == "keys0":
            layer = self.model.model.language_model.layers[0]
            w = next(layer.parameters())
            with torch.no_grad():
                return layer.self_attn.k_proj(layer.input_layernorm(feats.to(w.dtype))).float()
        return feats

    def choose(self, ctx, k):
        x = self.represent(ctx.features.float())
        s = x.norm(dim=1) if self.start == "norm" else (x - x.mean(0)).norm(dim=1)
        return [farthest_point(x, k, int(s.argmax()))]


def main():
    design = heldout_set(100, seed=7000)
    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    variants = [PrefillCover(f"{sp}, {st}", model, sp, st) for sp in ("features", "unit", "keys0") for st in ("norm", "outlier")]
    policies = {"full": POLICIES["full"](), "key_coverage": POLICIES["key_coverage"](), "divprune": POLICIES["divprune"](),
                **{v.name: v for v in variants}}
    s = summary(run_eviction(model, processor, design, [0.05, 0.1, 0.25], policies, None, 0, progress=False)).loc["policy"]
    print(f"design set: {len(design)} questions (heldout_set(100, seed=7000)), tiny-llava; prefill-stage covers "
          "(space, start) beside key_coverage (cache stage) and DivPrune")
    print("accuracy\n" + s["accuracy"].unstack("budget").round(3).to_string())
    print("KL(full || evicted), nats\n" + s["kl"].unstack("budget").round(3).to_string())


if __name__ == "__main__":
    main()
