"""Every bad input gets an error a user can act on, on the shipped tiny LLaVA: layer
indices, misplaced spans, images (float, grayscale, RGBA, too small, ...), prompts without the image
marker, unknown registry names and budgets of the wrong type. Where a message names a fix, the fix
is run too."""
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from unicache_lib.capture import AttentionCapture, CaptureError
from unicache_lib.capture.runner import answer_logits, build_prompt, capture_samples, inputs_for, model_inputs, spans_fn
from unicache_lib.core.modality import SpanError, Spans
from unicache_lib.inputs import (
    ImageError,
    InputError,
    LayerError,
    PromptError,
    check_fraction,
    check_prompt,
    prepare_image,
    resolve_layers,
)


@pytest.fixture(scope="module")
def tiny():
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding("tiny-llava", attn_implementation="eager")


@torch.no_grad()
def _logits(tiny, image, question):
    model, proc = tiny
    return model(**inputs_for(model, proc, image, question)).logits[0, -1]


# ---- layers ---------------------------------------------------------------------------------------
def _capture(tiny, s, layers):
    model, proc = tiny
    with torch.no_grad(), AttentionCapture(model, "stats", layers=layers) as cap:
        model(**inputs_for(model, proc, s.image, s.question))
    return cap.result


LAYER_ENTRIES = {
    "AttentionCapture": lambda tiny, s, layers: _capture(tiny, s, layers).layers,
    "capture_samples": lambda tiny, s, layers: capture_samples(*tiny, [s], layers=layers, progress=False).layers,
    "CaptureResult.select": lambda tiny, s, layers: sorted({r.layer for li in layers
                                                            for r in _capture(tiny, s, None).select(layer=li)}),
}


@pytest.mark.parametrize("entry, bad", [(e, b) for e in sorted(LAYER_ENTRIES) for b in ([-9], [4], [0, 7])
                                        if not (e == "CaptureResult.select" and min(b) >= 0)])
def test_a_layer_that_does_not_exist_names_the_valid_range(tiny, samples, entry, bad):
    missing = [i for i in bad if not -4 <= i <= 3]
    with pytest.raises(ValueError, match=rf"layers \[{missing[0]}\] do not exist: .* 4 layers \[0\.\.3\]; valid indices: "
                                         r"those, or negative indices -4\.\.-1 count from the last \(-1 = layer 3"):
        LAYER_ENTRIES[entry](tiny, samples[0], bad)
    # the fix the message names: negative indices within the range
    assert LAYER_ENTRIES[entry](tiny, samples[0], [-1]) == [3]
    assert LAYER_ENTRIES[entry](tiny, samples[0], [-4, 1]) == [0, 1]


def test_resolve_layers_rules():
    assert resolve_layers([np.int64(-1), 0, 0], [0, 1, 2, 3]) == [3, 0]  # numpy ints, order kept, duplicates dropped
    assert resolve_layers([-1, -2, 8], [3, 8, 13], "the cross-attention part") == [13, 8, 8][:2]  # non-contiguous layers
    with pytest.raises(LayerError, match=r"layers \[4\] do not exist: the cross-attention part has 3 layers \[3, 8, 13\]"):
        resolve_layers([4], [3, 8, 13], "the cross-attention part")
    with pytest.raises(LayerError, match="integers"):
        resolve_layers([1.0], [0, 1])
    with pytest.raises(LayerError, match=r"1 layer \[5\]; valid indices: those, or -1 is layer 5"):
        resolve_layers([-2], [5])
    err = LayerError("x")
    assert isinstance(err, ValueError) and not isinstance(err, CaptureError)  # an input error, one kind


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ---- spans ----------------------------------------------------------------------------------------
def test_spans_in_the_wrong_place_are_refused_and_the_span_finder_fixes_them(tiny, samples):
    model, proc = tiny
    inputs = inputs_for(model, proc, samples[0].image, samples[0].question)
    right = spans_fn(model)(inputs["input_ids"], inputs)
    wrong = Spans(right.kinds[-5:] + right.kinds[:-5])  # right length and image count, block shifted by 5
    assert len(wrong) == len(right) and wrong.n_image == right.n_image == 64 and wrong != right
    before = _hooks(model)
    for given in (wrong, lambda ids: wrong):
        with pytest.raises(SpanError, match=r"image positions 8\.\.71 \(64 positions\), but the image tokens of "
                                            r"input_ids are at 3\.\.66 .*spans='auto'.*spans_fn\(model\)"):
            with AttentionCapture(model, "stats", spans=given):
                model(**inputs)
    assert _hooks(model) == before  # refused before the model ran, and unhooked
    with torch.no_grad():  # the fixes the message names: the span finder, or spans='auto'
        with AttentionCapture(model, "stats", spans=spans_fn(model)(inputs["input_ids"], inputs)) as fixed:
            model(**inputs)
        with AttentionCapture(model, "stats") as auto:
            model(**inputs)
    assert len(fixed.result) == len(auto.result) == 4
    for a, b in zip(fixed.result, auto.result):
        assert a.spans == b.spans == right
        for k in a.data:
            torch.testing.assert_close(a.data[k], b.data[k], atol=0, rtol=0, equal_nan=True)


# ---- images ---------------------------------------------------------------------------------------
FLOAT_FORMS = {
    "float32 (H, W, 3) in [0, 1]": lambda u8: u8.astype(np.float32) / 255,
    "float64 (H, W, 3) in [0, 1]": lambda u8: u8 / 255.0,
    "torch (3, H, W) in [0, 1] (ToTensor)": lambda u8: torch.from_numpy(u8.copy()).permute(2, 0, 1).float() / 255,
}


@pytest.mark.parametrize("form", sorted(FLOAT_FORMS))
def test_a_float_image_in_0_1_answers_as_its_uint8_image(tiny, samples, form):
    model, proc = tiny
    u8 = [s.image for s in samples[:3]]
    fl = [FLOAT_FORMS[form](x) for x in u8]
    for s, a, b in zip(samples, u8, fl):  # through the processor, one prompt at a time
        torch.testing.assert_close(_logits(tiny, b, s.question), _logits(tiny, a, s.question), atol=1e-5, rtol=0)
    qs = [s.question for s in samples[:3]]  # the shipped model's batched path
    with torch.no_grad():
        torch.testing.assert_close(answer_logits(model, proc, qs, fl), answer_logits(model, proc, qs, np.stack(u8)),
                                   atol=1e-5, rtol=0)


def _rgba(u8, alpha):
    a = np.asarray(alpha, np.uint8)
    return np.concatenate([u8, np.broadcast_to(a[..., None] if a.ndim == 2 else a, u8.shape[:2] + (1,))], -1)


def _grey(u8):
    return np.repeat(u8[..., :1], 3, -1)


CONVERSIONS = {  # name: (the variant of the RGB uint8 image, the RGB image it must be read as)
    "grayscale (H, W)": (lambda u8: u8[..., 0].copy(), _grey),
    "grayscale (H, W, 1)": (lambda u8: u8[..., :1].copy(), _grey),
    "grayscale PIL 'L'": (lambda u8: Image.fromarray(u8[..., 0].copy(), "L"), _grey),
    "opaque RGBA (H, W, 4)": (lambda u8: _rgba(u8, 255), lambda u8: u8),
    "opaque RGBA PIL": (lambda u8: Image.fromarray(_rgba(u8, 255), "RGBA"), lambda u8: u8),
    "PIL 'RGB'": (lambda u8: Image.fromarray(u8), lambda u8: u8),
    "channels-first uint8 (3, H, W)": (lambda u8: np.ascontiguousarray(np.moveaxis(u8, -1, 0)), lambda u8: u8),
    "int64 holding 0..255": (lambda u8: u8.astype(np.int64), lambda u8: u8),
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_other_image_layouts_are_converted_exactly(tiny, samples, name):
    variant, expected = CONVERSIONS[name]
    s = samples[1]
    u8 = s.image
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact conversion warns about nothing
        got = prepare_image(variant(u8))
        logits = _logits(tiny, variant(u8), s.question)
    assert got.dtype == np.uint8 and got.shape == u8.shape and np.array_equal(got, expected(u8))
    torch.testing.assert_close(logits, _logits(tiny, expected(u8), s.question), atol=0, rtol=0)


def test_a_transparent_rgba_image_warns_and_reads_as_transformers_reads_it(tiny, samples):
    from transformers.image_transforms import convert_to_rgb

    u8 = samples[2].image
    alpha = np.where(np.arange(u8.shape[1]) < u8.shape[1] // 2, 0, 255)[None, :].repeat(u8.shape[0], 0)
    rgba = _rgba(u8, alpha)
    with pytest.warns(UserWarning, match="alpha channel is dropped .*alpha_composite"):
        got = prepare_image(rgba)
    assert np.array_equal(got, np.asarray(convert_to_rgb(Image.fromarray(rgba, "RGBA"))))
    with pytest.warns(UserWarning):  # what a PIL RGBA image gives, the same
        assert np.array_equal(prepare_image(Image.fromarray(rgba, "RGBA")), got)
    white = np.asarray(Image.alpha_composite(Image.new("RGBA", (64, 64), "white"), Image.fromarray(rgba, "RGBA"))
                       .convert("RGB"))  # the composite the warning suggests: no warning, half the picture white
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = prepare_image(white)
    assert (fixed[:, :32] == 255).all() and np.array_equal(fixed[:, 32:], u8[:, 32:])


BAD_IMAGES = {  # name: (bad image from a good uint8 one, message, the fix the message names)
    "1x1 pixel": (lambda u8: u8[:1, :1], r"1x1 pixels .* at least 2x2 pixels .*\(H, W, 3\) uint8", lambda bad, u8: u8),
    "one row": (lambda u8: u8[:1], r"1x64 pixels .* at least 2x2", lambda bad, u8: u8),
    "a batch of one": (lambda u8: u8[None], r"4-D .* one image at a time, e\.g\. images\[0\]", lambda bad, u8: bad[0]),
    "float 0..255": (lambda u8: u8.astype(np.float32), r"values up to \d+: float images must be in \[0, 1\].*"
                     r"np\.clip\(image, 0, 255\)\.round\(\)\.astype\(np\.uint8\)",
                     lambda bad, u8: np.clip(bad, 0, 255).round().astype(np.uint8)),
    "normalised": (lambda u8: u8 / 127.5 - 1, r"down to -0\.\d+ looks normalised .* pass the raw picture",
                   lambda bad, u8: (bad + 1) / 2),
    "16-bit": (lambda u8: u8.astype(np.uint16) * 257, r"uint16\) with values .*\(image / image\.max\(\) \* 255\)",
               lambda bad, u8: (bad / bad.max() * 255).round().astype(np.uint8)),
    "a mask": (lambda u8: u8[..., 0] > 100, r"boolean .* mask\.astype\(np\.uint8\) \* 255",
               lambda bad, u8: bad.astype(np.uint8) * 255),
    "NaN": (lambda u8: np.where(u8 > 100, np.nan, u8 / 255.0), "NaN", lambda bad, u8: np.nan_to_num(bad, nan=1.0)),
    "two channels": (lambda u8: u8[..., :2], r"no channel axis of 1, 3 or 4", lambda bad, u8: bad[..., 0]),
    "None": (lambda u8: None, r"None: pass an \(H, W, 3\) uint8", lambda bad, u8: u8),
}


@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_an_unusable_image_is_refused_with_the_fix_and_the_fix_works(tiny, samples, name, tmp_path):
    make, match, fix = BAD_IMAGES[name]
    model, proc = tiny
    s = samples[0]
    bad = make(s.image)
    with pytest.raises(ImageError, match=match):
        model_inputs(proc, bad, s.question)
    with pytest.raises(ImageError, match=match):
        answer_logits(model, proc, [s.question], [bad])
    good = fix(bad, s.image)
    assert torch.isfinite(_logits(tiny, good, s.question)).all()
    assert isinstance(ImageError("x"), ValueError)


def test_a_path_is_refused_and_opening_it_works(tiny, samples, tmp_path):
    p = tmp_path / "scene.png"
    Image.fromarray(samples[0].image).save(p)
    with pytest.raises(ImageError, match=r"a path .* PIL\.Image\.open\(path\)"):
        prepare_image(str(p))
    torch.testing.assert_close(_logits(tiny, Image.open(p), samples[0].question),
                               _logits(tiny, samples[0].image, samples[0].question), atol=0, rtol=0)


def test_a_small_image_is_read_channels_last(tiny, samples):
    """A 3x3 image: transformers alone guesses channels-first for it (silently wrong); the workbench
    says channels-last."""
    model, proc = tiny
    small = np.random.default_rng(0).integers(0, 256, (3, 3, 3), dtype=np.uint8)
    px = model_inputs(proc, small, samples[0].question)["pixel_values"]
    ref = proc.image_processor(small, return_tensors="pt", input_data_format="channels_last")["pixel_values"]
    guessed = proc.image_processor(small, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(px, ref, atol=0, rtol=0)
    assert not torch.allclose(px, guessed)


# ---- prompts --------------------------------------------------------------------------------------
def test_a_prompt_without_the_image_token_names_the_token_and_the_template(tiny, samples):
    from unicache_lib.families import FAMILIES
    from unicache_lib.kv.cache import split_prompt

    model, proc = tiny
    s = samples[0]
    bare = f"user : {s.question} assistant :"
    msg = r"no image token: put the processor's image token '<image>' where the image goes .*build_prompt"
    with pytest.raises(PromptError, match=msg):
        model_inputs(proc, s.image, None, prompt=bare)
    with pytest.raises(PromptError, match=msg):
        split_prompt(proc, s.image, None, model=model, prompt=bare)
    # the processor called directly, then the model under capture: refused before the model's own error
    enc = proc(images=[s.image], text=[bare], return_tensors="pt")
    with pytest.raises(PromptError, match=r"no image token \(id 4\) but the forward gets an image .*'<image>'"):
        with AttentionCapture(model, "stats"):
            model(**enc)
    # a question that carries the marker itself
    with pytest.raises(PromptError, match=r"question contains the image marker '<image>': pass the question alone"):
        model_inputs(proc, s.image, f"<image> {s.question}")
    with pytest.raises(PromptError, match=r"2 image tokens '<image>' for 1 image"):
        model_inputs(proc, s.image, None, prompt=f"user : <image> <image> {s.question} assistant :")
    # the fixes: the marker in the prompt, or the family's template around the question
    fixed = model_inputs(proc, s.image, None, prompt=f"user : <image> {s.question} assistant :")
    templated = model_inputs(proc, s.image, None, prompt=build_prompt(proc, s.question))
    default = model_inputs(proc, s.image, s.question)
    assert torch.equal(fixed["input_ids"], default["input_ids"]) and torch.equal(templated["input_ids"], default["input_ids"])
    with torch.no_grad(), AttentionCapture(model, "stats") as cap:
        model(**default)
    assert len(cap.result) == 4
    # family-aware: another family's marker is named for its prompts
    with pytest.raises(PromptError, match=r"'<\|image_pad\|>'.*<\|vision_start\|><\|image_pad\|><\|vision_end\|>"):
        check_prompt("user : what colour ? assistant :", FAMILIES["Qwen2-VL"])


# ---- registries -----------------------------------------------------------------------------------
def _registries():
    from unicache_lib.families import FAMILIES
    from unicache_lib.kv.policies import POLICIES
    from unicache_lib.pruning.scorers import SCORERS
    from unicache_lib.reuse.policies import REUSE_POLICIES

    return {"POLICIES": (POLICIES, "h20", "h2o"), "SCORERS": (SCORERS, "high-entropy", "high_entropy"),
            "REUSE_POLICIES": (REUSE_POLICIES, "every2", "every_2"), "FAMILIES": (FAMILIES, "Llava-1.5", "LLaVA-1.5")}


@pytest.mark.parametrize("name", ["POLICIES", "SCORERS", "REUSE_POLICIES", "FAMILIES"])
def test_an_unknown_registry_name_lists_the_registered_ones(name):
    from unicache_lib.core.registry import Registry, UnknownNameError

    reg, typo, meant = _registries()[name]
    assert isinstance(reg, Registry)
    with pytest.raises(KeyError) as e:
        reg["nope"]
    assert isinstance(e.value, UnknownNameError)
    text = str(e.value)
    assert text.startswith("unknown ") and not text.startswith(("'", '"'))  # not KeyError's quoted repr
    assert all(repr(k) in text for k in reg)
    with pytest.raises(UnknownNameError, match=rf"Did you mean {meant!r}\?") as e:
        reg[typo]
    assert e.value.name == typo and meant in e.value.known
    assert reg[meant] is not None  # the suggested name works
    assert reg.get("nope") is None and "nope" not in reg  # dict idioms unchanged


@pytest.mark.parametrize("name", ["POLICIES", "SCORERS", "REUSE_POLICIES"])
def test_every_policy_and_scorer_is_a_dataclass_whose_settings_print(name):
    """A tuned setting shows in a log or a table cell: ``StepSkip(head=0.06, ..., stride=7, ...)``, not an address."""
    import dataclasses

    reg = _registries()[name][0]
    for key, cls in reg.items():
        piece = cls()
        assert dataclasses.is_dataclass(piece), key
        text = repr(piece)
        assert text.startswith(f"{cls.__name__}(") and " at 0x" not in text
        for f in dataclasses.fields(piece):
            if f.repr:
                assert f"{f.name}={getattr(piece, f.name)!r}" in text, (key, f.name)
        assert hash(piece) is not None and piece != cls()  # hashable, compared by identity (as before they printed)
    if name == "REUSE_POLICIES":
        assert "stride=7" in repr(reg["step_skip"](stride=7))

def test_a_new_piece_is_one_file_discovery_imports_it(tmp_path, monkeypatch):
    """``core.registry.discover`` (what every registry package's ``__init__`` calls) imports each module but
    ``base``: the ones named first in that order, then the others by name; a new file needs no other edit."""
    import sys

    from unicache_lib.core.registry import UnknownNameError, discover

    pkg = tmp_path / "plugpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("SEEN = []\n")
    for m in ("base", "zeta", "alpha", "my_new_policy"):
        (pkg / f"{m}.py").write_text(f"from . import SEEN\nSEEN.append({m!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import plugpkg

    try:
        assert discover("plugpkg", plugpkg.__path__, first=("zeta",)) == ["zeta", "alpha", "my_new_policy"]
        assert plugpkg.SEEN == ["zeta", "alpha", "my_new_policy"]  # base is the package's own import, not a piece
        with pytest.raises(UnknownNameError, match="no module 'gone' to import first"):
            discover("plugpkg", plugpkg.__path__, first=("gone",))
    finally:
        for m in [m for m in sys.modules if m == "plugpkg" or m.startswith("plugpkg.")]:
            del sys.modules[m]


# ---- budgets --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prefilled(tiny, samples):
    from unicache_lib.kv import prefill, split_prompt

    model, proc = tiny
    return prefill(model, split_prompt(proc, samples[0].image, samples[0].question, model=model))


def _select(name):
    def run(tiny, pre, budget):
        from unicache_lib.kv import POLICIES

        return POLICIES[name]().select(pre.context(), budget)
    return run


def _sweep(tiny, pre, budget):
    from unicache_lib.kv.evaluate import run_eviction

    return run_eviction(*tiny, [], [budget], progress=False)  # refused before any question runs


def _ratio(tiny, pre, budget):
    from unicache_lib.kv.peers import compression_ratio

    return compression_ratio(80, 64, budget)


def _keep_mask(tiny, pre, budget):
    from unicache_lib.pruning.heads import HeadSpace

    space = HeadSpace.of(tiny[0])
    return space.keep_mask(np.ones(space.shape), budget)


BUDGET_ENTRIES = {"h2o.select": _select("h2o"), "full.select": _select("full"), "run_eviction": _sweep,
                  "compression_ratio": _ratio, "HeadSpace.keep_mask (fraction)": _keep_mask}


@pytest.mark.parametrize("entry", sorted(BUDGET_ENTRIES))
@pytest.mark.parametrize("bad, fixed", [("25%", 0.25), ("0.25", 0.25), (None, 0.25)])
def test_a_budget_of_the_wrong_type_is_refused_and_the_named_number_works(tiny, prefilled, entry, bad, fixed):
    run = BUDGET_ENTRIES[entry]
    word = "fraction" if "fraction" in entry else "budget"
    match = rf"{word} must be a number, a fraction in \[0, 1[\])]" + (rf".*pass {word}=0\.25" if bad else "")
    with pytest.raises(TypeError, match=match):
        run(tiny, prefilled, bad)
    run(tiny, prefilled, fixed)


def test_a_budget_out_of_range_says_it_is_a_fraction(tiny, prefilled):
    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import run_eviction

    with pytest.raises(TypeError, match=r"budgets must be a list of numbers .*e\.g\. \[0\.25, 0\.5\]"):
        run_eviction(*tiny, [], 0.25, progress=False)
    with pytest.raises(TypeError, match=r"not a one-shot iterator: pass list\(budgets\)"):
        run_eviction(*tiny, [], (b for b in [0.25]), progress=False)
    assert len(run_eviction(*tiny, [], list(b for b in [0.25]), progress=False)) == 0

    with pytest.raises(InputError, match=r"budget must be a fraction in \[0, 1\] .*got 64 .*not a count or a percentage"):
        POLICIES["h2o"]().select(prefilled.context(), 64)
    with pytest.raises(ValueError, match=r"fraction must be a fraction in \[0, 1\)"):
        check_fraction(1.0, "fraction", upper_inclusive=False)
    assert check_fraction(np.float32(0.5)) == 0.5 and check_fraction(1) == 1.0
    keep = POLICIES["h2o"]().select(prefilled.context(), 64 / 64)
    assert len(keep[0]) == prefilled.context().seq_len


def test_images_of_different_sizes_and_an_empty_layer_list_are_named():
    """numpy >= 1.24 refuses ragged nesting itself; the message must still say what to pass (#29)."""
    import numpy as np

    from unicache_lib.inputs import ImageError, LayerError, prepare_image, resolve_layers

    with pytest.raises(ImageError, match="ragged list \\(images of different sizes\\?\\): pass one image"):
        prepare_image([np.zeros((32, 32, 3), np.uint8), np.zeros((48, 48, 3), np.uint8)])
    assert prepare_image(np.zeros((32, 32, 3), np.uint8)).shape == (32, 32, 3)  # one image at a time works
    with pytest.raises(LayerError, match="layers=\\[\\] selects no layer .* pass layers=None"):
        resolve_layers([], [0, 1, 2])
    assert resolve_layers(None or [0, 1, 2], [0, 1, 2]) == [0, 1, 2]
