"""StreamingLLM (Xiao et al., 2023): attention sinks (the first positions) plus a recent window."""
from dataclasses import dataclass

import numpy as np

from ...inputs import check_count
from .base import EvictionPolicy, register


@register
@dataclass(eq=False)
class Streaming(EvictionPolicy):
    """``sinks``: the first image positions always kept (the paper's 4 attention sinks); the rest of the budget goes to
    the most recent ones."""

    name = "streaming"
    description = "first 4 image positions as sinks + the most recent ones"

    sinks: int = 4

    def __post_init__(self):
        super().__post_init__()
        check_count(self.sinks, "StreamingLLM sinks", minimum=0)

    def choose(self, ctx, k):
        s = min(self.sinks, k)
        keep = np.r_[np.arange(s), np.arange(ctx.n_image - (k - s), ctx.n_image)] if k > s else np.arange(s)
        return [keep] * ctx.n_layers
