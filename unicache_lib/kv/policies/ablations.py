"""Two ablations of ``key_coverage`` against DivPrune, to tell which part of the design carries the gain.

``key_coverage`` and DivPrune both keep a diverse subset of the image tokens. They differ in two ways: *where*
(``key_coverage``: the cached keys of every layer, after the prefill; DivPrune: the projected image features,
once, before it) and *how* (a Euclidean k-center started at the most-read position; a max-min under cosine
distance started at the token whose nearest neighbour is farthest). Each ablation swaps one:

- ``divprune_keys``: DivPrune's selection (cosine max-min, its own start) on each layer's cached image keys,
  as ``key_coverage`` reads them (all heads concatenated) — the rule of DivPrune in the place of key_coverage;
- ``key_coverage_features``: key_coverage's Euclidean k-center on the projected features before the prefill,
  started at the largest-norm feature (no attention exists yet to find the most-read one) — the rule of
  key_coverage in the place of DivPrune, at original positions as DivPrune runs here.
"""
from dataclasses import dataclass

from .base import EvictionPolicy, PrefillStagePolicy, register
from .divprune import max_min_diverse
from .key_coverage import farthest_point


@register
class DivPruneKeys(EvictionPolicy):
    name = "divprune_keys"
    description = "ablation: DivPrune's cosine max-min on each layer's cached image keys (after the prefill)"

    def choose(self, ctx, k):
        # each layer's image keys [H_kv, n_image, D], heads side by side per position
        return [max_min_diverse(ctx.image_kv(li)[0].permute(1, 0, 2).reshape(ctx.n_image, -1), k)
                for li in range(ctx.n_layers)]


@register
@dataclass(eq=False)
class KeyCoverageFeatures(PrefillStagePolicy):
    name = "key_coverage_features"
    description = "ablation: key_coverage's k-center on the projected image features (before the prefill)"

    renumber: bool = False

    def choose(self, ctx, k):
        x = ctx.features.float()
        return [farthest_point(x, k, int(x.norm(dim=1).argmax()))]
