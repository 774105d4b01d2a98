"""Key coverage before the prefill: the cover of :mod:`.key_coverage`, moved in front of the language model.

`key_coverage` chooses after the prefill, from each layer's cached keys, so it pays the full prefill. Here the
image tokens are chosen once, before the language model runs, from the keys its *first* layer would compute for
them (:meth:`~unicache_lib.families.base.VLMFamily.first_layer_keys`: input norm and key projection, no attention):
a Euclidean k-center cover started at the largest-norm key. The prefill then runs on the kept tokens only, at their
original positions (``renumber=False``, as DivPrune runs here: the shipped model was trained on one layout).

Chosen on the design set only (``benchmarks/tune_prefill_cover.py``, ``heldout_set(100, seed=7000)`` on
``tiny-llava``, against covers of the projected or per-token normalised features and a start farthest from the mean),
where it led at every budget, `key_coverage` included. **That did not carry to held-out questions** (``benchmarks/prefill_cover.py``, quoted in
``docs/CACHING.md``): it is kept as the measured example that a 100-question design set cannot tell these covers apart.
"""
from ...core.errors import ContractError
from .base import EvictionPolicy, register
from .key_coverage import farthest_point


@register
class KeyCoveragePrefill(EvictionPolicy):
    name, stage, renumber = "key_coverage_prefill", "prefill", False
    description = "key_coverage before the prefill: a k-center cover of the first layer's keys of the image tokens"

    def choose(self, ctx, k):
        if ctx.first_keys is None:
            raise ContractError("key_coverage_prefill reads the first layer's keys: build the context with "
                                "prefill(...).context(), which carries the model")
        x = ctx.first_keys(ctx.features)  # [n_image, H_kv * D]
        return [farthest_point(x, k, int(x.norm(dim=1).argmax()))]
