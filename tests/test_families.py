"""One suite over every supported vision-language family, from tiny random configs built in code.

For each family: the model saves and loads through ``load_understanding``; the image span equals the
positions where the model injects image features; ``full``, ``stats`` and ``recompute`` agree with a
ground-truth map computed from the model's own queries, keys and full mask (float64, here); the output
with capture is bit-identical to the output without; and eviction runs end to end
(``split_prompt`` -> ``prefill`` -> ``evict`` -> ``answer``). Masks that are not plain causal are part of
the configs: a sliding window (LLaVA-NeXT on Mistral, Gemma 3), bidirectional image blocks (Gemma 3), a
prefix-LM (PaliGemma), cross-attention with padded tiles (Mllama). The encoder families (ViLT, CLIP: no
decoder, no KV cache) and Janus's drawing mode have their suite in ``tests/test_architectures.py``.
"""
from __future__ import annotations

import pytest
import torch

from unicache_lib import stats as S
from unicache_lib.capture import AttentionCapture
from unicache_lib.core.modality import IMAGE
from unicache_lib.core.models import attn_implementations, set_attn_implementations
from unicache_lib.families import FAMILIES, Shape, UnsupportedModelError, family_of
from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill
from unicache_lib.kv.cache import split_inputs, split_prompt

# case id -> (family name, shape, what is special about its mask)
CASES = {
    "llava": ("LLaVA-1.5", Shape(), "causal"),
    "llava_next": ("LLaVA-NeXT", Shape(sliding_window=8), "sliding"),
    "llava_onevision": ("LLaVA-OneVision", Shape(), "causal"),
    "qwen2_vl": ("Qwen2-VL", Shape(), "causal"),
    "qwen2_5_vl": ("Qwen2.5-VL", Shape(), "causal"),
    "gemma3": ("Gemma 3", Shape(layers=2, sliding_window=8), "bidirectional image, sliding"),
    "idefics3": ("Idefics3/SmolVLM", Shape(), "causal"),
    "smolvlm": ("Idefics3/SmolVLM", Shape(), "causal"),
    "internvl": ("InternVL", Shape(), "causal"),
    "paligemma": ("PaliGemma", Shape(), "prefix-LM"),
    "mllama": ("Mllama", Shape(layers=4, image_size=64, patch=16), "cross-attention, padded tiles"),  # 1 tile of 4
    "janus": ("Janus", Shape(), "causal"),  # understanding mode; drawing: tests/test_architectures.py
}
QUESTION = "what color is the triangle ?"


def _build(case, tmp_path_factory, samples):
    """(model eager, model sdpa, processor or None, inputs, family) for one case, saved and reloaded."""
    import transformers

    from unicache_lib.runtime.loaders import load_understanding

    fam_name, shape, _ = CASES[case]
    case = case.split("-")[0]
    fam = FAMILIES[fam_name]
    tok = fam.tokenizer()
    cfg = fam.config(tok, shape, smol=True) if case == "smolvlm" else fam.config(tok, shape)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp(case)
    m = getattr(transformers, fam.model_class_for(cfg.model_type))(cfg)
    fam.activate(m)  # e.g. Mllama's cross-attention gates start closed: opened, so the image path counts
    m.save_pretrained(d)
    image = samples[1].image
    if case == "smolvlm":  # SmolVLMProcessor needs torchvision: tokenizer only, the prompt encoded by hand
        tok.save_pretrained(d)
        with pytest.raises(RuntimeError, match="needs torchvision"):
            load_understanding(str(d))
        model = getattr(transformers, fam.model_class_for("smolvlm")).from_pretrained(d, attn_implementation={"text_config": "eager", "vision_config": "sdpa"}).eval()
        proc = None
        n = (shape.image_size // shape.patch) ** 2 // 4
        words = ["<s>", "user", ":", "<fake_token_around_image>", "<global-img>"] + ["<image>"] * n + \
            ["<fake_token_around_image>"] + QUESTION.split() + ["assistant", ":"]
        from unicache_lib.runtime.tiny_layouts import pixel_values

        px = torch.nn.functional.interpolate(pixel_values(image[None]), size=shape.image_size, mode="bilinear")
        inputs = {"input_ids": torch.tensor([tok.convert_tokens_to_ids(words)]), "pixel_values": px[:, None],
                  "pixel_attention_mask": torch.ones(1, 1, shape.image_size, shape.image_size, dtype=torch.bool)}
    else:
        fam.processor(tok, shape).save_pretrained(d)
        with pytest.warns(UserWarning, match="without its video processor") if fam.needs_video_processor else _nothing():
            model, proc = load_understanding(str(d), attn_implementation="eager")
        inputs = dict(proc(images=[image], text=[fam.prompt(proc, QUESTION)], return_tensors="pt"))
    sdpa = type(model).from_pretrained(d, attn_implementation="sdpa").eval()
    return model, sdpa, proc, inputs, fam, image


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory, samples):
    return (request.param, *_build(request.param, tmp_path_factory, samples))


# ---- ground truth: the model's own q, k and mask, softmax in float64 ----------------------------------
def ground_truth(model, inputs):
    """``{module name: (P [H, Sq, Sk] float64, visible [Sq, Sk] bool)}`` from an attention function
    that records what the model hands to attention (its eager mask) and attends in float64."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    names = {id(m): n for n, m in model.named_modules()}
    maps = {}

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        q, k, v = query.double(), key.double(), value.double()
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        logits = q @ k.transpose(-1, -2) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
        vis = torch.ones(logits.shape[-2:], dtype=torch.bool)
        if attention_mask is not None:
            m = attention_mask[0, 0, :, : k.shape[-2]]
            vis = m > torch.finfo(m.dtype).min / 2 if m.dtype != torch.bool else m
            logits = logits.masked_fill(~vis, float("-inf"))
        P = torch.softmax(logits, -1)
        maps[names[id(module)]] = (P[0], vis)
        return (P @ v).to(query.dtype).transpose(1, 2).contiguous(), None

    from unicache_lib.core.compat import attention_functions, restore_attention_functions

    before = attention_functions("unicache_gt")
    AttentionInterface.register("unicache_gt", attend)
    AttentionMaskInterface.register("unicache_gt", eager_mask)
    old = attn_implementations(model)
    set_attn_implementations(model, {**old, "text_config": "unicache_gt"})  # the language model's attention
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        set_attn_implementations(model, old)
        # unregistered again, as the library's captures do: kvpress, when imported later, wraps every registered
        # attention function in place, and a stale wrapped one would shadow the next registration
        restore_attention_functions(before, "unicache_gt")
    return maps


def _live_rows(fam, model, inputs, site):
    """Query rows whose attention reaches the output: for a cross-attention layer, the text at and after
    the image token (the processor's rule); every row elsewhere."""
    n = inputs["input_ids"].shape[1]
    if site.part != "cross":
        return torch.ones(n, dtype=torch.bool)
    first = int((inputs["input_ids"][0] == fam.image_token_id(model.config)).nonzero()[0])
    return torch.arange(n) >= first


# ---- the suite -----------------------------------------------------------------------------------------
def test_family_is_recognised_and_spans_are_the_injected_positions(case):
    name, model, sdpa, proc, inputs, fam, image = case
    assert family_of(model) is fam
    seen = {}
    lm = fam.language_model(model)
    h = lm.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        h.remove()
    ids = inputs["input_ids"]
    spans = fam.spans(model.config, ids, inputs)
    assert len(spans) == ids.shape[1]
    if fam.cross_attention:  # the image never enters the sequence; the cross keys are the vision tokens
        assert spans.n_image == 0
        vision = seen["cross_attention_states"]  # [batch * images * tiles, tokens per tile, hidden]
        n_vision = model.config.vision_config.max_num_tiles * fam.tokens_per_tile(model.config)
        assert vision.shape[0] * vision.shape[1] == n_vision
        with torch.no_grad(), AttentionCapture(model, "stats", part="cross") as cap:
            model(**inputs)
        real = int(inputs["aspect_ratio_mask"].sum()) * fam.tokens_per_tile(model.config)  # tiles the image fills
        assert 0 < real < n_vision  # the test image fills one of four tiles: three are padding
        assert {r.seq_len for r in cap.result} == {real}  # padded tiles' keys (masked for everyone) dropped
        assert all(r.spans.n_image == real for r in cap.result)
        return
    emb = seen["inputs_embeds"][0]
    plain = model.get_input_embeddings()(ids)[0]
    injected = ~torch.isclose(emb, plain.to(emb.dtype), atol=1e-6).all(-1)
    assert injected.nonzero().flatten().tolist() == spans.image_index.tolist()
    assert spans.n_image > 0


def test_capture_modes_match_ground_truth_and_leave_outputs_identical(case):
    name, model, sdpa, proc, inputs, fam, image = case
    gt = ground_truth(model, inputs)
    with torch.no_grad():
        ref_eager = model(**inputs).logits
        ref_sdpa = sdpa(**inputs).logits
        caps = {}
        with AttentionCapture(model, "full") as caps["full"]:
            out_full = model(**inputs).logits
        with AttentionCapture(model, "stats") as caps["stats"]:
            out_stats = model(**inputs).logits
        with AttentionCapture(sdpa, "recompute", keep="full") as caps["recompute_full"]:
            out_re = sdpa(**inputs).logits
        with AttentionCapture(sdpa, "recompute") as caps["recompute"]:
            sdpa(**inputs)
    assert torch.equal(out_full, ref_eager) and torch.equal(out_stats, ref_eager)  # hooks only read
    assert torch.equal(out_re, ref_sdpa)  # the forward stays on sdpa with sdpa's own masks
    tv = lambda m: {k: v for k, v in attn_implementations(m).items() if k in ("text_config", "vision_config")}  # noqa: E731
    assert tv(sdpa) == {"text_config": "sdpa", "vision_config": "sdpa"}
    assert tv(model) == {"text_config": "eager", "vision_config": "sdpa"}  # restored, part by part
    sites = {s.name: s for s in fam.sites(model, ("language", "cross"))}
    parts = {r.part for r in caps["stats"].result}
    assert parts == ({"language", "cross"} if fam.cross_attention else {"language"})
    spans = fam.spans(model.config, inputs["input_ids"], inputs)
    for site_name, site in sites.items():
        P, vis = gt[site_name]
        live = _live_rows(fam, model, inputs, site)
        vis = vis & live[:, None]
        if site.part == "cross":  # keys no live row can see (padded tiles) are not part of the image
            P, vis = P[..., vis.any(0)], vis[:, vis.any(0)]
        for mode in ("full", "recompute_full"):
            r = caps[mode].result.select(layer=site.layer, part=site.part)[0]
            assert torch.allclose(r.probs[:, live].double(), P[:, live], atol=1e-5), (mode, site_name)
            assert torch.equal(r.visible, vis), (mode, site_name)  # the mask the model applied, as recorded
        sp = fam.cross_spans(P.shape[-1]) if site.part == "cross" else spans
        qk = [0] * P.shape[-2] if site.part == "cross" else None
        qpos = None if site.part == "cross" else torch.arange(P.shape[-1] - P.shape[-2], P.shape[-1])
        want = S.layer_statistics(P.float(), sp, vis, qpos, qk)
        for mode in ("stats", "recompute"):
            r = caps[mode].result.select(layer=site.layer, part=site.part)[0]
            for k, v in want.items():
                got = r.data[k]
                assert torch.allclose(got.nan_to_num(-7.0), v.nan_to_num(-7.0), atol=1e-5), (mode, site_name, k)
            assert torch.isfinite(r.data["norm_entropy"][~r.data["norm_entropy"].isnan()]).all()
            assert float(r.data["norm_entropy"].nan_to_num(0).max()) <= 1 + 1e-5


def test_the_mask_is_the_one_applied(case):
    """Where the family's mask is not causal, the ground truth shows it and capture follows it."""
    name, model, sdpa, proc, inputs, fam, image = case
    kind = CASES[name][2]
    gt = ground_truth(model, inputs)
    lang = [s for s in fam.sites(model, ("language",))]
    vis = gt[lang[0].name][1]
    n = vis.shape[-1]
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    spans = fam.spans(model.config, inputs["input_ids"], inputs)
    img = torch.as_tensor(spans.array == IMAGE)
    if kind == "causal" or kind.startswith("cross"):
        assert torch.equal(vis, causal)
    if "sliding" in kind:  # some layer hides keys further back than the window
        hides = [bool((gt[s.name][1] < causal).any()) for s in lang]
        assert any(hides)
    if "bidirectional image" in kind:  # an image query sees a later image key
        later = vis & ~causal
        assert bool(later[img][:, img].any()) and not bool(later[~img].any())
    if kind == "prefix-LM":  # the prefix (image + prompt) sees itself both ways
        assert bool((vis & ~causal)[img].any())


def test_eviction_runs_end_to_end(case, tmp_path_factory, samples):
    name, model, sdpa, proc, inputs, fam, image = case
    if "sliding" in CASES[name][2]:  # the window (8) is shorter than the prompt: refused, with the fix named
        with pytest.raises(ValueError, match="sliding-window layer .* model without sliding windows"):
            _evict_and_answer(name, model, proc, inputs, fam, image)
        _press_refuses_a_short_window(model, proc, image)
        CASES[f"{name}-nowindow"] = (CASES[name][0], Shape(layers=CASES[name][1].layers), "causal")
        try:  # the suggested fix: the same family without a window that cuts into the prompt
            model, _, proc, inputs, fam, image = _build(f"{name}-nowindow", tmp_path_factory, samples)
        finally:
            del CASES[f"{name}-nowindow"]
    _evict_and_answer(name, model, proc, inputs, fam, image)


def _press_refuses_a_short_window(model, proc, image):
    """A sliding-window layer shorter than the prompt holds only its last keys: the press refuses rather than
    compress positions that do not line up (the fix, a model without such a window, is the -nowindow run)."""
    from unicache_lib.kv.presses import KeyCoveragePress

    sp = split_prompt(proc, image, QUESTION, model=model)
    with pytest.raises(ValueError, match="sliding-window layer shorter than the prompt.*without sliding windows"):
        with KeyCoveragePress(compression_ratio=0.5)(model):
            prefill(model, sp, attentions=False)


def _evict_and_answer(name, model, proc, inputs, fam, image):
    if proc is None:
        sp = split_inputs(fam, inputs, fam.image_token_id(model.config))
    else:
        sp = split_prompt(proc, image, QUESTION, model=model)
    pre = prefill(model, sp)
    ctx = pre.context(seed=0)
    full = evict(pre.cache, POLICIES["full"]().select(ctx, 1.0))
    logits, _, _ = answer(model, full, sp)
    one_pass = dict(inputs)
    if name == "paligemma":  # prefix-LM: with the image cached first, only the image is the prefix; the rest is causal
        tt = torch.ones_like(inputs["input_ids"])
        tt[:, : sp.context_ids.shape[1]] = 0
        one_pass["token_type_ids"] = tt
    with torch.no_grad():
        ref = model(**one_pass).logits[0, -1].float()
    assert torch.allclose(logits, ref, atol=1e-4), (logits - ref).abs().max()
    half = evict(pre.cache, POLICIES["random"]().select(ctx, 0.5))
    k = round(0.5 * ctx.n_image)
    kept = ctx.keep_always.numel() if ctx.keep_always is not None else ctx.seq_len - ctx.n_image
    for li, (a, b) in enumerate(zip(half.layers, pre.cache.layers)):
        want = kept + k if li in (ctx.cache_layers or range(len(half.layers))) else b.keys.shape[-2]
        assert a.keys.shape[-2] == want, (li, a.keys.shape, want)
    expected = sum(a.keys.numel() * a.keys.element_size() * 2 for a in half.layers)
    assert kv_bytes(half) == expected < kv_bytes(pre.cache)
    out, ids, _ = answer(model, half, sp, max_new_tokens=3)
    assert out.isfinite().all() and len(ids) >= 1
    assert (out - logits).abs().max() > 1e-6  # the image KV that was dropped mattered: the path is live
    # the key-coverage policy reads every family's cached image keys (Mllama: the cross-attention layers')
    cover = evict(pre.cache, POLICIES["key_coverage"]().select(ctx, 0.25))
    assert kv_bytes(cover) == kv_bytes(evict(pre.cache, POLICIES["random"]().select(ctx, 0.25)))
    assert answer(model, cover, sp)[0].isfinite().all()
    _press_keeps_what_the_policy_keeps(model, sp, pre, ctx)
    _prefill_stage(model, sp, ctx)


def _press_keeps_what_the_policy_keeps(model, sp, pre, ctx):
    """KeyCoveragePress, through kvpress's own hook, keeps in every layer what ``key_coverage`` keeps in the workbench's
    harness (``torch.equal``) and the answers are the same ids; a cross-attention family is refused, naming the fix."""
    from unicache_lib.kv.peers import compression_ratio
    from unicache_lib.kv.presses import KeyCoveragePress

    if family_of(model).cross_attention:
        with pytest.raises(ValueError, match="cross-attention layers.*run_eviction"), KeyCoveragePress(0.5)(model):
            pass
        return
    press = KeyCoveragePress(compression_ratio=compression_ratio(sp.context_ids.shape[1], ctx.n_image, 0.25))
    policy = evict(pre.cache, POLICIES["key_coverage"]().select(ctx, 0.25))
    with press(model):
        pressed = prefill(model, sp, attentions=False).cache
    assert len(pressed.layers) == len(policy.layers)
    for li, (a, b) in enumerate(zip(policy.layers, pressed.layers)):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {li}: the press kept other positions"
    assert answer(model, policy, sp, max_new_tokens=3)[1] == answer(model, pressed, sp, max_new_tokens=3)[1]


def _prefill_stage(model, sp, ctx):
    """Prefill-stage pruning (DivPrune) runs where the family feeds its language model a plain sequence, and
    is refused, naming the alternative, where it would feed wrong positions or masks."""

    from unicache_lib.kv.cache import prefill_pruned

    k = ctx.k(0.25)
    try:
        pp, reduced, keep = prefill_pruned(model, sp, POLICIES["divprune"]().token_picker(ctx, 0.25))
    except ValueError as e:
        assert "cache-stage policy" in str(e)
        return
    assert len(keep) == sp.context_ids.shape[1] - len(sp.image_positions) + k
    assert answer(model, pp.cache, reduced)[0].isfinite().all()


def test_unknown_family_is_refused_by_loader_and_capture(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from unicache_lib.runtime.loaders import load_understanding

    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path)
    for call in (lambda: load_understanding(str(tmp_path)),
                 lambda: AttentionCapture(LlamaForCausalLM.from_pretrained(tmp_path), "stats")):
        with pytest.raises(UnsupportedModelError) as err:
            call()
        msg = str(err.value)
        assert "'llama'" in msg and "To add one" in msg
        for fam in FAMILIES.values():
            assert fam.name in msg
    assert len(FAMILIES) == 13


def test_statistics_refuse_a_map_that_breaks_its_mask():
    """Mass on keys the mask hides is an error, never a number (here: a causal map checked against a
    mask that hides the first key, as a model with another mask than assumed would produce)."""
    P = torch.softmax(torch.randn(2, 6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")), -1)
    vis = torch.ones(6, 6, dtype=torch.bool).tril()
    vis[:, 0] = False
    vis[0, 0] = True
    with pytest.raises(S.AttentionMaskError, match="mask"):
        S.layer_statistics(P, None, vis)
    bidirectional = torch.softmax(torch.randn(2, 6, 6), -1)  # e.g. an image block that sees itself both ways
    with pytest.raises(S.AttentionMaskError, match="causal mask"):
        S.layer_statistics(bidirectional, None, True)
    assert float(S.layer_statistics(bidirectional, None, False)["norm_entropy"].max()) <= 1 + 1e-6


def test_decode_capture_follows_generate(case):
    """Greedy decoding with capture at every step produces the tokens of transformers' own generate()
    (positions, masks and per-token inputs continued correctly), one record per step and layer."""
    from unicache_lib.capture.decode import decode_with_capture

    name, model, sdpa, proc, inputs, fam, image = case
    if proc is None:
        pytest.skip("no processor without torchvision (SmolVLM)")
    toks, res = decode_with_capture(model, proc, image, QUESTION, "s", max_new_tokens=4)
    with torch.no_grad():
        gen = model.generate(**inputs, max_new_tokens=4, do_sample=False, min_new_tokens=4, eos_token_id=None,
                             pad_token_id=proc.tokenizer.pad_token_id)
    want = proc.tokenizer.convert_ids_to_tokens(gen[0, inputs["input_ids"].shape[1]:].tolist())
    assert toks == want[: len(toks)] and len(toks) >= 1
    steps = {r.sample for r in res}
    assert steps == {f"s/t{k}" for k in range(len(toks) + 1)}
    last = [r for r in res if r.sample == f"s/t{len(toks)}" and r.part == fam.image_part]
    assert last and all(r.data["norm_entropy"].shape[-1] == 1 for r in last)  # one query row per decode step


def test_recompute_refuses_soft_capped_attention_and_eager_capture_works(samples):
    """PaliGemma 2 (Gemma-2 text model) soft-caps its attention logits; sdpa ignores that, so a recomputed
    map would describe another attention than the model's. Recompute refuses; the fix it names works."""
    import transformers
    from transformers import Gemma2Config

    from unicache_lib.capture import CaptureError

    fam = FAMILIES["PaliGemma"]
    tok = fam.tokenizer()
    shape = Shape()
    cfg = fam.config(tok, shape)
    cfg.text_config = Gemma2Config(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                                   num_hidden_layers=2, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                                   head_dim=shape.head_dim, attn_logit_softcapping=50.0, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration(cfg).eval()
    proc = fam.processor(tok, shape)
    inputs = dict(proc(images=[samples[0].image], text=[fam.prompt(proc, QUESTION)], return_tensors="pt"))
    set_attn_implementations(model, {"text_config": "sdpa", "vision_config": "sdpa"})
    with pytest.raises(CaptureError, match="soft-caps .* attn_implementation='eager'"):
        with torch.no_grad(), AttentionCapture(model, "recompute"):
            model(**inputs)
    set_attn_implementations(model, {"text_config": "eager", "vision_config": "sdpa"})
    with torch.no_grad(), AttentionCapture(model, "stats") as cap:
        model(**inputs)
    assert len(cap.result) == 2 and all(torch.isfinite(r.data["entropy"]).all() for r in cap.result)


def test_a_family_file_registers_itself_as_the_error_message_says():
    """HOW_TO_ADD: a VLMFamily subclass in a new file of unicache_lib/families, decorated with @register, is
    found by family_for_type without touching any other file."""
    import importlib
    import sys
    from pathlib import Path

    import unicache_lib.families as F

    path = Path(F.__path__[0]) / "zz_toy_family_for_test.py"
    path.write_text("from .base import VLMFamily, register\n\n\n@register\nclass Toy(VLMFamily):\n    name = 'Toy'\n"
                    "    model_types = ('toy_vlm',)\n    model_class = 'LlavaForConditionalGeneration'\n")
    try:
        with pytest.raises(UnsupportedModelError, match="To add one"):
            F.family_for_type("toy_vlm")
        importlib.reload(F)
        assert F.family_for_type("toy_vlm").name == "Toy"
    finally:
        path.unlink()
        FAMILIES.pop("Toy", None)
        sys.modules.pop("unicache_lib.families.zz_toy_family_for_test", None)
    assert len(FAMILIES) == 13


def test_image_tokens_per_picture_is_the_count_the_processor_placed_or_none(case):
    """The count a token budget ("64t") is a share of: where the adapter states a fixed count per picture, it is
    exactly the image tokens the processor placed for one picture; a family whose count varies with the picture
    (tiles, dynamic resolution) states None, and a token budget on it is refused naming the fix."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.inputs import budget_shares

    name, model, sdpa, proc, inputs, fam, image = case
    n = fam.image_tokens_per_picture(model.config)
    if n is None:
        with pytest.raises(InputError, match="give the budget as a share"):
            budget_shares(["64t"], n)
        return
    assert not fam.cross_attention and inputs["pixel_values"].shape[0] == 1
    assert fam.spans(model.config, inputs["input_ids"], inputs).n_image == n
