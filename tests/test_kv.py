"""One shared suite over every eviction policy, and the cache surgery / decode loop underneath."""
import numpy as np
import pytest
import torch

from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill, split_prompt
from unicache_lib.kv.policies import PrefillStagePolicy


@pytest.fixture(scope="module")
def setup():
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

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
    if isinstance(pol, PrefillStagePolicy):
        return _prefill_stage_contract(model, sp, pre, pol, budget)
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
    # the evicted cache holds exactly the kept positions' bytes (every position costs the same)
    assert kv_bytes(cache) * C == kv_bytes(pre.cache) * len(keep[0])
    if name != "full":
        assert kv_bytes(cache) < kv_bytes(pre.cache)
    assert pre.cache.get_seq_length() == C  # the original cache is untouched
    logits, _, _ = answer(model, cache, sp)
    assert logits.isfinite().all()


def _prefill_stage_contract(model, sp, pre, pol, budget):
    """A prefill-stage policy: the language model's prefill runs on the kept tokens only (counted), the cache
    holds exactly them, the choice is deterministic and the answer on it is finite."""
    from unicache_lib.kv.cache import prefill_pruned

    ctx = pre.context(seed=3)
    k = ctx.k(budget)
    n_img, C = len(sp.image_positions), sp.context_ids.shape[1]
    seen = []
    layer0 = model.model.language_model.layers[0]
    h = layer0.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    try:
        runs = [prefill_pruned(model, sp, pol.token_picker(ctx, budget)) for _ in range(2)]
    finally:
        h.remove()
    (pp, reduced, keep), (_, _, keep2) = runs
    assert torch.equal(keep, keep2)  # deterministic
    if not pol.exact_budget:  # a merge (pooling) keeps as many tokens as its coarser grid has, never more than k
        k = len(set(keep.tolist()) & set(sp.image_positions.tolist()))
        assert 0 < k <= ctx.k(budget)
    assert seen == [C - n_img + k] * 2  # the prefill ran on the kept tokens only: the work saved, counted
    assert len(set(keep.tolist()) & set(sp.image_positions.tolist())) == k
    assert set(range(C)) - set(sp.image_positions.tolist()) <= set(keep.tolist())
    assert pp.cache.get_seq_length() == C - n_img + k
    assert kv_bytes(pp.cache) * C == kv_bytes(pre.cache) * (C - n_img + k)
    logits, _, _ = answer(model, pp.cache, reduced)
    assert logits.isfinite().all()


@pytest.mark.parametrize("renumber", [False, True])
def test_prefill_pruning_equals_one_forward_over_the_kept_tokens(setup, renumber):
    """Prefill on kept tokens + the question on that cache == one forward over [kept context | question] with
    the same positions; keeping every image token (original positions) reproduces the full cache exactly."""
    from unicache_lib.kv.cache import prefill_pruned

    model, proc, sp, pre, _ = setup
    img = sp.image_positions
    sub = torch.arange(0, len(img), 3)
    pp, reduced, keep = prefill_pruned(model, sp, lambda f: sub, renumber=renumber)
    logits, _, _ = answer(model, pp.cache, reduced)
    with torch.no_grad():
        emb = {}
        hook = model.model.language_model.register_forward_pre_hook(
            lambda m, a, kw: emb.update(x=kw["inputs_embeds"]), with_kwargs=True)
        try:
            model(input_ids=sp.full_ids, pixel_values=sp.pixel_values)
        finally:
            hook.remove()
        C, Q = sp.context_ids.shape[1], sp.question_ids.shape[1]
        rows = torch.cat([keep, torch.arange(C, C + Q)])
        pos = torch.arange(len(rows)) if renumber else rows
        ref = model.model.language_model(inputs_embeds=emb["x"][:, rows], position_ids=pos[None]).last_hidden_state
        ref = model.lm_head(ref)[0, -1].float()
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    pp_all, same, _ = prefill_pruned(model, sp, lambda f: torch.arange(len(img)), renumber=False)
    full = evict(pre.cache, POLICIES["full"]().select(pre.context(), 1.0))
    assert torch.equal(answer(model, pp_all.cache, same)[0], answer(model, full, sp)[0])


def test_prefill_pruning_refuses_what_it_cannot_do(setup):
    from unicache_lib.kv.cache import prefill_pruned

    model, proc, sp, pre, _ = setup
    with pytest.raises(RuntimeError, match="distinct indices"):
        prefill_pruned(model, sp, lambda f: [0, 0])
    with pytest.raises(ValueError, match="features before the prefill"):
        POLICIES["divprune"]().choose(pre.context(), 3)


def test_key_coverage_is_a_k_center_cover():
    from unicache_lib.kv.policies.key_coverage import farthest_point

    x = torch.tensor([[0.0], [1.0], [2.0], [10.0], [10.5], [4.0]])
    assert farthest_point(x, 3, start=0) == [0, 4, 5]  # the far end, then the middle of the largest gap
    assert farthest_point(x, 0, start=0) == []
    assert sorted(farthest_point(x, 6, start=2)) == list(range(6))


def test_divprune_max_min_diversity_matches_a_brute_force_greedy():
    from unicache_lib.kv.policies.divprune import max_min_diverse

    g = torch.Generator().manual_seed(0)
    f = torch.randn(20, 5, generator=g)
    got = max_min_diverse(f, 6)
    x = torch.nn.functional.normalize(f, dim=-1)
    d = 1 - x @ x.T
    nn2 = d.sort(0).values[1]  # each token's nearest other token
    want = [int(nn2.argmax())]
    while len(want) < 6:
        rest = [i for i in range(20) if i not in want]
        want.append(max(rest, key=lambda i: min(float(d[i, j]) for j in want)))
    assert got == want


def test_full_policy_and_decode_loop_equal_plain_forward_and_generate(setup):

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
    ragged = [torch.arange(10)] + [torch.arange(12)] * (len(pre.cache.layers) - 1)
    from unicache_lib.core.errors import UnsupportedError
    from unicache_lib.kv.batch import answer_batch
    with pytest.raises(UnsupportedError, match="batch_size=1"):  # layers of different lengths: one at a time
        answer_batch(model, [evict(pre.cache, ragged)] * 2, [sp, sp])
    with pytest.raises(ValueError, match="budget"):
        POLICIES["random"]().select(ctx, 1.5)
    with pytest.raises(ValueError, match="future"):
        POLICIES["oracle"]().select(pre.context(), 0.5)
    nothing = evict(pre.cache, POLICIES["random"]().select(ctx, 0.0))
    full = evict(pre.cache, POLICIES["full"]().select(ctx, 1.0))
    a, _, _ = answer(model, nothing, sp)
    b, _, _ = answer(model, full, sp)
    assert (a - b).abs().max() > 1e-3  # without the image the answer distribution moves


@pytest.mark.parametrize("name", ["h2o", "snapkv", "unicache", "random", "key_coverage@pyramid", "random@profile",
                                  "key_coverage@keep_then_drop"])
def test_answer_on_evicted_cache_equals_one_masked_forward(setup, name):
    """Eviction is exactly "the question cannot see the evicted keys": one forward of context +
    question with a per-layer 4-D mask hiding those keys from the question rows gives the same logits. Depth
    schedules (``@``) keep a different count in each layer: the cache is ragged and answered with one mask per layer."""
    from unicache_lib.diagnostics.broken import hide_keys
    from unicache_lib.kv.policies.depth import by_profile, keep_then_drop, pyramid

    model, proc, sp, pre, future = setup
    base, _, schedule = name.partition("@")
    pol = POLICIES[base]()
    L = pre.context().n_layers
    if schedule:
        pol = pol.with_depth({"pyramid": pyramid(L), "profile": by_profile(np.arange(1, L + 1) ** 2.0),
                              "keep_then_drop": keep_then_drop(1)}[schedule])
    keep = pol.select(pre.context(seed=1, future=future), 0.25)
    assert (len({len(k) for k in keep}) > 1) == bool(schedule)
    logits, _, _ = answer(model, evict(pre.cache, keep), sp)
    C = sp.context_ids.shape[1]

    def hidden(layer, img):  # img: [S] bool, the image tokens of the forward's sequence
        h = torch.zeros(len(img), len(img), dtype=torch.bool)
        gone = torch.ones(C, dtype=torch.bool)
        gone[keep[layer]] = False
        h[C:, :C] = gone  # question rows may not read evicted context keys; context rows see everything
        return h

    full_ids = torch.cat([sp.context_ids, sp.question_ids], 1)
    with torch.no_grad(), hide_keys(model, hidden):
        ref = model(input_ids=full_ids, pixel_values=sp.pixel_values).logits[0, -1].float()
    assert (logits - ref).abs().max() <= 1e-5
    with torch.no_grad():
        unmasked = model(input_ids=full_ids, pixel_values=sp.pixel_values).logits[0, -1].float()
    assert (logits - unmasked).abs().max() > 1e-3  # the mask is what makes them equal


def _snapkv_scores(model, sp, window):
    """Per layer, the scores SnapKV computed ``[kv_heads, C]`` and the press itself."""
    import kvpress

    from unicache_lib.kv.peers import compression_ratio

    press = kvpress.SnapKVPress(compression_ratio=compression_ratio(sp.context_ids.shape[1], len(sp.image_positions), 0.25),
                                window_size=window)
    seen = []
    score = press.score

    def recording(*a, **k):
        s = score(*a, **k)
        seen.append(s[0].float().clone())
        return s

    press.score = recording
    with press(model):
        prefill(model, sp, attentions=False)
    return seen


def test_snapkv_window_sized_to_the_context_breaks_the_ties(setup):
    from unicache_lib.kv.peers import KVPRESS_DEFAULT_WINDOW, observation_window

    model, proc, sp, pre, _ = setup
    C, n_img = sp.context_ids.shape[1], len(sp.image_positions)
    assert C == 67 and n_img == 64  # the shipped model's context: "user :" + 64 image tokens
    w = observation_window(C)
    assert w == 8 and observation_window(700) == KVPRESS_DEFAULT_WINDOW
    image = sp.image_positions
    # kvpress's default window: the 64 image keys all sit in the window and tie
    default = _snapkv_scores(model, sp, KVPRESS_DEFAULT_WINDOW)
    assert all(len(torch.unique(s[:, image[-KVPRESS_DEFAULT_WINDOW + 3:]])) == 1 for s in default)
    # sized window: the scored image keys (all but the window) differ within every head of every layer,
    # and the heads do not all rank them alike
    sized = _snapkv_scores(model, sp, w)
    assert len(sized) == len(pre.cache.layers)
    scored = image[image < C - w]
    for s in sized:
        sc = s[:, scored]
        assert (sc.max(-1).values > sc.min(-1).values).all()
        assert len(torch.unique(sc)) > sc.shape[-1]
    tops = {tuple(s[h, scored].topk(8).indices.sort().values.tolist()) for s in sized for h in range(s.shape[0])}
    assert len(tops) > 1
    with pytest.raises(ValueError, match="nothing to score"):
        observation_window(1)


def test_adakv_masks_and_keeps_full_memory(setup):
    from unicache_lib.kv.peers import ADAKV, MASKED_LABEL, attention_implementation, compression_ratio, press_factories

    model, proc, sp, pre, _ = setup
    assert MASKED_LABEL in ADAKV
    C, n_img = sp.context_ids.shape[1], len(sp.image_positions)
    press = press_factories()[ADAKV](compression_ratio(C, n_img, 0.25), C)
    with attention_implementation(model, "sdpa"):
        with press(model):
            pp = prefill(model, sp, attentions=False)
        masked = [m.masked_key_indices for m in model.modules() if getattr(m, "masked_key_indices", None) is not None]
        assert len(masked) == len(pre.cache.layers) and all(len(m[2]) > 0 for m in masked)  # keys are masked ...
        assert kv_bytes(pp.cache) == kv_bytes(pre.cache)  # ... and nothing is freed
    assert all(getattr(m, "masked_key_indices", None) is None for m in model.modules())  # cleared on exit


def test_run_eviction_prefill_stage_rows_and_peer_comparison(setup):
    import pandas as pd

    from unicache_lib.kv.evaluate import against_peers, run_eviction, share_of_full, worst_peer_difference
    from unicache_lib.world.questions import heldout_set

    model, proc, *_ = setup
    qas = heldout_set(3, seed=5)
    pols = {n: POLICIES[n]() for n in ("full", "key_coverage", "divprune", "random")}
    R = run_eviction(model, proc, qas, [0.25], pols, None, 0, progress=False)
    assert R.attrs["skipped"] == {}
    C = R[R.method == "full"].prefill_tokens.iloc[0]
    dp, kc = R[R.method == "divprune"], R[R.method == "key_coverage"]
    assert (dp.prefill_tokens < C).all() and (kc.prefill_tokens == C).all()  # only DivPrune prefilled fewer tokens
    assert np.allclose(dp.kv_fraction.to_numpy(), kc.kv_fraction.to_numpy())  # the same budget, the same bytes
    # the comparison helpers on a hand-made table: 4 questions, ours right on all, a peer wrong on one
    t = pd.DataFrame([{"question": q, "method": m, "budget": 0.25, "correct": ok}
                      for q in range(4) for m, ok in (("full", True), ("ours", True), ("peer", q != 2))])
    v = against_peers(t, "ours", ["peer", "absent"])
    assert list(v.peer) == ["peer"] and v["diff"].iloc[0] == pytest.approx(0.25)
    assert worst_peer_difference(t, "ours", ["peer"]).value == pytest.approx(0.25)
    assert share_of_full(t, "peer", 0.25).value == pytest.approx(0.75)


def test_per_question_accuracy_averages_over_budgets():
    import pandas as pd

    from unicache_lib.kv.evaluate import per_question_accuracy

    t = pd.DataFrame([{"kind": "policy", "question": q, "method": "p", "budget": b, "correct": (q + i) % 2 == 0}
                      for q in (2, 0, 1) for i, b in enumerate((0.1, 0.25, 0.5))])
    a = per_question_accuracy(t, "p")
    assert a.shape == (3,) and a[0] == pytest.approx(2 / 3) and a[1] == pytest.approx(1 / 3)  # sorted by question
    with pytest.raises(KeyError, match="run it in run_eviction"):
        per_question_accuracy(t, "absent")


def test_pooling_feeds_the_average_of_each_window(setup):
    """The pooling control hands the language model, at each window's centre patch, the mean of the window's
    projected features (adaptive_avg_pool2d over the image grid), and nothing else of the image."""
    import math

    import torch.nn.functional as F

    from unicache_lib.kv.cache import prefill_pruned
    from unicache_lib.kv.policies.pooling import pooled_grid

    model, proc, sp, pre, _ = setup
    ctx = pre.context(seed=3)
    side = math.isqrt(len(ctx.grid))
    got, full = {}, {}
    layer0 = model.model.language_model.layers[0]  # its input is the (pruned) embeddings, after the pruning hook
    h = layer0.register_forward_pre_hook(lambda m, a: [got.setdefault("emb", a[0].clone()), None][1])
    try:
        prefill_pruned(model, sp, POLICIES["pooling"]().token_picker(ctx, 0.25), renumber=False)
    finally:
        h.remove()
    h = layer0.register_forward_pre_hook(lambda m, a: [full.setdefault("emb", a[0].clone()), None][1])
    try:
        prefill(model, sp, attentions=False)
    finally:
        h.remove()
    img = sp.image_positions
    feats = full["emb"][0, img][ctx.grid].float()  # [side * side, D]
    a, b = pooled_grid(side, ctx.k(0.25))
    assert (a, b) == (side // 2, side // 2)  # 25% of a square grid is 2 x 2 pooling
    want = F.adaptive_avg_pool2d(feats.T.reshape(1, -1, side, side), (a, b))[0].reshape(feats.shape[1], -1).T
    C = sp.context_ids.shape[1]
    assert got["emb"].shape[1] == C - len(img) + a * b
    pooled = got["emb"][0, int(img[0]):int(img[0]) + a * b].float()  # the kept image tokens, in grid order
    torch.testing.assert_close(pooled, want.to(pooled.dtype).float(), rtol=0, atol=1e-6)


def test_ablations_swap_one_part_of_the_design(setup):
    """divprune_keys runs DivPrune's rule on each layer's cached keys; key_coverage_features runs key_coverage's
    k-center on the projected features before the prefill, from the largest-norm one."""
    from unicache_lib.kv.policies.divprune import max_min_diverse
    from unicache_lib.kv.policies.key_coverage import farthest_point

    model, proc, sp, pre, _ = setup
    ctx = pre.context(seed=3)
    k = ctx.k(0.25)
    chosen = POLICIES["divprune_keys"]().choose(ctx, k)
    keys, _ = ctx.image_kv(1)
    assert chosen[1] == max_min_diverse(keys.permute(1, 0, 2).reshape(ctx.n_image, -1), k)
    assert len({tuple(c) for c in chosen}) > 1  # each layer chooses for itself
    x = torch.randn(30, 8)
    from dataclasses import replace
    got = POLICIES["key_coverage_features"]().choose(replace(ctx, features=x), 5)[0]
    assert got == farthest_point(x, 5, int(x.norm(dim=1).argmax())) and got[0] == int(x.norm(dim=1).argmax())


def test_downsample_encodes_a_smaller_picture_through_the_tower(setup):
    """The downsampled-image control: at the native grid the tower's re-encoding is the model's own image features
    (nothing but the resolution changes); at 25% the language model receives, at each window's centre patch, the
    tower's features of the picture resized to the pooled grid; a family without a resizable patch grid is skipped
    with the reason (run_eviction leaves it out), never measured on a guess."""
    import math

    from unicache_lib.core.errors import PrefillPruningUnsupported
    from unicache_lib.families.llava import LlavaNext
    from unicache_lib.kv.cache import prefill_pruned
    from unicache_lib.kv.policies.pooling import pooled_grid

    model, proc, sp, pre, _ = setup
    ctx = pre.context(seed=3)
    side = math.isqrt(len(ctx.grid))
    with torch.no_grad():
        own = model.model.get_image_features(pixel_values=sp.pixel_values, vision_feature_layer=-1,
                                             vision_feature_select_strategy="default").pooler_output[0]
    torch.testing.assert_close(ctx.encode(side, side), own.float(), rtol=0, atol=1e-5)
    a, b = pooled_grid(side, ctx.k(0.25))
    small = ctx.encode(a, b)
    assert small.shape == (a * b, own.shape[-1]) and not torch.allclose(small, own[: a * b].float())
    got = {}
    layer0 = model.model.language_model.layers[0]
    h = layer0.register_forward_pre_hook(lambda m, args: [got.setdefault("emb", args[0].clone()), None][1])
    try:
        prefill_pruned(model, sp, POLICIES["downsample"]().token_picker(ctx, 0.25), renumber=False)
    finally:
        h.remove()
    img = sp.image_positions
    assert got["emb"].shape[1] == sp.context_ids.shape[1] - len(img) + a * b
    fed = got["emb"][0, int(img[0]):int(img[0]) + a * b].float()
    torch.testing.assert_close(fed, small.to(fed.dtype).float(), rtol=0, atol=1e-6)
    with pytest.raises(PrefillPruningUnsupported, match="not measurable here"):
        LlavaNext().image_features_at(model, sp.pixel_values, a, b)


@pytest.fixture(scope="module")
def eager_tiny():
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding("tiny-llava", attn_implementation="eager")


def test_batched_answers_equal_batch_one(eager_tiny):
    """32 questions in one prefill and one question pass: the greedy answer ids equal batch 1's (torch.equal), the
    logits agree to float rounding, each sample's prefill maps are its own batch-1 maps, and the question pass's
    attention (padding removed) is batch 1's."""
    from unicache_lib.kv.batch import answer_batch, groups_by_context, prefill_batch
    from unicache_lib.world.questions import heldout_set

    model, proc = eager_tiny
    sps = [split_prompt(proc, q.scene.uint8(), q.question, model=model) for q in heldout_set(32, seed=5)]
    assert len({sp.question_ids.shape[1] for sp in sps}) > 1  # questions of several lengths: the pass is padded
    assert len(groups_by_context(sps, 32)) == 1  # one context length: one prefill batch
    pol = POLICIES["key_coverage"]()
    pres = prefill_batch(model, sps)
    first, atts = answer_batch(model, [evict(p.cache, pol.select(p.context(), 0.25)) for p in pres], sps,
                               output_attentions=True)
    one, one_atts = [], []
    for sp, pb in zip(sps, pres):
        pre = prefill(model, sp)
        assert all(torch.equal(a, b) for a, b in zip(pre.attentions, pb.attentions))
        f, _, a = answer(model, evict(pre.cache, pol.select(pre.context(), 0.25)), sp, output_attentions=True)
        one.append(f)
        one_atts.append(a)
    assert torch.equal(first.argmax(-1), torch.stack(one).argmax(-1))
    torch.testing.assert_close(first, torch.stack(one), rtol=0, atol=1e-4)
    for a, b in zip(atts, one_atts):
        assert [x.shape for x in a] == [y.shape for y in b]
        torch.testing.assert_close(torch.stack([x[0] for x in a]), torch.stack([y[0] for y in b]), rtol=0, atol=1e-5)


def test_run_eviction_in_batches_gives_batch_one_rows(eager_tiny):
    """run_eviction(batch_size=8) on 12 questions (a full batch and a short one): the same rows in the same order,
    the same answers, bytes and kept positions; KL to float rounding. A bad batch size is refused before any
    question runs."""
    import pandas as pd

    from unicache_lib.core.errors import InputError
    from unicache_lib.kv.batch import groups_by_context
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.world.questions import heldout_set

    model, proc = eager_tiny
    qas = heldout_set(12, seed=21)
    pols = {n: POLICIES[n]() for n in ("full", "key_coverage", "snapkv", "oracle", "divprune")}
    one = run_eviction(model, proc, qas, [0.1, 0.5], pols, None, 0, progress=False)
    many = run_eviction(model, proc, qas, [0.1, 0.5], pols, None, 0, progress=False, batch_size=8)
    same = ["question", "method", "budget", "correct", "agree", "kv_bytes", "kv_fraction", "prefill_tokens"]
    pd.testing.assert_frame_equal(one[same], many[same])
    assert np.allclose(one.kl, many.kl, atol=1e-4) and np.allclose(one.retained, many.retained, atol=1e-5)
    with pytest.raises(InputError, match="positive integer"):
        groups_by_context([], 0)


def test_batched_eviction_refuses_what_it_cannot_batch():
    """A family with cross-attention image KV (Mllama) is refused, naming batch_size=1."""
    from unicache_lib.core.errors import UnsupportedError
    from unicache_lib.kv.batch import check_batchable
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, proc = load_understanding("tiny-mllama")
    q = heldout_set(1, seed=3)[0]
    with pytest.raises(UnsupportedError, match="batch_size=1"):
        check_batchable(split_prompt(proc, q.scene.uint8(), q.question, model=model).family)


def test_split_prompts_in_one_call_equal_split_prompt(eager_tiny):
    """Many questions encoded in one processor call (padded, then cut back per sample) give exactly the splits
    split_prompt gives one at a time: ids, image inputs, image positions."""
    from unicache_lib.kv.cache import split_prompts
    from unicache_lib.world.questions import heldout_set

    model, proc = eager_tiny
    qas = heldout_set(12, seed=8)
    many = split_prompts(proc, [q.scene.uint8() for q in qas], [q.question for q in qas], model)
    assert len({sp.question_ids.shape[1] for sp in many}) > 1  # the call was padded
    for q, b in zip(qas, many):
        a = split_prompt(proc, q.scene.uint8(), q.question, model=model)
        assert torch.equal(a.full_ids, b.full_ids) and torch.equal(a.pixel_values, b.pixel_values)
        assert torch.equal(a.image_positions, b.image_positions) and a.context_ids.shape == b.context_ids.shape


def test_key_coverage_prefill_covers_the_first_layers_keys(setup):
    """key_coverage_prefill chooses before the prefill: a k-center cover of the keys the first layer computes for the
    image embeddings (input norm, key projection), started at the largest-norm key; the prefill then runs on the
    kept tokens only. A first layer without a key projection is refused with the reason."""
    from dataclasses import replace

    from unicache_lib.core.errors import PrefillPruningUnsupported
    from unicache_lib.families import family_of
    from unicache_lib.kv.cache import prefill_pruned
    from unicache_lib.kv.policies.key_coverage import farthest_point

    model, proc, sp, pre, _ = setup
    ctx = pre.context(seed=3)
    feats = torch.randn(ctx.n_image, model.config.text_config.hidden_size)
    layer = model.model.language_model.layers[0]
    with torch.no_grad():
        keys = layer.self_attn.k_proj(layer.input_layernorm(feats)).float()
    k = ctx.k(0.25)
    got = POLICIES["key_coverage_prefill"]().choose(replace(ctx, features=feats), k)[0]
    assert got == farthest_point(keys, k, int(keys.norm(dim=1).argmax()))
    _, _, kept = prefill_pruned(model, sp, POLICIES["key_coverage_prefill"]().token_picker(ctx, 0.25), renumber=False)
    assert len(kept) == sp.context_ids.shape[1] - ctx.n_image + k
    fam = family_of(model)
    saved = layer.self_attn.k_proj
    del layer.self_attn.k_proj
    try:
        with pytest.raises(PrefillPruningUnsupported, match="key_coverage_features"):
            fam.first_layer_keys(model, feats)
    finally:
        layer.self_attn.k_proj = saved


def test_a_batch_of_one_runs_batch_ones_own_path(eager_tiny):
    """run_eviction(batch_size=8) on 9 questions: the lone ninth question is prefilled and answered by batch 1's own
    prefill and answer (the batch path only serves more than one), so its rows equal batch 1's exactly, KL included;
    the batch functions themselves check the family, even for one question (Mllama cannot batch)."""
    from unicache_lib.core.errors import UnsupportedError
    from unicache_lib.kv.batch import prefill_batch
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, proc = eager_tiny
    qas = heldout_set(9, seed=21)
    pols = {n: POLICIES[n]() for n in ("full", "key_coverage", "key_coverage_merge")}
    one = run_eviction(model, proc, qas[8:], [0.1], pols, None, 0, progress=False)
    many = run_eviction(model, proc, qas, [0.1], pols, None, 0, progress=False, batch_size=8)
    lone = many[many.question == 8].reset_index(drop=True)
    cols = ["method", "budget", "correct", "agree", "kl", "kv_bytes", "retained"]
    assert lone[cols].equals(one[cols])
    mllama, mproc = load_understanding("tiny-mllama")
    q = heldout_set(1, seed=3)[0]
    sp = split_prompt(mproc, q.scene.uint8(), q.question, model=mllama)
    with pytest.raises(UnsupportedError, match="batch_size=1"):
        prefill_batch(mllama, [sp], attentions=False)

def test_run_eviction_reproduces_the_rows_recorded_before_the_stages(eager_tiny):
    """Issue #61's rework (policies that apply themselves, the eviction path in stages) moved no output: run_eviction on
    tiny-llava, every policy of the recording plus a depth-scheduled merge at batch 1 and at batch 4, gives the rows
    recorded before it (tests/reference/eviction_tiny_llava.json): the same correct, agree and kv_bytes, and the same
    KL float for float where torch, the CPU (its model and kernels) and the thread count are the recording's (elsewhere
    a matrix product may sum in another order: on an AMD EPYC with the recording's AVX512 kernels and thread count the
    KL moved by up to 1.2e-7 absolute, float32 rounding of logits in the tens; so to 1e-4 relative and 1e-6 absolute,
    far below the median KL of 5e-4 that a change of policy would move)."""
    import json
    from pathlib import Path

    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.kv.policies.depth import pyramid
    from unicache_lib.world.questions import heldout_set

    ref = json.loads((Path(__file__).parent / "reference" / "eviction_tiny_llava.json").read_text())
    here = {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "model": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"}
    model, proc = eager_tiny
    qas = heldout_set(12, seed=2024)
    names = list(dict.fromkeys(r[1] for r in ref["batch_4"]))
    depth = POLICIES["key_coverage_merge"]().with_depth(pyramid(4))
    assert depth.name == "key_coverage_merge@pyramid(beta=20)"
    pols = {n: POLICIES[n]() for n in names}
    for key, got in (("batch_1", run_eviction(model, proc, qas, [0.1, 0.25], {**pols, depth.name: depth}, None, 0,
                                              progress=False)),
                     ("batch_4", run_eviction(model, proc, qas, [0.1, 0.25], pols, None, 0, progress=False, batch_size=4))):
        want = ref[key]
        rows = [[int(r.question), r.method, float(r.budget), bool(r.correct), bool(r.agree), int(r.kv_bytes)]
                for r in got.itertuples()]
        assert rows == [w[:6] for w in want], key
        kl = np.array([float.fromhex(w[6]) for w in want])
        if here == ref["recorded"]:
            assert np.array_equal(got.kl.to_numpy(), kl), key
        else:
            np.testing.assert_allclose(got.kl.to_numpy(), kl, rtol=1e-4, atol=1e-6, err_msg=key)


# every parameter of every policy, as a field: a value it takes, and values it refuses
POLICY_FIELDS = {
    "snapkv": ({"window": 16, "kernel": 3}, [{"window": 0}, {"window": "8"}, {"kernel": 4}]),
    "fastv": ({"K": 3}, [{"K": 0}, {"K": 1.5}]),
    "h2o": ({"recent": 0.25}, [{"recent": 1.5}, {"recent": "half"}]),
    "streaming": ({"sinks": 2}, [{"sinks": -1}]),
    "unicache": ({"anchors": 0.5, "swap_bands": True}, [{"anchors": 2.0}, {"swap_bands": "yes"}]),
    "key_coverage": ({"points": "values", "metric": "cosine", "anchors": 0.25, "alpha": 1.0},
                     [{"points": "queries"}, {"metric": "manhattan"}, {"anchors": -0.1}, {"alpha": float("nan")}]),
    "key_coverage_merge": ({"points": "keys+values", "metric": "cosine", "anchors": 0.5, "alpha": 0.2},
                           [{"points": "keys + values"}]),
    "key_coverage_prefill": ({"points": "features", "start": "outlier", "renumber": True},
                             [{"points": "keys"}, {"start": "middle"}]),
    "divprune": ({"renumber": True}, [{"renumber": "no"}]),
    "key_coverage_features": ({"renumber": True}, [{"renumber": 1}]),
    "pooling": ({"renumber": True}, []),
    "downsample": ({"renumber": True}, []),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_parameter_is_a_checked_field(name):
    """SnapKV(window=16)-style construction for every policy with parameters: each parameter is a dataclass field (listed
    above, so a new one is tested), set at construction, and an out-of-range value is refused with a one-line
    InputError; ``depth`` is a field of every policy (keyword only)."""
    import dataclasses

    from unicache_lib.core.errors import InputError

    cls = POLICIES[name]
    given, bad = POLICY_FIELDS.get(name, ({}, []))
    assert {f.name for f in dataclasses.fields(cls)} - {"depth"} == set(given)
    pol = cls(**given)
    assert all(getattr(pol, k) == v for k, v in given.items()) and pol.name == name and pol.depth is None
    for b in bad:
        with pytest.raises(InputError) as e:
            cls(**b)
        assert "\n" not in str(e.value)


def test_fields_change_what_a_policy_keeps(setup):
    """A field is the policy's own parameter: SnapKV's window, H2O's recent share, key_coverage's distance change
    what is kept; SnapKV's default window is the shipped model's 8 (the rule, :func:`observation_window`)."""
    model, proc, sp, pre, future = setup
    ctx = pre.context(seed=3, future=future)

    def keep(pol):
        return [k.tolist() for k in pol.select(ctx, 0.25)]

    assert keep(POLICIES["snapkv"]()) == keep(POLICIES["snapkv"](window=8)) != keep(POLICIES["snapkv"](window=32))
    assert keep(POLICIES["h2o"]()) != keep(POLICIES["h2o"](recent=0.0))
    assert keep(POLICIES["key_coverage"]()) != keep(POLICIES["key_coverage"](metric="cosine"))


def test_snapkv_window_is_one_rule_for_the_policy_and_the_peer():
    """The policy's default observation window and the kvpress peer's are one function of the context's length: 8 of
    the shipped model's 67 positions, 64 (kvpress's cap) of a 576-token context's 579, where the policy used 8 before."""
    from unicache_lib.kv import peers
    from unicache_lib.kv.cache import EvictionContext
    from unicache_lib.kv.policies import snapkv

    assert peers.observation_window is snapkv.observation_window
    assert snapkv.observation_window(67) == 8 and snapkv.observation_window(579) == 64
    g = torch.Generator().manual_seed(0)
    C = 579
    att = torch.rand(2, C, C, generator=g).tril()
    ctx = EvictionContext(C, torch.arange(3, C), 1, [att / att.sum(-1, keepdim=True)])
    default = POLICIES["snapkv"]().score(ctx, 0)
    assert torch.equal(default, POLICIES["snapkv"](window=64).score(ctx, 0))
    assert not torch.equal(default, POLICIES["snapkv"](window=8).score(ctx, 0))


def test_depth_is_a_field_and_names_the_policy():
    """``depth`` is a field: set at construction or by with_depth (a renamed copy); the name reads
    ``"<name>@<schedule>"`` and the registry's name stays the class's; a prefill-stage policy refuses a schedule."""
    import dataclasses

    from unicache_lib.core.errors import InputError
    from unicache_lib.kv.policies.depth import pyramid

    base = POLICIES["key_coverage"](alpha=0.2)
    deep = base.with_depth(pyramid(4))
    assert deep is not base and base.depth is None and base.name == "key_coverage"
    assert deep.name == "key_coverage@pyramid(beta=20)" and deep.alpha == 0.2
    assert POLICIES["key_coverage"](depth=pyramid(4)).name == deep.name
    assert dataclasses.replace(deep, alpha=1.0).name == deep.name
    assert deep.with_depth(pyramid(4, beta=10)).name == "key_coverage@pyramid(beta=10)"
    with pytest.raises(InputError, match="prefill-stage"):
        POLICIES["divprune"](depth=pyramid(4))


def test_a_policy_says_how_it_acts_by_its_class_not_a_flag():
    """The former kind flags (``stage = "prefill"``, ``merges = True``) are read by nothing: a class that sets one is
    refused when it is defined, naming what to do instead."""
    from unicache_lib.core.errors import ContractError
    from unicache_lib.kv.policies import EvictionPolicy

    for flag, value in (("stage", "prefill"), ("merges", True)):
        with pytest.raises(ContractError, match="PrefillStagePolicy"):
            type("Flagged", (EvictionPolicy,), {flag: value, "choose": lambda self, ctx, k: []})
