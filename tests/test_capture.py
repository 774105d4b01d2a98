import pytest
import torch

from unicache_lib import stats as S
from unicache_lib.capture import AttentionCapture, CaptureError, find_attention_modules
from unicache_lib.capture.runner import capture_samples
from unicache_lib.core.errors import LayerError
from unicache_lib.core.modality import SpanError, Spans


def _hooks(model):
    """Hooks installed by a capture (transformers adds hooks of its own, which are not counted)."""
    return sum(isinstance(getattr(fn, "__self__", None), AttentionCapture)
               for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks) for fn in d.values())


def test_finds_language_and_vision_modules(llava):
    model, _ = llava
    lang = find_attention_modules(model)
    assert [li for li, _ in lang.values()] == [0, 1, 2]
    assert all("language_model" in n for n in lang)
    vis = find_attention_modules(model, part="vision")
    assert len(vis) == 2 and all("vision_tower" in n for n in vis)
    assert len(find_attention_modules(model, part="all")) == 5
    with pytest.raises(CaptureError, match="no attention modules matched"):
        find_attention_modules(model, modules=["nope"])


def test_outputs_identical_and_full_equals_stats(llava, one_input):
    model, _ = llava
    inputs, spans = one_input
    n_hooks = _hooks(model)  # transformers keeps a few hooks of its own
    with torch.no_grad():
        ref = model(**inputs).logits
        with AttentionCapture(model, "full", spans=spans) as full:
            a = model(**inputs).logits
        with AttentionCapture(model, "stats", spans=spans) as st:
            b = model(**inputs).logits
        way1 = model(**inputs, output_attentions=True).attentions
    assert torch.equal(a, ref) and torch.equal(b, ref)
    assert _hooks(model) == n_hooks
    for r in full.result:
        assert torch.equal(r.probs, way1[r.layer][0].float())
        post = r.statistics()
        for k, v in st.result[r.layer].data.items():
            assert torch.allclose(v.nan_to_num(), post[k].nan_to_num(), atol=1e-6), k


def test_recompute_keeps_sdpa_and_matches_eager(random_llava_dir, llava, one_input):
    from unicache_lib.runtime.loaders import load_understanding

    eager, _ = llava
    inputs, spans = one_input
    sdpa, _ = load_understanding(str(random_llava_dir), attn_implementation="sdpa")
    with torch.no_grad():
        ref = sdpa(**inputs).logits
        with AttentionCapture(sdpa, "recompute", spans=spans) as re:
            out = sdpa(**inputs).logits
        with AttentionCapture(eager, "stats", spans=spans) as st:
            eager(**inputs)
    assert torch.equal(out, ref)  # the forward itself stayed on sdpa
    assert sdpa.config._attn_implementation == "sdpa"
    for r in st.result:  # grouped-query heads (4 query, 2 key) handled
        for k, v in r.data.items():
            assert torch.allclose(re.result[r.layer].data[k].nan_to_num(), v.nan_to_num(), atol=1e-4), k


def test_restored_after_exception(llava, one_input):
    model, _ = llava
    inputs, _ = one_input
    before = _hooks(model)
    with pytest.raises(RuntimeError, match="boom"):
        with AttentionCapture(model, "stats"):
            model(**inputs)
            raise RuntimeError("boom")
    assert _hooks(model) == before


def test_recompute_restored_after_exception(random_llava_dir):
    from unicache_lib.runtime.loaders import load_understanding

    sdpa, _ = load_understanding(str(random_llava_dir), attn_implementation="sdpa")
    with pytest.raises(KeyError):
        with AttentionCapture(sdpa, "recompute"):
            raise KeyError("x")
    assert sdpa.config._attn_implementation == "sdpa"


def test_sdpa_without_weights_names_the_fix(random_llava_dir, one_input):
    from unicache_lib.runtime.loaders import load_understanding

    sdpa, _ = load_understanding(str(random_llava_dir), attn_implementation="sdpa")
    before = _hooks(sdpa)
    with pytest.raises(CaptureError, match="attn_implementation='eager' or use capture mode 'recompute'"):
        with AttentionCapture(sdpa, "stats"):
            sdpa(**one_input[0])
    assert _hooks(sdpa) == before


def test_bad_inputs(llava, one_input, samples):
    model, processor = llava
    inputs, spans = one_input
    before = _hooks(model)
    with pytest.raises(CaptureError, match="recorded nothing"):
        with AttentionCapture(model, "stats"):
            pass
    with pytest.raises(CaptureError, match="not an attention module"):
        with AttentionCapture(model, modules=[r".*layers\.0\.mlp"]):
            model(**inputs)
    with pytest.raises(SpanError, match="spans cover"):
        with AttentionCapture(model, "stats", spans=Spans.from_kinds([0] * (len(spans) - 1))):
            model(**inputs)
    with pytest.raises(LayerError, match="layers \\[7\\] do not exist"):
        AttentionCapture(model, layers=[7])
    with pytest.raises(ValueError, match="mode must be"):
        AttentionCapture(model, mode="everything")
    b = processor(images=[samples[0].image, samples[3].image],
                  text=["user : <image> what color is the circle ?", "user : <image> is there a red circle at all ?"],
                  return_tensors="pt", padding=True)
    assert (b["attention_mask"] == 0).any()
    with pytest.raises(CaptureError, match="batch size 1"):
        with AttentionCapture(model, "stats"):
            model(**b)
    assert _hooks(model) == before


def test_nan_weights_are_reported(llava, one_input):
    model, _ = llava
    attn = model.model.language_model.layers[1].self_attn

    def poison(mod, args, out):
        w = out[1].clone()
        w[0, 0, 0, 0] = float("nan")
        return out[0], w

    h = attn.register_forward_hook(poison)
    try:
        with pytest.raises(S.AttentionValueError, match="NaN/inf"):
            with AttentionCapture(model, "stats", layers=[1]):
                model(**one_input[0])
    finally:
        h.remove()


def test_fp16_model_statistics_match_fp32(random_llava_dir, samples):
    from unicache_lib.runtime.loaders import load_understanding

    m32, proc = load_understanding(str(random_llava_dir))
    m16, _ = load_understanding(str(random_llava_dir), dtype=torch.float16)
    r32 = capture_samples(m32, proc, samples[:1], mode="stats", progress=False)
    r16 = capture_samples(m16, proc, samples[:1], mode="stats", progress=False)
    for a, b in zip(r32, r16):
        assert b.data["entropy"].dtype == torch.float32
        assert torch.allclose(a.data["entropy"], b.data["entropy"], atol=2e-2)
        assert torch.allclose(a.data["blocks"], b.data["blocks"], atol=1e-2)


def test_layer_subset_strides_and_wrappers(llava, one_input):
    model, _ = llava
    inputs, spans = one_input
    wrapped = torch.nn.DataParallel(model)
    with AttentionCapture(wrapped, "full", layers=[-1], query_stride=2, key_stride=3) as cap:
        model(**inputs)
    assert cap.result.layers == [2]
    r = cap.result[-1]
    S_ = len(spans)
    assert r.probs.shape == (4, (S_ + 1) // 2, (S_ + 2) // 3)
    compiled = torch.compile(model)  # only unwrapped here, never run
    with AttentionCapture(compiled, "stats", layers=[0]) as cap2:
        model(**inputs)
    assert cap2.result.layers == [0]


def test_capture_in_layer_batches_equals_one_pass(llava, samples):
    model, proc = llava
    one = capture_samples(model, proc, samples[:2], mode="full", progress=False)
    batched = capture_samples(model, proc, samples[:2], mode="full", layer_batch=2, progress=False)
    assert [r.key for r in one] != [] and sorted(r.key for r in one) == sorted(r.key for r in batched)
    for r in batched:
        assert torch.equal(r.probs, one[r.sample, r.layer].probs)


def test_decode_capture_records_every_step(llava, samples):
    from unicache_lib.capture.decode import decode_with_capture, producing_rows

    model, proc = llava
    toks, res = decode_with_capture(model, proc, samples[0].image, "describe the image .", "s", max_new_tokens=4)
    assert 1 <= len(toks) <= 4
    assert res.samples == [f"s/t{k}" for k in range(len(toks) + 1)]
    first = res["s/t1", 0]
    assert first.data["image_share"].shape == (4, 1)  # one query row per decode step
    assert first.seq_len == res["s/t0", 0].seq_len + 1
    share = first.data["image_share"][:, 0]
    assert ((share >= 0) & (share <= 1 + 1e-5)).all()
    rows = producing_rows(res, "s", len(toks), layer=0)
    assert rows.shape == (len(toks), 4)
    assert torch.equal(rows[0], res["s/t0", 0].data["image_share"][:, -1])  # last prompt row made token 1


def test_full_capture_memory_estimate_is_exact_and_the_budget_is_enforced(llava, samples):
    from unicache_lib.capture.runner import inputs_for
    from unicache_lib.capture.vlm import full_capture_bytes

    model, proc = llava
    inputs = inputs_for(model, proc, samples[0].image, samples[0].question)
    est = full_capture_bytes(model, inputs)
    with torch.no_grad(), AttentionCapture(model, "full") as cap:
        model(**inputs)
    assert est == cap.result.nbytes()  # probabilities (float32) + the mask (bool), every layer
    budget = 1.5 * est / 2**30  # room for one sample's maps, not two
    with pytest.raises(CaptureError, match="mode='stats'.*LAYERS="):
        capture_samples(model, proc, samples[:2], mode="full", memory_budget_gb=budget, progress=False)
    # the fixes the message names: statistics only, or fewer layers
    assert len(capture_samples(model, proc, samples[:2], mode="stats", memory_budget_gb=budget, progress=False)) == 6
    sub = capture_samples(model, proc, samples[:2], mode="full", layers=[0], memory_budget_gb=budget, progress=False)
    assert sub.layers == [0] and sub.nbytes() < budget * 2**30


def test_recompute_leaves_no_function_behind_and_negative_layers_resolve(random_llava_dir, samples):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from unicache_lib.capture.runner import inputs_for
    from unicache_lib.capture.vlm import _RECOMPUTE_NAME
    from unicache_lib.runtime.loaders import load_understanding

    sdpa, proc = load_understanding(str(random_llava_dir), attn_implementation="sdpa")
    inputs = inputs_for(sdpa, proc, samples[0].image, samples[0].question)
    with torch.no_grad(), AttentionCapture(sdpa, "recompute") as outer:
        with AttentionCapture(sdpa, "recompute", layers=[0]) as inner:
            sdpa(**inputs)
        sdpa(**inputs)  # the inner capture has exited: the outer one's function must be back in place
    assert inner.result.layers == [0] and len(outer.result) == 3  # the second forward reached the outer capture
    assert outer.result.layers == [0, 1, 2]
    assert _RECOMPUTE_NAME not in AttentionInterface._global_mapping  # nothing keeps the capture (or its model) alive
    assert _RECOMPUTE_NAME not in AttentionMaskInterface._global_mapping
    model, _ = load_understanding(str(random_llava_dir))
    last = capture_samples(model, proc, samples[:1], layers=[-1], progress=False)
    assert last.layers == [2]
    with pytest.raises(ValueError, match="do not exist"):
        capture_samples(model, proc, samples[:1], layers=[-9], progress=False)


def test_capture_refuses_attention_dropout_in_train_mode_reentry_and_overlong_sequences(llava, one_input):
    """Three silent wrong results refused with the fix: dropped-out weights recorded as probabilities, a capture
    entered inside itself (hooks installed twice), and positions past max_position_embeddings."""
    from unicache_lib.capture import AttentionCapture, CaptureError

    model, _ = llava
    inputs, _ = one_input
    cfg = model.config.get_text_config()
    old_p = cfg.attention_dropout
    try:
        for layer in model.model.language_model.layers:
            layer.self_attn.attention_dropout = 0.1
        model.train()
        with pytest.raises(CaptureError, match=r"train\(\) mode with attention dropout.*model.eval\(\)"):
            with AttentionCapture(model, mode="stats"):
                model(**inputs)
        model.eval()  # the fix
        with AttentionCapture(model, mode="stats") as cap:
            model(**inputs)
        assert len(cap.result) > 0
    finally:
        for layer in model.model.language_model.layers:
            layer.self_attn.attention_dropout = old_p
        model.eval()
    n_hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    cap = AttentionCapture(model, mode="stats")
    with cap:
        with pytest.raises(CaptureError, match="already active"):
            cap.__enter__()
        model(**inputs)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == n_hooks  # none left
    limit = cfg.max_position_embeddings
    try:
        cfg.max_position_embeddings = inputs["input_ids"].shape[1] - 1
        with pytest.raises(CaptureError, match=r"more than the model's max_position_embeddings.*Shorten the prompt"):
            with AttentionCapture(model, mode="stats"):
                model(**inputs)
    finally:
        cfg.max_position_embeddings = limit


def test_the_memory_refusal_names_sizes_in_a_unit_that_shows_them():
    """A budget of 0.01 GB used to be refused with "would keep 0.0 GB of maps": both sizes now read."""
    from unicache_lib.capture.vlm import check_memory
    from unicache_lib.core.errors import CaptureError

    with pytest.raises(CaptureError, match=r"would keep 14 MB of maps, over MEMORY_BUDGET_GB=0.01 \(10 MB\): use mode='stats'"):
        check_memory(14 * 2**20, 0.01, "a test")
    check_memory(14 * 2**20, 0.02, "a test")  # the fix it names (a larger budget) passes
