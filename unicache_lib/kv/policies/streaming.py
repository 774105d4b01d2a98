"""StreamingLLM (Xiao et al., 2023): attention sinks (the first positions) plus a recent window."""
import numpy as np

from .base import EvictionPolicy, register


@register
class Streaming(EvictionPolicy):
    name = "streaming"
    description = "first 4 image positions as sinks + the most recent ones"
    sinks = 4

    def choose(self, ctx, k):
        s = min(self.sinks, k)
        keep = np.r_[np.arange(s), np.arange(ctx.n_image - (k - s), ctx.n_image)] if k > s else np.arange(s)
        return [keep] * ctx.n_layers
