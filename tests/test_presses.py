"""KeyCoveragePress (unicache_lib/kv/presses.py): the designed eviction policy as a kvpress press keeps, in every layer,
exactly what the workbench's key_coverage policy keeps, and answers identically; its refusals name the fix."""
import re

import pytest
import torch

from unicache_lib.core.errors import ContractError
from unicache_lib.families import family_of
from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill, split_prompt
from unicache_lib.kv.peers import attention_implementation, compression_ratio
from unicache_lib.kv.policies.base import PrefillStagePolicy
from unicache_lib.kv.presses import KeyCoveragePress


@pytest.fixture(scope="module")
def llava():
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    return model, processor, heldout_set(4, seed=2024)


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_press_keeps_what_the_policy_keeps_and_answers_the_same(llava, budget):
    model, processor, qas = llava
    for q in qas:
        sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
        pre = prefill(model, sp, attentions=True)
        ctx = pre.context()
        keep = POLICIES["key_coverage"]().select(ctx, budget)
        policy_cache = evict(pre.cache, keep)
        C = sp.context_ids.shape[1]
        press = KeyCoveragePress(compression_ratio=compression_ratio(C, ctx.n_image, budget))
        with press(model):
            pressed = prefill(model, sp, attentions=False)
        for li, k in enumerate(keep):
            a, b = policy_cache.layers[li], pressed.cache.layers[li]
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {li}: kept other positions"
        assert kv_bytes(pressed.cache) == kv_bytes(policy_cache)
        assert torch.equal(answer(model, policy_cache, sp)[0], answer(model, pressed.cache, sp)[0])
        assert press._image is None  # the prompt's positions are not carried to the next call


def test_press_compresses_image_positions_only(llava):
    model, processor, qas = llava
    sp = split_prompt(processor, qas[0].scene.uint8(), qas[0].question, model=model)
    C = sp.context_ids.shape[1]
    is_image = sp.context_ids[0] == family_of(model).image_token_id(model.config)
    n_text = C - int(is_image.sum())
    full = prefill(model, sp, attentions=False).cache.layers[0].keys
    for ratio, kept in ((0.5, int(C * 0.5)), (0.99, n_text + 1)):  # 0.99: more than the image holds, one image key stays
        with KeyCoveragePress(compression_ratio=ratio)(model):
            pressed = prefill(model, sp, attentions=False)
        keys = pressed.cache.layers[0].keys
        assert keys.shape[2] == kept  # as many as any kvpress press keeps at this ratio
        text = full[:, :, ~is_image]  # every text position is kept, in order, at the front and back of the image
        first = int(is_image.nonzero()[0])
        assert torch.equal(keys[:, :, :first], text[:, :, :first]) and torch.equal(keys[:, :, kept - (n_text - first):],
                                                                                     text[:, :, first:])


def test_press_refusals_name_the_fix(llava, monkeypatch):
    model, processor, qas = llava
    sp = split_prompt(processor, qas[0].scene.uint8(), qas[0].question, model=model)
    with pytest.raises(ValueError, match=r"compression_ratio must be a fraction in \[0, 1\)"):
        KeyCoveragePress(compression_ratio=1.0)
    with pytest.raises(TypeError, match=r"pass compression_ratio=0.5, not the string '0.5'"):
        KeyCoveragePress(compression_ratio="0.5")
    with pytest.raises(ValueError, match=r"image_token_id must be a token id"):
        KeyCoveragePress(compression_ratio=0.5, image_token_id="4")
    assert KeyCoveragePress(compression_ratio=0.5, image_token_id=torch.tensor(4).numpy()[()]).image_token_id == 4
    with KeyCoveragePress(compression_ratio=0.5)(model):  # two presses nested: named, not called a StaticCache
        with pytest.raises(ValueError, match=r"KeyCoveragePress is already applied to this model.*apply one press at a "
                                             r"time.*ComposedPress cannot carry one"):
            with KeyCoveragePress(compression_ratio=0.25)(model):
                pass
    assert not hasattr(model, "_unicache_press")  # and the first one's mark is gone on exit
    from kvpress import ComposedPress  # round 13: the refusal used to advise ComposedPress, which then failed

    with pytest.raises(ContractError, match=r"inside kvpress's ComposedPress.*apply it alone") as e, \
            ComposedPress([KeyCoveragePress(compression_ratio=0.25)])(model):
        prefill(model, sp, attentions=False)
    assert "\n" not in str(e.value)
    with attention_implementation(model, "sdpa"), pytest.raises(ValueError, match="attn_implementation='eager'"):
        with KeyCoveragePress(compression_ratio=0.5)(model):
            prefill(model, sp, attentions=False)
    # the fix the message names: eager attention (the fixture's model) compresses
    with KeyCoveragePress(compression_ratio=0.5)(model):
        assert prefill(model, sp, attentions=False).cache.layers[0].keys.shape[2] < sp.context_ids.shape[1]

    tid = family_of(model).image_token_id(model.config)
    monkeypatch.setattr(model.config, "image_token_index", None)  # a config that names no image token
    with pytest.raises(ValueError, match=r"pass KeyCoveragePress\(image_token_id=\.\.\.\)"):
        with KeyCoveragePress(compression_ratio=0.5)(model):
            pass
    explicit = KeyCoveragePress(compression_ratio=0.5, image_token_id=tid)
    explicit.post_init_from_model(model)  # the fix: an explicit id needs nothing from the config
    monkeypatch.undo()  # (LLaVA's own forward needs the config's id to place the image features)
    with explicit(model):
        assert prefill(model, sp, attentions=False).cache.layers[0].keys.shape[2] < sp.context_ids.shape[1]
    with pytest.raises(RuntimeError, match="outside `with press"):
        KeyCoveragePress(compression_ratio=0.5).compress(None, None, torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2), None, {})
    # a wrong image token id would find no image position: refused, naming the fix, instead of compressing nothing
    with pytest.raises(ValueError, match=r"no token of id 3\b.*pass image_token_id="):
        with KeyCoveragePress(compression_ratio=0.5, image_token_id=3)(model):
            prefill(model, sp, attentions=False)
    with KeyCoveragePress(compression_ratio=0.5, image_token_id=tid)(model):  # the fix: the processor's image id
        assert prefill(model, sp, attentions=False).cache.layers[0].keys.shape[2] < sp.context_ids.shape[1]
    # round 14: one press on two models kept the first model's image id; the id read from a model is forgotten on exit
    press = KeyCoveragePress(compression_ratio=0.5)
    with press(model):
        assert press.image_token_id == tid
    assert press.image_token_id is None and explicit.image_token_id == tid  # a user's id is kept
    monkeypatch.setattr(model.config, "image_token_index", None)
    with pytest.raises(ValueError, match=r"pass KeyCoveragePress\(image_token_id=\.\.\.\)"):
        with press(model):  # the next model's own id (here: none) is read afresh, not the last one's
            pass
    monkeypatch.undo()
    assert not hasattr(model, "_unicache_press")  # a refused setup leaves the model free for the next press


def test_press_refuses_a_cross_attention_vlm():
    """Mllama keeps its image KV in cross-attention layers: a press would compress nothing of the image, silently."""
    from unicache_lib.runtime.loaders import load_understanding

    mllama, _ = load_understanding("tiny-mllama", attn_implementation="eager")
    with pytest.raises(ValueError, match="cross-attention layers.*run_eviction"):
        with KeyCoveragePress(compression_ratio=0.5)(mllama):
            pass


def test_an_encoder_family_is_told_it_keeps_no_kv_cache():
    """Round 15's poor 16: split_prompt on tiny-vilt / tiny-clip was a raw AttributeError on the processor."""
    import numpy as np

    from unicache_lib.runtime.loaders import load_understanding

    for name in ("tiny-vilt", "tiny-clip"):
        model, processor = load_understanding(name)
        with pytest.raises(ValueError, match=r"puts no image token in its text and keeps no KV cache"):
            split_prompt(processor, np.zeros((64, 64, 3), np.uint8), "what colour is the square ?", model=model)


def test_divprune_keys_press_keeps_what_the_ablation_policy_keeps(llava):
    """DivPruneKeysPress: DivPrune's rule on each layer's cached image keys, the positions of POLICIES['divprune_keys']
    (torch.equal, every layer) and the same answers; it needs no attention weights, so it also runs under sdpa."""
    from unicache_lib.kv.presses import DivPruneKeysPress

    model, processor, qas = llava
    for q in qas[:2]:
        sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
        pre = prefill(model, sp, attentions=True)
        ctx = pre.context()
        keep = POLICIES["divprune_keys"]().select(ctx, 0.25)
        policy_cache = evict(pre.cache, keep)
        press = DivPruneKeysPress(compression_ratio=compression_ratio(sp.context_ids.shape[1], ctx.n_image, 0.25))
        with press(model):
            pressed = prefill(model, sp, attentions=False)
        for li in range(len(keep)):
            a, b = policy_cache.layers[li], pressed.cache.layers[li]
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {li}"
        assert torch.equal(answer(model, policy_cache, sp)[0], answer(model, pressed.cache, sp)[0])
        with attention_implementation(model, "sdpa"), press(model):  # no attention weights needed
            assert prefill(model, sp, attentions=False).cache.layers[0].keys.shape[2] == len(keep[0])


def test_press_refuses_a_filled_or_preallocated_cache_naming_the_fix(llava):
    """kvpress compresses only a prefill from an empty cache: a cache that already holds positions would leave the image
    uncompressed without a word, and a pre-allocated cache's keys do not line up with the prompt. Both are refused, each
    naming its fix, and the fix (a new DynamicCache) compresses."""
    from transformers import DynamicCache, StaticCache

    from unicache_lib.inputs import encode

    model, processor, qas = llava
    q = qas[0]
    inputs = encode(processor, q.scene.uint8(), q.question)
    n = inputs["input_ids"].shape[1]
    filled = DynamicCache()
    with torch.no_grad():
        model(**inputs, past_key_values=filled, use_cache=True)
    press = KeyCoveragePress(compression_ratio=0.5)
    with pytest.raises(ValueError, match=r"already holds \d+ positions.*empty cache"), press(model), torch.no_grad():
        model(**inputs, past_key_values=filled, use_cache=True)
    static = StaticCache(config=model.config, max_cache_len=n + 8)
    with pytest.raises(ValueError, match="pre-allocated cache.*DynamicCache"), press(model), torch.no_grad():
        model(**inputs, past_key_values=static, use_cache=True)
    fresh = DynamicCache()
    with press(model), torch.no_grad():
        model(**inputs, past_key_values=fresh, use_cache=True)
    assert fresh.get_seq_length() < n


ONE_LAYER_REFUSED = {"fastv", "unicache", "oracle", "full"}  # round 11: each needs more than one layer's cache


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_as_a_press_keeping_what_the_harness_keeps_or_is_refused(llava, name):
    """PolicyPress runs a workbench policy's own ``choose`` inside kvpress's hook: for every policy it accepts, the
    press keeps what the harness keeps (torch.equal, every layer); the rest are refused where the press is made, in
    one line naming why: a prefill-stage policy (it chooses before the language model runs) and, round 11, a policy
    that cannot choose from one layer's cache alone (fastv ranks once from one layer, unicache from the shallow band,
    the oracle from a later run; full keeps everything): fastv used to keep other positions than the harness, and
    the other three to fail at the first forward."""
    from unicache_lib.kv.presses import PolicyPress

    try:
        PolicyPress(compression_ratio=0.5, policy=POLICIES[name]())
    except ValueError as e:
        assert "\n" not in str(e) and re.search(r"prefill-stage|a press sees one layer at a time.*run_eviction", str(e))
        assert name in ONE_LAYER_REFUSED | {n for n, c in POLICIES.items() if issubclass(c, PrefillStagePolicy)}
        return
    assert name not in ONE_LAYER_REFUSED
    model, processor, qas = llava
    q = qas[1]
    sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
    pre = prefill(model, sp, attentions=True)
    ctx = pre.context()
    harness = POLICIES[name]().apply(model, pre, ctx, 0.25).cache
    with PolicyPress(compression_ratio=compression_ratio(sp.context_ids.shape[1], ctx.n_image, 0.25),
                     policy=POLICIES[name]())(model):
        pressed = prefill(model, sp, attentions=False)
    for li in range(len(harness.layers)):
        assert torch.equal(harness.layers[li].keys, pressed.cache.layers[li].keys), f"layer {li}"
        assert torch.equal(harness.layers[li].values, pressed.cache.layers[li].values), f"layer {li}"


@pytest.mark.parametrize("field,value,msg", [("compression_ratio", 70, r"compression_ratio must be a fraction"),
                                             ("compression_ratio", 1.0, r"compression_ratio must be a fraction"),
                                             ("compression_ratio", True, r"compression_ratio"),
                                             ("compression_ratio", -0.5, r"compression_ratio must be a fraction"),
                                             ("compression_ratio", float("nan"), r"compression_ratio"),
                                             ("compression_ratio", "0.5", r"not the string '0.5'"),
                                             ("policy", "fastv", r"'fastv' ranks the image keys once.*run_eviction")])
def test_a_field_set_after_the_press_is_made_is_checked_at_the_forward(llava, field, value, msg):
    """Round 12's N5: kvpress's evaluation loop sets press.compression_ratio by assignment, past every check of the
    press's __init__: 70, 1.0 or True kept one image key per layer, -0.5 compressed nothing, and an assigned fastv
    kept other positions than the harness, all without a word."""
    model, processor, qas = llava
    sp = split_prompt(processor, qas[0].scene.uint8(), qas[0].question, model=model)
    press = KeyCoveragePress(compression_ratio=0.5)
    setattr(press, field, POLICIES[value]() if field == "policy" else value)
    with pytest.raises((ValueError, TypeError), match=msg) as e, press(model):
        prefill(model, sp, attentions=False)
    assert "\n" not in str(e.value)
    press.compression_ratio, press.policy = 0.5, POLICIES["key_coverage"]()  # the fix: a ratio in [0, 1), a per-layer rule
    with press(model):
        assert prefill(model, sp, attentions=False).cache.get_seq_length() < sp.context_ids.shape[1]


@pytest.mark.parametrize("field,value", [("alpha", -1.0), ("alpha", float("nan"))])
def test_a_policy_field_set_after_it_is_made_is_checked_where_it_runs(llava, field, value):
    """Round 14's SN5: key_coverage's alpha set to -1 or NaN by assignment ran (and kept other positions) in the
    harness and in a press, though its constructor refuses both."""
    from unicache_lib.kv.evaluate import run_eviction

    model, processor, qas = llava
    pol = POLICIES["key_coverage"]()
    setattr(pol, field, value)
    with pytest.raises(ValueError, match="key_coverage alpha"):
        run_eviction(model, processor, qas[:1], [0.25], {"key_coverage": pol}, peers={}, progress=False)
    with pytest.raises(ValueError, match="key_coverage alpha"):
        KeyCoveragePress(compression_ratio=0.5, policy=pol)
