"""SnapKV (Li et al., 2024): what an observation window at the end of the context reads, pooled.

**The observation window, one rule for the policy and the kvpress peer** (:func:`observation_window`): the last
``n // 8`` of the ``n`` context queries, at least 1 and at most kvpress's default 64. SnapKV's window is meant to be
the question at the end of a long prompt; here the image is cached before the question arrives, so the only queries at
eviction time are the context's own, and a fixed window would cover a different share of every context (kvpress's 64
would cover all but 3 of the shipped model's 67 positions and tie every image key). One eighth is the shipped model's
last row of its 8 x 8 image grid: 8 queries on its 67 positions (the policy's former fixed 8, so its results there are
unchanged), 64 on a 576-token context (the policy used 8 there before; the peer already 64). ``SnapKV(window=16)``
fixes it instead.
"""
from dataclasses import dataclass

import torch

from ...core.errors import InputError
from ...inputs import check_count
from .base import ScorerPolicy, register

KVPRESS_DEFAULT_WINDOW = 64  # kvpress's SnapKVPress(window_size=64)


def observation_window(n_context: int) -> int:
    """SnapKV's observation window for a context of ``n_context`` positions: the last ``n_context // 8`` queries (at
    least 1, at most kvpress's default 64). The policy and the kvpress peer (:mod:`~unicache_lib.kv.peers`) both use it."""
    if n_context < 2:
        raise InputError(f"a context of {n_context} positions leaves nothing to score")
    return max(1, min(KVPRESS_DEFAULT_WINDOW, n_context // 8))


@register
@dataclass(eq=False)
class SnapKV(ScorerPolicy):
    """``window``: the observation window, the last ``window`` context queries (None: :func:`observation_window` of the
    context's queries); ``kernel``: the keys each vote is average-pooled over (odd, as SnapKV's ``kernel_size``)."""

    name = "snapkv"
    description = "attention of the last n/8 context queries (at most 64), average-pooled over 5 keys"

    window: int | None = None
    kernel: int = 5

    def __post_init__(self):
        super().__post_init__()
        if self.window is not None:
            check_count(self.window, "SnapKV window")
        if check_count(self.kernel, "SnapKV kernel") % 2 == 0:
            raise InputError(f"SnapKV kernel must be odd (the pooled votes keep one per key), got {self.kernel}")

    def score(self, ctx, layer):
        A = ctx.attentions[layer]  # [H, Cq, C]: the context queries' reads
        w = observation_window(A.shape[1]) if self.window is None else self.window
        votes = A[:, -w:, :].sum(1)[:, ctx.image_positions]  # [H, n_image]
        return torch.nn.functional.avg_pool1d(votes[:, None], self.kernel, 1, self.kernel // 2,
                                              count_include_pad=False)[:, 0].mean(0)  # pooled over keys, mean over heads
