"""DivPrune (Alvar, Singh, Akbari and Zhang, "DivPrune: Diversity-based Visual Token Pruning for Large
Multimodal Models", CVPR 2025; github.com/vbdi/divprune), a peer.

As its authors run it on LLaVA: before the language model, on the projected image features, keep the
subset that greedily solves the max-min diversity problem under cosine distance — the first token is the one
whose nearest neighbour is farthest, each next one the token whose distance to its nearest kept token is
largest — and feed the pruned sequence. A prefill-stage policy: the prefill runs on the kept tokens only.

Positions: the published setting feeds the pruned sequence with consecutive positions (``renumber=True``). The
shipped ``tiny-llava`` was trained on one fixed layout (64 image tokens at positions 3..66) and loses much of its
accuracy when renumbered (``docs/CACHING.md``, Peers), so the peer keeps original positions by default (the fair
setting for this model); for a model trained on many image layouts set ``DivPrune(renumber=True)``, as published.
"""
from dataclasses import dataclass

import torch

from ...core.errors import InputError
from .base import PrefillStagePolicy, greedy_max_min, register


def max_min_diverse(features: torch.Tensor, k: int) -> list[int]:
    """Greedy max-min diversity under cosine distance. ``features [n, D]``; returns ``k`` indices in selection order."""
    x = torch.nn.functional.normalize(features.float(), dim=-1)
    dist = 1.0 - x @ x.T  # [n, n]
    # started at the farthest nearest neighbour (a single candidate: itself)
    return [] if k <= 0 else greedy_max_min(dist, k, int(dist.topk(min(2, len(dist)), dim=0,
                                                                    largest=False).values[-1].argmax()))


@register
@dataclass(eq=False)
class DivPrune(PrefillStagePolicy):
    name = "divprune"
    description = "peer (Alvar et al. 2025): max-min cosine diversity over the image features, pruned before the prefill"

    renumber: bool = False  # original positions: the shipped model's setting (module docstring)

    def choose(self, ctx, k):
        if ctx.features is None:
            raise InputError("DivPrune chooses from the image features before the prefill (a prefill-stage policy): run it "
                             "through run_eviction or prefill_pruned, which hand them over")
        return [max_min_diverse(ctx.features, k)]
