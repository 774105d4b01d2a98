"""Capture for diffusers transformers: outputs unchanged, maps right, blocks consistent, steps never mixed."""
import numpy as np
import pytest
import torch

from unicache_lib.capture.diffusion import DiffusionCapture, attention_probs
from unicache_lib.capture.gen_runner import capture_generation, text_encoders
from unicache_lib.capture.vlm import CaptureError
from unicache_lib.core.errors import LayerError
from unicache_lib.core.modality import BLOCKS
from unicache_lib.gen_families import gen_family_of
from unicache_lib.runtime.loaders import load_generator
from unicache_lib.runtime.sampling import sample
from unicache_lib.store import Store, StoreError

PROMPTS = ["a red circle on the left", "a blue square at the top and a red triangle on the right"]


@pytest.fixture(scope="module", params=["tiny-mmdit", "tiny-pixart"])
def gen(request):
    return load_generator(request.param)


def _tokens(gen, prompts):
    from unicache_lib.capture.gen_runner import prompt_tokens

    return prompt_tokens(gen, prompts)


def test_output_unchanged_and_every_step_recorded(gen):
    plain = sample(gen, PROMPTS, steps=4, seed=1)
    with DiffusionCapture(gen.transformer, ["a", "b"], text_tokens=_tokens(gen, PROMPTS)) as cap:
        got = sample(gen, PROMPTS, steps=4, seed=1, callbacks=[cap])
    assert torch.equal(plain, got)  # bit-identical, as README says
    n_mod = len(gen_family_of(gen.transformer).modules(gen.transformer))
    assert len(cap.result) == 4 * 2 * n_mod
    keys = [r.key for r in cap.result]
    assert len(set(keys)) == len(keys)
    assert cap.result.steps == [0, 1, 2, 3]
    ts = [r.meta["timestep"] for r in cap.result if r.layer == 0 and r.sample == "a"]
    assert ts == sorted(ts, reverse=True) and ts[0] == 1000.0  # the scheduler's timesteps, in order
    # processors restored
    assert all(type(m.processor).__name__.endswith("Processor2_0") for m in gen_family_of(gen.transformer).modules(gen.transformer).values())


def test_recomputed_probabilities_reproduce_the_processor_output(gen):
    """probs @ V through to_out equals what the stock processor returns (so the map is the one used)."""
    from unicache_lib.gen_families.base import heads_view as _heads_view
    from unicache_lib.runtime.tiny_layouts import encode_prompts, transformer_forward

    seen = {}

    class Spy:
        def __init__(self, orig, part):
            self.orig, self.part = orig, part

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kw):
            out = self.orig(attn, hidden_states, encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, **kw)
            P = attention_probs(attn, self.part, hidden_states, encoder_hidden_states, attention_mask)
            src = hidden_states if self.part == "self" else encoder_hidden_states
            v = _heads_view(attn.to_v(src), attn.heads)
            if self.part == "joint":
                v = torch.cat([_heads_view(attn.to_v(hidden_states), attn.heads), _heads_view(attn.add_v_proj(encoder_hidden_states), attn.heads)], 2)
            o = (P @ v.float()).transpose(1, 2).flatten(2)
            n = hidden_states.shape[1]
            mine = attn.to_out[0](o[:, :n] if self.part == "joint" else o)
            ref = out[0] if isinstance(out, tuple) else out
            seen[self.part] = float((mine - ref).abs().max())
            return out

    mods = [s for s in gen_family_of(gen.transformer).sites(gen.transformer) if s.captured]
    olds = {s.name: s.module.processor for s in mods}
    try:
        for s in mods:
            s.module.processor = Spy(s.module.processor, s.part)
        cond = encode_prompts(gen.text_encoder, gen.tokenizer, PROMPTS)
        with torch.no_grad():
            transformer_forward(gen.transformer, gen.adapter, torch.randn(2, 3, 32, 32), torch.tensor([500.0, 500.0]), cond)
    finally:
        for s in mods:
            s.module.processor = olds[s.name]
    assert seen and max(seen.values()) <= 1e-5, seen


def test_block_split_and_text_positions(gen):
    toks = _tokens(gen, PROMPTS)
    with DiffusionCapture(gen.transformer, ["a", "b"], text_tokens=toks) as cap:
        sample(gen, PROMPTS, steps=2, seed=0, callbacks=[cap])
    for r in cap.result:
        b = r.data["blocks"]
        assert torch.allclose(b.sum(-1), torch.ones(r.heads), atol=1e-5)
        if r.part == "joint":
            assert r.meta["n_image"] == 64 and r.meta["n_text"] == 48
            # image rows' share of text keys equals the image->text block mass over image rows
            it, ii = b[:, BLOCKS.index("image->text")], b[:, BLOCKS.index("image->image")]
            assert torch.allclose(r.data["text_share"], it / (it + ii), atol=1e-4)
        elif r.part == "cross":
            assert torch.allclose(b[:, BLOCKS.index("image->text")], torch.ones(r.heads))
            assert torch.allclose(r.data["text_share"], torch.ones(r.heads))
        else:
            assert torch.allclose(b[:, BLOCKS.index("image->image")], torch.ones(r.heads))
        if r.part != "self":
            n_real = len(toks[0] if r.sample == "a" else toks[1])
            assert r.meta["n_text_real"] == n_real and r.data["word_map"].shape == (64, n_real)
        if r.step == 0:
            assert torch.isnan(r.data["sim_prev_all"]).all()
        else:
            assert ((r.data["sim_prev_all"] > 0) & (r.data["sim_prev_all"] <= 1 + 1e-5)).all()


def test_uncond_branch_differs_and_full_mode_keeps_maps(gen):
    with DiffusionCapture(gen.transformer, ["a", "b"], mode="full", branch="uncond", layers=[0]) as un:
        sample(gen, PROMPTS, steps=1, seed=0, callbacks=[un])
    with DiffusionCapture(gen.transformer, ["a", "b"], mode="full", layers=[0]) as co:
        sample(gen, PROMPTS, steps=1, seed=0, callbacks=[co])
    for ru, rc in zip(un.result, co.result):
        assert ru.key == rc.key and ru.probs.shape == rc.probs.shape
        assert torch.allclose(rc.probs.sum(-1), torch.ones(rc.probs.shape[:-1]), atol=1e-5)
        if rc.part != "self":  # the empty prompt reads the text differently
            assert float((ru.probs - rc.probs).abs().max()) > 1e-4


def test_steps_of_two_runs_never_mix(gen, tmp_path):
    store = Store(tmp_path / "s", meta={"model": "m"})
    capture_generation(gen, PROMPTS, "run1", store, steps=3, progress=False)
    capture_generation(gen, PROMPTS, "run2", store, steps=2, progress=False)
    recs = store.read()
    for run, n in (("run1", 3), ("run2", 2)):
        for sid in (f"{run}/0", f"{run}/1"):
            mine = [r for r in recs if r.sample == sid]
            by_module = {}
            for r in mine:
                by_module.setdefault((r.part, r.layer), []).append(r.step)
            assert all(sorted(v) == list(range(n)) for v in by_module.values())
    with pytest.raises(CaptureError, match="already in the store"):
        capture_generation(gen, PROMPTS, "run1", store, steps=2, progress=False)
    assert len(store.read()) == len(recs)  # nothing lost, nothing added
    assert store.verify() == []


def test_bad_use_gives_clear_errors(gen):
    with pytest.raises(CaptureError, match="batch of"):
        with DiffusionCapture(gen.transformer, ["only-one"]) as cap:
            sample(gen, PROMPTS, steps=1, callbacks=[cap])
    with pytest.raises(CaptureError, match="ran twice in step"):
        with DiffusionCapture(gen.transformer, ["a", "b"]):
            sample(gen, PROMPTS, steps=2)  # no callbacks: the capture cannot tell steps apart
    with pytest.raises(LayerError, match="do not exist"):
        DiffusionCapture(gen.transformer, ["a"], layers=[99])
    with pytest.raises(ValueError, match="unique"):
        DiffusionCapture(gen.transformer, ["a", "a"])
    # after all of that the model is untouched
    assert all(type(m.processor).__name__.endswith("Processor2_0") for m in gen_family_of(gen.transformer).modules(gen.transformer).values())


def test_a_block_that_does_not_exist_names_the_valid_range_and_negative_blocks_work(gen):
    blocks = sorted({s.layer for s in gen_family_of(gen.transformer).sites(gen.transformer) if s.captured})
    n = len(blocks)
    with pytest.raises(ValueError, match=rf"layers \[-{n + 5}\] do not exist: the transformer has {n} layers .* "
                                         rf"negative indices -{n}\.\.-1 count from the last \(-1 = layer {blocks[-1]}"):
        DiffusionCapture(gen.transformer, ["a"], layers=[-(n + 5)])  # was a bare IndexError
    with DiffusionCapture(gen.transformer, ["a", "b"], layers=[-1]) as cap:  # the fix the message names
        sample(gen, PROMPTS, steps=1, callbacks=[cap])
    assert cap.result.layers == [blocks[-1]]


def test_store_duplicate_is_refused_without_loss(tmp_path):
    gen = load_generator("tiny-pixart")
    store = Store(tmp_path / "s")
    with DiffusionCapture(gen.transformer, ["x"], store=store, layers=[0], encoders=text_encoders(gen)) as cap:
        sample(gen, PROMPTS[:1], steps=1, callbacks=[cap])
    n = len(store.read())
    with pytest.raises(StoreError):
        store.write(cap.result.records[:1])
    assert len(store.read()) == n


def test_real_diffusers_pipeline_with_step_callback():
    """A StableDiffusion3Pipeline built from tiny random parts: same calls, same guarantees."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import AutoTokenizer

    from unicache_lib.runtime.loaders import MODELS_DIR
    from unicache_lib.zoo import tiny_generators as tg

    tok = AutoTokenizer.from_pretrained(MODELS_DIR / "tiny-mmdit" / "tokenizer")
    tok.model_max_length = 16
    torch.manual_seed(0)
    te1, te2 = tg.build_text_encoder(tok, hidden=32, layers=1), tg.build_text_encoder(tok, hidden=32, layers=1)
    tr = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
                               num_attention_heads=2, joint_attention_dim=64, caption_projection_dim=16,
                               pooled_projection_dim=64, pos_embed_max_size=8)
    vae = AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",), norm_num_groups=4,
                        layers_per_block=1, shift_factor=0.0)
    pipe = StableDiffusion3Pipeline(transformer=tr, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=te1,
                                    tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok, text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(prompt=["a red circle on the left"], num_inference_steps=3, guidance_scale=3.0, height=8, width=8,
              output_type="pt", max_sequence_length=16)
    plain = pipe(**kw, generator=torch.Generator().manual_seed(0)).images
    with DiffusionCapture(pipe.transformer, ["x"]) as cap:
        got = pipe(**kw, generator=torch.Generator().manual_seed(0), callback_on_step_end=cap.pipeline_callback).images
    assert torch.equal(plain, got)  # bit-identical, as README says
    assert cap.result.steps == [0, 1, 2] and len(cap.result) == 3 * 2
    ts = [r.meta["timestep"] for r in cap.result if r.layer == 0]
    assert np.all(np.diff(ts) < 0)
    assert all(r.part == "joint" and r.meta["n_image"] == 16 for r in cap.result)


@pytest.mark.parametrize("query_stride", [1, 2])
def test_step_to_step_similarities_are_the_cosines_of_the_kept_maps(gen, query_stride):
    """sim_prev_all and the image->image block's sim_prev equal the cosines of two consecutive steps' maps, per head,
    computed here from the maps mode 'full' keeps: read in the statistics' own pass (query_stride 1) and in a pass
    of their own over the thinned maps (query_stride 2)."""
    with DiffusionCapture(gen.transformer, ["a", "b"], mode="full", layers=[0], query_stride=query_stride) as cap:
        sample(gen, PROMPTS, steps=3, seed=0, callbacks=[cap])
    recs = {(r.sample, r.part, r.step): r for r in cap.result}
    checked = 0
    for (sid, part, step), r in recs.items():
        if step == 0:
            continue
        a, b = r.probs.float(), recs[(sid, part, step - 1)].probs.float()
        H = a.shape[0]
        cos = torch.nn.functional.cosine_similarity(a.reshape(H, -1), b.reshape(H, -1), dim=-1)
        assert torch.allclose(r.data["sim_prev_all"], cos, atol=1e-5), (sid, part, step)
        if part != "cross":
            n_img = r.meta["n_image"]
            first = r.meta.get("token_order", "image").startswith("image")
            qi = torch.arange(r.meta["n_image"] + r.meta["n_text"] * (part == "joint"))
            qi = (qi < n_img) if first else (qi >= qi.numel() - n_img)
            rows = qi[::query_stride]
            ai, bi = a[:, rows][..., qi], b[:, rows][..., qi]
            cos_ii = torch.nn.functional.cosine_similarity(ai.reshape(H, -1), bi.reshape(H, -1), dim=-1)
            assert torch.allclose(r.data["sim_prev"][:, BLOCKS.index("image->image")], cos_ii, atol=1e-5)
        checked += 1
    assert checked >= 4
