"""Merging instead of dropping (unicache_lib/kv/policies/merge.py): the merged counts add up, each kept key is its
group's mean, log-size attention makes a group of identical keys draw what its copies drew, and the press keeps and
answers exactly what the harness does."""
import copy
from dataclasses import replace

import pytest
import torch

from unicache_lib.kv import POLICIES, answer, evict, prefill, split_prompt
from unicache_lib.kv.peers import compression_ratio
from unicache_lib.kv.policies.merge import log_size_bias, merge_cache, merge_groups


@pytest.fixture(scope="module")
def llava():
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    return model, processor, heldout_set(3, seed=2024)


def test_groups_add_up_and_each_kept_key_is_its_groups_mean():
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 12, 4, generator=g), torch.randn(2, 12, 4, generator=g)
    kept = [0, 5, 9]
    mk, mv, sizes = merge_groups(keys, values, kept)
    assert sizes.sum() == 12 and (sizes >= 1).all() and mk.shape == (2, 3, 4)
    x = keys.permute(1, 0, 2).reshape(12, -1)
    group = torch.cdist(x, x[kept]).argmin(1)
    group[kept] = torch.arange(3)
    for j in range(3):
        members = (group == j).nonzero().flatten()
        assert int(sizes[j]) == len(members)
        assert torch.allclose(mk[:, j], keys[:, members].mean(1)) and torch.allclose(mv[:, j], values[:, members].mean(1))
    lone = merge_groups(keys, values, list(range(12)))  # nothing evicted: nothing changes
    assert torch.equal(lone[0], keys) and torch.equal(lone[1], values) and (lone[2] == 1).all()


def _doctored(pre, ctx, keep):
    """The full cache with every evicted image key and value replaced by a copy of the kept one it merges into."""
    cache = copy.copy(pre.cache)
    cache.layers = [copy.copy(layer) for layer in pre.cache.layers]
    img = ctx.image_positions
    for li, cl in enumerate(ctx.cache_layers):
        chosen = torch.searchsorted(img, torch.as_tensor(keep[cl])[torch.isin(torch.as_tensor(keep[cl]), img)])
        keys, _ = ctx.image_kv(li)
        x = keys.permute(1, 0, 2).reshape(len(img), -1)
        group = torch.cdist(x, x[chosen]).argmin(1)
        group[chosen] = torch.arange(len(chosen))
        layer = cache.layers[cl]
        layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        src = img[chosen[group]]
        layer.keys[0, :, img] = layer.keys[0, :, src]
        layer.values[0, :, img] = layer.values[0, :, src]
    return cache


def test_log_size_attention_draws_what_the_copies_drew(llava):
    """Where every evicted key and value repeats the kept one it joins, the merged cache with + log(size) answers as
    the full cache of copies does (to float rounding), and without the term it does not."""
    model, processor, qas = llava
    q = qas[0]
    sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
    pre = prefill(model, sp, attentions=True)
    keep = POLICIES["key_coverage"]().select(pre.context(), 0.1)
    copies = replace(pre, cache=_doctored(pre, pre.context(), keep))
    full = answer(model, evict(copies.cache, POLICIES["full"]().select(copies.context(), 1.0)), sp)[0]
    merged, bias = merge_cache(copies.context(), evict(copies.cache, keep), keep)
    with log_size_bias(model, bias):
        corrected = answer(model, merged, sp)[0]
    plain = answer(model, merged, sp)[0]
    assert torch.allclose(corrected, full, atol=1e-4), float((corrected - full).abs().max())
    assert (plain - full).abs().max() > 100 * (corrected - full).abs().max()


def test_merged_counts_add_up_to_the_image(llava):
    model, processor, qas = llava
    q = qas[1]
    sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
    pre = prefill(model, sp, attentions=True)
    ctx = pre.context()
    for budget in (0.1, 0.25, 1.0):
        keep = POLICIES["key_coverage_merge"]().select(ctx, budget)
        merged, bias = merge_cache(ctx, evict(pre.cache, keep), keep)
        n_other = len(keep[0]) - ctx.k(budget)
        for b in bias.values():  # exp(0) = 1 per other position, the sizes of the kept image positions
            assert float(b.exp().sum()) == pytest.approx(n_other + ctx.n_image)
    assert all(float(b.abs().max()) == 0 for b in bias.values())  # budget 1.0: nothing merged


@pytest.mark.parametrize("budget", [0.1, 0.25])
@pytest.mark.parametrize("name", ["key_coverage_merge", "key_coverage_merge@pyramid", "key_coverage@pyramid"])
def test_press_merges_and_answers_as_the_harness(llava, budget, name):
    """PolicyPress with the merging policy: kvpress's compress keeps and merges what the harness does (torch.equal, every
    layer), and the forwards inside its `with` block get the same log-size term, so the answers are equal. With a depth
    schedule (``@pyramid``: a ragged cache) the press keeps each layer's own count and answers as the harness too."""
    from unicache_lib.kv.policies.depth import pyramid
    from unicache_lib.kv.presses import PolicyPress

    model, processor, qas = llava

    def policy(ctx):
        base, _, depth = name.partition("@")
        return POLICIES[base]().with_depth(pyramid(ctx.n_layers)) if depth else POLICIES[base]()
    for q in qas[:2]:
        sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
        pre = prefill(model, sp, attentions=True)
        ctx = pre.context()
        keep = policy(ctx).select(ctx, budget)
        assert (len({len(k) for k in keep}) > 1) == ("@" in name)
        if "merge" in name:
            merged, bias = merge_cache(ctx, evict(pre.cache, keep), keep)
        else:
            merged, bias = evict(pre.cache, keep), {}
        press = PolicyPress(compression_ratio=compression_ratio(sp.context_ids.shape[1], ctx.n_image, budget),
                            policy=policy(ctx))
        with press(model):
            pp = prefill(model, sp, attentions=False)
            for li in range(len(keep)):
                assert torch.equal(merged.layers[li].keys, pp.cache.layers[li].keys), f"layer {li}"
                assert torch.equal(merged.layers[li].values, pp.cache.layers[li].values), f"layer {li}"
            pressed = answer(model, pp.cache, sp)[0]
        with log_size_bias(model, bias):  # (answer extends the cache it is given: the comparison above comes first)
            harness = answer(model, merged, sp)[0]
        assert torch.equal(harness, pressed)


def test_run_eviction_merges_beside_its_dropping_twin(llava):
    from unicache_lib.kv.evaluate import run_eviction

    model, processor, qas = llava
    pols = {n: POLICIES[n]() for n in ("full", "key_coverage", "key_coverage_merge")}
    rows = run_eviction(model, processor, qas, [0.1, 1.0], pols, progress=False)
    m, d = rows[rows.method == "key_coverage_merge"], rows[rows.method == "key_coverage"]
    assert list(m.kv_bytes) == list(d.kv_bytes)  # the same positions held: merging costs no memory
    at_one = rows[rows.budget == 1.0]
    assert (at_one[at_one.method == "key_coverage_merge"].kl.to_numpy() ==
            at_one[at_one.method == "key_coverage"].kl.to_numpy()).all()  # nothing evicted: nothing merged
    assert not (m[m.budget == 0.1].kl.to_numpy() == d[d.budget == 0.1].kl.to_numpy()).all()
