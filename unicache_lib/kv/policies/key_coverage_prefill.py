"""Key coverage before the prefill: the cover of :mod:`.key_coverage`, moved in front of the language model.

`key_coverage` chooses after the prefill, from each layer's cached keys, so it pays the full prefill. Here the
image tokens are chosen once, before the language model runs, from the keys its *first* layer would compute for
them (the family's :meth:`~unicache_lib.families.base.VLMFamily.first_layer_keys`: input norm and key projection,
one matrix product, no attention): a Euclidean k-center cover started at the largest-norm key. The prefill then
runs on the kept tokens only, as DivPrune's does.

Tuned on the design set only (``benchmarks/tune_prefill_cover.py``, ``heldout_set(100, seed=7000)`` on
``tiny-llava``): first-layer keys against the projected features and the features normalised per token, started at
the largest norm or at the token farthest from the mean. First-layer keys from the largest norm won at every budget
on the design set, ahead of the cover on the features and of `key_coverage` itself. **It did not carry to held-out
questions** (``benchmarks/prefill_cover.py`` on ``make evaluate``'s questions, ``benchmarks/results/prefill_cover.csv``,
quoted in ``docs/CACHING.md``): there it ties `key_coverage` and the feature cover at 10% and misses the 10% bar. A
100-question design set could not tell these covers apart; it is kept as the measured example of that.
Kept tokens keep their original positions (``renumber=False``, as DivPrune runs here: the shipped model was trained on
one layout).
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
