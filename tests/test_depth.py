"""Budgets by depth (kv/policies/depth.py): per-layer counts that hold the uniform budget's bytes."""
import numpy as np
import pytest
import torch

from unicache_lib.core.errors import InputError
from unicache_lib.kv import POLICIES, evict, kv_bytes, prefill, split_prompt
from unicache_lib.kv.policies.depth import (by_profile, equal_bytes_counts, keep_then_drop, pyramid, reading_width,
                                            uniform)


@pytest.mark.parametrize("weights", [[1, 1, 1, 1], [1, 2, 3, 4], [0, 0, 0, 1], [100, 1, 1, 1], [3, 0.5, 7, 0.01]])
@pytest.mark.parametrize("n_image,k", [(576, 64), (576, 128), (64, 6), (64, 64), (10, 1)])
def test_equal_bytes_counts_add_up_and_stay_in_range(weights, n_image, k):
    c = equal_bytes_counts(weights, n_image, k)
    assert sum(c) == len(weights) * k and all(1 <= x <= n_image for x in c)
    if len(set(weights)) == 1:
        assert c == [k] * len(weights)


def test_pyramid_is_kvpress_shape_and_keep_then_drop_is_not_equal_bytes():
    assert pyramid(4).counts(4, 576, 64) == [125, 84, 44, 3]  # 2k - k/20 down to k/20, linear
    assert pyramid(4).equal_bytes and uniform(4).counts(4, 576, 64) == [64] * 4
    assert keep_then_drop(1).counts(4, 576, 64) == [576, 64, 64, 64] and not keep_then_drop(1).equal_bytes


@pytest.mark.parametrize("bad", [lambda: pyramid(4, beta=0.5), lambda: keep_then_drop(0), lambda: keep_then_drop(4).counts(4, 576, 64),
                                 lambda: by_profile([1, np.nan, 1, 1]), lambda: by_profile([1, 2], gamma=np.inf),
                                 lambda: by_profile([1, 2, 3]).counts(4, 576, 64), lambda: equal_bytes_counts([0, 0], 10, 2),
                                 lambda: equal_bytes_counts([1, 1], 10, 0), lambda: POLICIES["divprune"]().with_depth(pyramid(4)),
                                 lambda: POLICIES["random"]().with_depth("pyramid")])
def test_schedules_refuse_what_they_cannot_do(bad):
    with pytest.raises(InputError):
        bad()


def test_reading_width_counts_keys_read():
    img = torch.arange(2, 10)
    even = torch.zeros(12)
    even[img] = 1.0
    one = torch.zeros(12)
    one[5] = 0.7
    one[0] = 0.3  # a non-image key does not count
    assert reading_width(even, img) == pytest.approx(8.0, rel=1e-5) and reading_width(one, img) == pytest.approx(1.0)


def test_depth_schedule_holds_the_uniform_bytes_on_the_model():
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, proc = load_understanding("tiny-llava")
    q = heldout_set(2, seed=5)[0]
    pre = prefill(model, split_prompt(proc, q.scene.uint8(), q.question))
    ctx = pre.context()
    flat = kv_bytes(evict(pre.cache, POLICIES["key_coverage"]().select(ctx, 0.25)))
    deep = POLICIES["key_coverage"]().with_depth(by_profile([1.0, 2.0, 4.0, 8.0][: ctx.n_layers]))
    keep = deep.select(ctx, 0.25)
    assert len({len(k) for k in keep}) > 1 and kv_bytes(evict(pre.cache, keep)) == flat
    assert deep.name.startswith("key_coverage@") and POLICIES["key_coverage"]().depth is None


def test_schedules_hold_at_any_weight_scale_and_refuse_what_is_not_a_schedule():
    """Found by the adversarial round: counts depended on the weights' scale, bools passed as numbers, keep_then_drop
    never checked k, full accepted a schedule."""
    assert equal_bytes_counts([8, 1, 1, 2], 64, 16) == equal_bytes_counts([8e62, 1e62, 1e62, 2e62], 64, 16)
    assert by_profile([1e300, 1, 1, 1]).counts(4, 576, 64)[0] > 64
    for bad in (lambda: keep_then_drop(1).counts(4, 16, 20), lambda: keep_then_drop(1).counts(4, 16, 0),
                lambda: keep_then_drop(True), lambda: by_profile([1, 2], gamma=True), lambda: pyramid(4, beta=True),
                lambda: pyramid(4, beta="20"), lambda: by_profile([1, 2], gamma="2"), lambda: pyramid(0),
                lambda: pyramid(2.5), lambda: equal_bytes_counts([True, False], 10, 2),
                lambda: POLICIES["full"]().with_depth(pyramid(4))):
        with pytest.raises(InputError):
            bad()


@pytest.mark.parametrize("future,positions,says", [
    (torch.rand(10), torch.arange(0), "none were given"),
    (torch.full((10,), float("nan")), torch.arange(4), "not finite"),
    (torch.zeros(10), torch.arange(4), "zero"),
])
def test_reading_width_refuses_a_reading_it_cannot_measure(future, positions, says):
    """S19 (#60 round IV): reading_width(torch.rand(10), torch.arange(0)) returned 1.0, as if the question read
    exactly one image key; NaN or zero attention gave NaN or a made-up width. Now each refused in one line."""
    with pytest.raises(InputError, match=says):
        reading_width(future, positions)
