"""One shared suite over every eviction policy, and the cache surgery / decode loop underneath."""
import numpy as np
import pytest
import torch

from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill, split_prompt


@pytest.fixture(scope="module")
def setup():
    from unicache_lib.zoo.loaders import load_understanding
    from unicache_lib.zoo.train_llava import heldout_set

    model, proc = load_understanding("tiny-llava")
    q = heldout_set(4, seed=11)[0]
    sp = split_prompt(proc, q.scene.uint8(), q.question)
    pre = prefill(model, sp)
    full = evict(pre.cache, POLICIES["full"]().select(pre.context(), 1.0))
    _, _, atts = answer(model, full, sp, output_attentions=True)
    C = sp.context_ids.shape[1]
    future = [a[0].float().mean(0)[:, :C].mean(0) for a in atts]
    return model, proc, sp, pre, future


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5, 0.75])
def test_policy_contract(setup, name, budget):
    model, proc, sp, pre, future = setup
    ctx = pre.context(seed=3, future=future)
    pol = POLICIES[name]()
    keep = pol.select(ctx, budget)
    assert len(keep) == len(pre.cache.layers)
    n_img = len(sp.image_positions)
    k = n_img if name == "full" else round(budget * n_img)
    C = sp.context_ids.shape[1]
    img = set(sp.image_positions.tolist())
    for kk in keep:
        kk = kk.tolist()
        assert kk == sorted(set(kk)) and all(0 <= i < C for i in kk)  # sorted, unique, in range
        assert set(range(C)) - img <= set(kk)  # text positions always kept
        assert len(set(kk) & img) == k  # the budget, exactly
    again = pol.select(pre.context(seed=3, future=future), budget)
    assert all(torch.equal(a, b) for a, b in zip(keep, again))  # deterministic
    cache = evict(pre.cache, keep)
    assert kv_bytes(cache) <= kv_bytes(pre.cache)
    assert pre.cache.get_seq_length() == C  # the original cache is untouched
    logits, _, _ = answer(model, cache, sp)
    assert logits.isfinite().all()


def test_full_policy_and_decode_loop_equal_plain_forward_and_generate(setup):
    from unicache_lib.capture.runner import model_inputs

    model, proc, sp, pre, _ = setup
    cache = evict(pre.cache, POLICIES["full"]().select(pre.context(), 0.3))
    logits, ids, _ = answer(model, cache, sp, max_new_tokens=6, eos_token_id=None)
    full_ids = torch.cat([sp.context_ids, sp.question_ids], 1)
    with torch.no_grad():
        ref = model(input_ids=full_ids, pixel_values=sp.pixel_values).logits[0, -1]
        gen = model.generate(input_ids=full_ids, attention_mask=torch.ones_like(full_ids), pixel_values=sp.pixel_values,
                             max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=proc.tokenizer.pad_token_id,
                             min_new_tokens=6)
    assert torch.allclose(logits, ref.float(), atol=1e-5)
    assert ids == gen[0, full_ids.shape[1]:].tolist()


def test_eviction_changes_answers_and_errors_are_clear(setup):
    model, proc, sp, pre, future = setup
    ctx = pre.context(future=future)
    with pytest.raises(ValueError, match="same number"):
        evict(pre.cache, [torch.arange(10)] + [torch.arange(12)] * (len(pre.cache.layers) - 1))
    with pytest.raises(ValueError, match="budget"):
        POLICIES["random"]().select(ctx, 1.5)
    with pytest.raises(ValueError, match="future"):
        POLICIES["oracle"]().select(pre.context(), 0.5)
    nothing = evict(pre.cache, POLICIES["random"]().select(ctx, 0.0))
    full = evict(pre.cache, POLICIES["full"]().select(ctx, 1.0))
    a, _, _ = answer(model, nothing, sp)
    b, _, _ = answer(model, full, sp)
    assert (a - b).abs().max() > 1e-3  # without the image the answer distribution moves
