"""Generators that are diffusers pipeline folders: loading, sampling through the pipeline, step callbacks.

Every family is a tiny random pipeline built in code (unicache_lib.zoo.builders.tiny_pipelines): tiny transformer,
text encoders and VAE, the real scheduler class, saved with save_pretrained and loaded back through
DiffusionPipeline.from_pretrained. The slow tests build the real-shape stand-ins and time one step.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from unicache_lib.runtime.loaders import UnsupportedModelError, load_generator
from unicache_lib.runtime.sampling import sample, to_uint8
from unicache_lib.zoo.builders import tiny_pipelines as tp

PROMPTS = ["a red circle on the left", "two blue squares at the top"]
SEEDS = [3, 5]
# kind -> (family, batches CFG (SD3...: [uncond | cond], DiT: [cond | uncond]), default max_sequence_length)
EXPECTED = {"sd3": ("sd3", True, 256), "sd3.5": ("sd3", True, 256), "pixart-alpha": ("pixart", True, 120),
            "pixart-sigma": ("pixart", True, 300), "flux-schnell": ("flux", False, 256),
            "flux-dev": ("flux", False, 512), "sana": ("sana", True, 300), "hunyuan": ("hunyuan", True, 256),
            "dit": ("dit", True, 0)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    return {kind: tp.build_tiny(kind, root / kind) for kind in EXPECTED}


class Recorder:
    """Step callbacks and transformer calls, in the order they happen."""

    def __init__(self, transformer):
        self.events = []
        self.handle = transformer.register_forward_hook(lambda m, a, o: self.events.append(("call",)))

    def on_step_begin(self, step, t):
        self.events.append(("begin", step, t))

    def on_velocity(self, step, t, v_un, v_c):
        self.events.append(("velocity", step, t, tuple(v_un.shape), tuple(v_c.shape)))

    def on_step_end(self, step, t, latents):
        self.events.append(("end", step, t))


def hook_counts(module):
    return len(module._forward_pre_hooks), len(module._forward_hooks)


def direct_call(gen, guidance):
    """The pipeline called by hand with the same seeds, size and prompt length (DiT: the classes the prompts name)."""
    kw = dict(num_inference_steps=2, guidance_scale=guidance, generator=[torch.Generator().manual_seed(s) for s in SEEDS],
              output_type="pt")
    if gen.family == "dit":
        return gen.pipe(class_labels=gen.pipe.get_label_ids(["circle", "squares"]), **kw).images
    kw |= dict(prompt=PROMPTS, height=gen.image_size, width=gen.image_size)
    if gen.family != "hunyuan":  # its prompt lengths are fixed: 77 BERT and 256 T5 tokens
        kw["max_sequence_length"] = gen.max_sequence_length
    if gen.family in ("pixart", "sana", "hunyuan"):
        kw["use_resolution_binning"] = False
    if gen.family in ("pixart", "sana"):
        kw["clean_caption"] = False
    return gen.pipe(**kw).images


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_pipeline_loads_and_samples_like_the_pipeline(folders, kind):
    family, cfg, msl = EXPECTED[kind]
    gen = load_generator(folders[kind])
    assert gen.family == family and type(gen.pipe).__name__ == tp.kinds()[kind][0]
    assert gen.path == str(folders[kind]) and gen.max_sequence_length == msl
    assert gen.text_tokens == msl + (77 if family in ("sd3", "hunyuan") else 0)
    assert gen.image_tokens == {"sd3": 16, "pixart": 16, "flux": 16, "sana": 64, "hunyuan": 16, "dit": 16}[family]
    if kind == "sd3.5":
        assert gen.transformer.config.dual_attention_layers and gen.transformer.config.qk_norm == "rms_norm"
    if family == "flux":
        assert gen.guidance_distilled == (kind == "flux-dev")

    tr = gen.transformer
    before = hook_counts(tr)
    rec = Recorder(tr)
    x = sample(gen, PROMPTS, steps=2, guidance=3.0, seed=SEEDS, callbacks=[rec])
    rec.handle.remove()
    assert hook_counts(tr) == before  # sample's hooks are gone
    assert x.shape == (2, 3, gen.image_size, gen.image_size) and x.dtype == torch.float32
    assert 0 <= x.min() and x.max() <= 1
    assert torch.equal(x, direct_call(gen, 3.0).float())

    ts = [float(t) for t in gen.pipe.scheduler.timesteps]
    h = gen.latent_size
    c = gen.pipe.vae.config.latent_channels
    want = []
    for i in range(2):
        want += [("begin", i, ts[i]), ("call",)]
        if cfg:
            want.append(("velocity", i, ts[i], (2, c, h, h), (2, c, h, h)))
        want.append(("end", i, ts[i]))
    assert rec.events == want


@pytest.mark.parametrize("kind", ["sd3", "pixart-sigma", "dit"])  # DiT: no step callback, its scheduler's step wrapped
def test_hooks_are_removed_when_a_callback_fails(folders, kind):
    gen = load_generator(folders[kind])
    before = hook_counts(gen.transformer)

    class Boom:
        def on_step_end(self, step, t, latents):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        sample(gen, PROMPTS[:1], steps=2, callbacks=[Boom()])
    assert hook_counts(gen.transformer) == before and "step" not in vars(gen.pipe.scheduler)
    assert sample(gen, PROMPTS[:1], steps=1).shape == (1, 3, 16, 16)  # no callbacks: no hooks at all
    assert hook_counts(gen.transformer) == before


def test_dit_samples_the_class_its_prompt_names(folders):
    """DiT is class-conditioned: a prompt stands for the class whose label it names (the longest), or is refused."""
    from unicache_lib.core.errors import InputError

    gen = load_generator(folders["dit"])
    assert gen.adapter.call_kwargs(gen.pipe, ["two blue squares at the top", "a circle"]) == {"class_labels": [1, 0]}
    with pytest.raises(InputError, match=r"class-conditioned.*'a red blob' names none.*circle"):
        sample(gen, ["a red blob"], steps=1)


def test_no_guidance_means_no_velocity(folders):
    gen = load_generator(folders["sd3"])
    rec = Recorder(gen.transformer)
    sample(gen, PROMPTS[:1], steps=2, guidance=1.0, callbacks=[rec])
    assert [e[0] for e in rec.events] == ["begin", "call", "end"] * 2


def test_device_dtype_and_overrides(folders):
    gen = load_generator(folders["flux-dev"], dtype="auto", device="cpu", image_size=32, max_sequence_length=64)
    assert gen.transformer.dtype == torch.float32 and gen.transformer.device.type == "cpu"
    assert (gen.image_size, gen.image_tokens, gen.text_tokens) == (32, 64, 64)
    assert sample(gen, PROMPTS[:1], steps=1).shape == (1, 3, 32, 32)


def test_unsupported_pipeline_names_the_supported_ones(folders, tmp_path):
    index = json.loads((folders["sd3"] / "model_index.json").read_text())
    (tmp_path / "model_index.json").write_text(json.dumps(index | {"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(UnsupportedModelError, match=r"'StableDiffusionPipeline'.*supported pipelines") as e:
        load_generator(tmp_path)
    for cls in ("StableDiffusion3Pipeline", "PixArtAlphaPipeline", "PixArtSigmaPipeline", "FluxPipeline", "SanaPipeline",
                "HunyuanDiTPipeline", "DiTPipeline"):
        assert cls in str(e.value)  # each family adapter's sampled_pipelines


def test_tiny_layout_is_unchanged():
    gen = load_generator("tiny-mmdit")
    assert gen.pipe is None and gen.family == "sd3"
    assert (gen.image_size, gen.image_tokens, gen.text_tokens) == (32, 64, 48)


def test_quality_takes_decoded_pixels_at_512():
    from unicache_lib.quality import psnr, ssim
    from unicache_lib.runtime.sampling import to_uint8

    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 3, 512, 512, generator=g)
    b = (a + 0.05 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    p, s = psnr(a, b), ssim(a, b)  # channels first, as sample() returns
    assert p.shape == (2,) and 20 < p.min() and 0.9 < s.min() < 1
    assert abs(psnr(to_uint8(a), to_uint8(b)) - p).max() < 0.05 and abs(ssim(to_uint8(a), to_uint8(b)) - s).max() < 1e-3
    assert torch.isinf(torch.as_tensor(psnr(a, a))).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd3-medium", "pixart-sigma", "flux-dev"])
def test_real_shape_standin_runs_one_step(tmp_path, name):
    """Build the stand-in and run one denoising step in a child process (its own peak RSS)."""
    from unicache_lib.runtime.loaders import is_stand_in, model_card
    from unicache_lib.zoo.builders.gen_standins import GEN_STANDINS

    out = subprocess.run([sys.executable, "-m", "unicache_lib.zoo.builders.gen_standins", "--out", str(tmp_path), "--only", name,
                          "--step"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{name}: {row} full-map memory {model_card(tmp_path / name)['full_map_memory']}")
    spec = GEN_STANDINS[name]
    assert row["image"] == [1, 3, 512, 512]
    assert row["image_tokens"] == spec.image_tokens == 1024 and row["text_tokens"] == spec.text_tokens
    card = model_card(tmp_path / name)
    assert is_stand_in(tmp_path / name) and card["imitates"] == spec.imitates and card["checksums"]
    assert row["peak_rss_mb"] < 24 * 1024


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_capture_through_the_pipeline(folders, kind, tmp_path):
    """capture_generation on a pipeline: decoded images equal to an uncaptured run, records for every
    step and captured block, the real text positions named (SD3: CLIP's copy of a word first), word maps
    over the image tokens."""
    from unicache_lib.analysis.generation import word_maps, word_positions
    from unicache_lib.capture.gen_runner import capture_generation, prompt_tokens
    from unicache_lib.store import Store

    gen = load_generator(folders[kind])
    family = EXPECTED[kind][0]
    run = capture_generation(gen, PROMPTS, "p", Store(tmp_path / "s"), steps=2, guidance=3.0, seed=SEEDS[0], progress=False)
    again = sample(gen, PROMPTS, steps=2, guidance=3.0, seed=[SEEDS[0], SEEDS[0] + 1])
    assert np.array_equal(run.images, to_uint8(again))  # capture changes no pixel
    recs = run.result.records
    assert {r.step for r in recs} == {0, 1} and {r.sample for r in recs} == {"p/0", "p/1"}
    assert len(Store(tmp_path / "s").read()) == len(recs)
    names = prompt_tokens(gen, PROMPTS)
    if family in ("sana", "dit"):  # positions not named; DiT has none
        assert names == (None if family == "sana" else [[], []]) and run.tokens == [[], []]
        return
    assert all(len(n) == gen.text_tokens for n in names)
    real = [t for t in names[0] if t is not None]
    assert run.tokens[0] == real and "red" in real
    text_recs = [r for r in recs if r.sample == "p/0" and r.meta.get("n_text", 0)]
    assert text_recs and all(r.meta["n_text_real"] == len(real) for r in text_recs)
    W = word_maps(recs, "p/0")
    assert W.shape == (len(real), gen.image_tokens)
    if family in ("sd3", "hunyuan"):  # the CLIP (BERT) copy comes first; the T5 copy is named apart
        assert word_positions(real, "red") == [real.index("red")] and "t5:red" in real


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_step_skip_through_the_pipeline(folders, kind):
    """The step-level reuse policy on a pipeline generator: whole transformer calls skipped (counted on the
    first block), a finite image of the pipeline's shape, the forward restored."""
    from unicache_lib.reuse import ReuseCache
    from unicache_lib.reuse.policies.step_skip import StepSkip

    gen = load_generator(folders[kind])
    first = [m for m in gen.transformer.children() if isinstance(m, torch.nn.ModuleList)][0][0]
    ran = [0]
    h = first.register_forward_pre_hook(lambda *a: ran.__setitem__(0, ran[0] + 1))
    pol, n = StepSkip(), 6
    try:
        with ReuseCache(gen, pol, n) as rc:
            x = sample(gen, PROMPTS, n, 3.0, seed=SEEDS, callbacks=[rc])
    finally:
        h.remove()
    assert ran[0] == rc.forward_computed == sum(pol.schedule(n)) < n == rc.forward_calls
    assert x.shape == (len(PROMPTS), 3, gen.image_size, gen.image_size) and x.isfinite().all()
    assert getattr(gen.transformer.forward, "__func__", None) is type(gen.transformer).forward


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_step_skip_as_a_diffusers_hook(folders, kind):
    """apply_step_skip in the pipeline's own HookRegistry makes the same transformer calls and the same images
    as ReuseCache with step_skip (torch.equal where the transformer gets the scheduler's timesteps; Flux gets
    t / 1000, equal to float rounding), resets between pipeline calls, and comes off cleanly."""
    from diffusers.hooks import HookRegistry

    from unicache_lib.reuse import ReuseCache
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip
    from unicache_lib.reuse.policies.step_skip import StepSkip

    gen, n = load_generator(folders[kind]), 6
    with ReuseCache(gen, StepSkip(), n) as rc:
        ref = sample(gen, PROMPTS, n, 3.0, seed=SEEDS, callbacks=[rc])
    hook = apply_step_skip(gen.transformer, StepSkipConfig(num_inference_steps=n))
    try:
        with pytest.raises(ValueError, match="already applied"):
            apply_step_skip(gen.transformer, StepSkipConfig(num_inference_steps=n))
        runs = [sample(gen, PROMPTS, n, 3.0, seed=SEEDS) for _ in range(2)]  # state reset between pipeline calls
        assert hook.calls == 2 * rc.forward_calls and hook.computed == 2 * rc.forward_computed < hook.calls
        with pytest.raises(ValueError, match="num_inference_steps=6"):
            sample(gen, PROMPTS, n + 2, 3.0, seed=SEEDS)
    finally:
        assert remove_step_skip(gen.transformer)
    assert torch.equal(runs[0], runs[1])
    if EXPECTED[kind][0] == "flux":
        torch.testing.assert_close(runs[0], ref, rtol=0, atol=1e-5)
    else:
        assert torch.equal(runs[0], ref)
    assert HookRegistry.check_if_exists_or_initialize(gen.transformer).get_hook("step_skip") is None
    assert not remove_step_skip(gen.transformer)


@pytest.mark.parametrize("pieces,names", [
    (["<s>", "a</w>", "tri", "angle</w>", ",</w>", "red</w>", "</s>"], ["<s>", "a", "triangle", "##angle", ",", "red", "</s>"]),
    (["▁a", "▁tri", "angle", ",", "▁", "red", ".", "</s>"], ["a", "triangle", "##angle", ",", "red", "##red", ".", "</s>"]),
    (["a", "Ġred", "Ġcube", ",", "Ġsph", "ere", "."], ["a", "red", "cube", ",", "sphere", "##ere", "."]),  # byte-level
    (["▁a", "</s>", "▁red", "▁cube"], ["a", "</s>", "red", "cube"]),  # a special token mid-sequence closes the word
    (["a", "red", "cube"], ["a", "red", "cube"]),  # no markers at all: each piece a word
])
def test_word_names_find_each_word_once_at_its_first_piece(pieces, names):
    """Sub-word pieces (CLIP's </w>, SentencePiece's ▁, byte-level Ġ) are named by their whole word at the first piece;
    punctuation without a marker is a word of its own, so "cube," still holds the word "cube"."""
    from unicache_lib.gen_families.base import word_names

    assert word_names(pieces, {"<s>", "</s>"}) == names
