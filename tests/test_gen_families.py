"""Every generator family, from tiny random configs: capture leaves outputs bit-identical, its maps are the
softmax of the processors' own queries and keys, parts and spans are right, and errors say what works."""
import functools
import inspect
import re
import warnings
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unicache_lib.capture.diffusion import DiffusionCapture, attention_probs, find_diffusion_attention, wrap_processors
from unicache_lib.capture.vlm import CaptureError
from unicache_lib.families import UnsupportedModelError
from unicache_lib.gen_families import GEN_FAMILIES, gen_family_for, gen_family_of, register, restore_processors
from unicache_lib.modality import BLOCKS, IMAGE, TEXT
from unicache_lib.stats import step_statistics
from unicache_lib.zoo.tiny_random import TINY, forward_inputs, tiny_transformer

N_TEXT, N_PAD = 5, 2  # forward_inputs' defaults: 5 real text tokens (+ 2 padding where the family has a text mask)

# What the diffusers models do, written down independently of the adapters: parts, joint token order, image
# tokens, and which text keys are real (False = padding) -- HunyuanDiT joins 3 + 1 pad CLIP and 4 + 2 pad T5 tokens.
EXPECT = {
    "sd3": dict(family="SD3", parts={"joint"}, order=("image", "text"), n_image=16, real=[1] * 5),
    "sd3.5": dict(family="SD3", parts={"joint", "self"}, order=("image", "text"), n_image=16, real=[1] * 5),
    "pixart": dict(family="PixArt", parts={"self", "cross"}, n_image=16, real=[1] * 5 + [0] * 2, masked=True),
    "flux": dict(family="Flux", parts={"joint"}, order=("text", "image"), n_image=16, real=[1] * 5),
    "sana": dict(family="Sana", parts={"cross"}, n_image=64, real=[1] * 5 + [0] * 2, masked=True),
    "hunyuan": dict(family="HunyuanDiT", parts={"self", "cross"}, n_image=16, real=[1, 1, 1, 0, 1, 1, 1, 1, 0, 0]),
    "dit": dict(family="DiT", parts={"self"}, n_image=16, real=[]),
}
assert set(EXPECT) == set(TINY)
CASES = [(f, b) for f in TINY for b in (1, 2)]  # batch 1: guidance off; batch 2: [uncond | cond], one sample id


def _processor_maps(tr, kw) -> dict[str, torch.Tensor]:
    """``{module name: [B, H, Sq, Sk]}``: softmax(q k^T * scale + mask) in float32 of the q, k, mask and scale
    each processor hands to scaled_dot_product_attention in an uncaptured forward (Flux's
    dispatch_attention_fn ends there too with the native backend)."""
    names = {m: n for n, m in tr.named_modules() if hasattr(m, "processor")}
    current, maps, sdpa = [None], {}, F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **more):
        logits = (query.float() @ key.float().transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
        if attn_mask is not None:
            m = attn_mask
            logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
        assert current[0] not in maps, f"{current[0]} called sdpa twice"
        maps[current[0]] = logits.softmax(-1)
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **more)

    hooks = [m.register_forward_pre_hook(lambda mod, a: current.__setitem__(0, names[mod])) for m in names]
    try:
        with mock.patch("torch.nn.functional.scaled_dot_product_attention", spy), torch.no_grad():
            tr(**kw)
    finally:
        for h in hooks:
            h.remove()
    return maps


@functools.lru_cache(maxsize=None)
def _run(family: str, batch: int):
    """(transformer, inputs, plain output, captured output, capture, processor maps) of one forward."""
    tr = tiny_transformer(family)
    kw = forward_inputs(family, tr, batch=batch, n_text=N_TEXT, n_pad=N_PAD)
    procs = {n: type(m.processor) for n, m in tr.named_modules() if hasattr(m, "processor")}
    with torch.no_grad():
        plain = tr(**kw)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Sana's "not captured" warning: tested below
            with DiffusionCapture(tr, ["s"], mode="full") as cap:
                got = tr(**kw)[0]
    assert procs == {n: type(m.processor) for n, m in tr.named_modules() if hasattr(m, "processor")}  # restored
    return tr, kw, plain, got, cap, _processor_maps(tr, kw)


def _site_of(tr, rec) -> str:
    (name,) = [n for n, (layer, part, _) in find_diffusion_attention(tr).items() if (layer, part) == (rec.layer, rec.part)]
    return name


@pytest.mark.parametrize("family,batch", CASES)
def test_output_unchanged(family, batch):
    _, _, plain, got, cap, _ = _run(family, batch)
    assert torch.equal(plain, got)
    assert len(cap.result) == len(find_diffusion_attention(cap.transformer))  # one record per module, one sample


@pytest.mark.parametrize("family,batch", CASES)
def test_maps_are_the_softmax_of_the_processors_own_queries_and_keys(family, batch):
    tr, _, _, _, cap, truth = _run(family, batch)
    row = batch - 1  # the conditional half
    assert set(truth) >= set(find_diffusion_attention(tr))
    for r in cap.result:
        want = truth[_site_of(tr, r)][row]
        assert r.probs.shape == want.shape
        assert float((r.probs - want).abs().max()) <= 1e-5, (r.layer, r.part)


@pytest.mark.parametrize("family", list(TINY))
def test_public_attention_probs_passes_processor_arguments_through(family):
    """attention_probs(attn, part, ..., **processor kwargs) from any wrapper keeping ``.orig`` (HunyuanDiT's
    image_rotary_emb comes as a keyword, Flux's positionally)."""
    tr, kw, plain, _, _, truth = _run(family, 2)
    got = {}

    class Spy:
        def __init__(self, name, part, orig):
            self.name, self.part, self.orig = name, part, orig

        def __call__(self, attn, *args, **kwargs):
            out = self.orig(attn, *args, **kwargs)
            named = inspect.signature(self.orig.__call__).bind(attn, *args, **kwargs).arguments
            named = {k: v for k, v in named.items() if k not in ("attn", "args", "kwargs")}
            got[self.name] = attention_probs(attn, self.part, **named)
            return out

    with wrap_processors(find_diffusion_attention(tr), lambda n, layer, part, orig: Spy(n, part, orig)), torch.no_grad():
        assert torch.equal(tr(**kw)[0], plain)
    assert got.keys() == find_diffusion_attention(tr).keys()
    for n, P in got.items():
        assert float((P - truth[n]).abs().max()) <= 1e-5, n


@pytest.mark.parametrize("family", list(TINY))
def test_parts_and_spans(family):
    tr, _, _, _, cap, _ = _run(family, 2)
    ex = EXPECT[family]
    fam = gen_family_of(tr)
    assert fam.name == ex["family"] and {r.part for r in cap.result} == ex["parts"] <= set(fam.parts)
    real = np.array(ex["real"], bool)
    for r in cap.result:
        P, m = r.probs, r.meta
        assert m["n_image"] == ex["n_image"] and m["n_text"] == len(real) * (r.part != "self")
        if r.part == "joint":
            spans = {"image": np.full(m["n_image"], IMAGE), "text": np.full(m["n_text"], TEXT)}
            qk = kk = np.concatenate([spans[x] for x in ex["order"]])
            kreal = np.ones(len(kk), bool)
            assert m["token_order"] == "|".join(ex["order"])
        elif r.part == "cross":
            qk, kk, kreal = np.full(m["n_image"], IMAGE), np.full(m["n_text"], TEXT), real
            assert P.shape[-2:] == (m["n_image"], m["n_text"])
            assert torch.allclose(r.data["blocks"][:, BLOCKS.index("image->text")], torch.ones(r.heads))
            if ex.get("masked"):  # padding keys masked: exactly zero mass
                assert torch.equal(P[..., ~real], torch.zeros_like(P[..., ~real]))
        else:
            qk = kk = np.full(m["n_image"], IMAGE)
            kreal = np.ones(len(kk), bool)
            assert torch.allclose(r.data["blocks"][:, BLOCKS.index("image->image")], torch.ones(r.heads))
        if r.part != "self":
            kreal = kreal.copy()
            kreal[kk == TEXT] = real
            assert m["n_text_real"] == real.sum() and r.data["word_map"].shape == (m["n_image"], real.sum())
        want = step_statistics(P, qk, kk, kreal)  # the statistics of the map under the spans written above
        for k in ("blocks", "text_share", "word_map", "max_weight"):
            assert torch.allclose(r.data[k], want[k], atol=1e-6, equal_nan=True), (r.layer, r.part, k)


def test_flux_single_stream_blocks_are_joint_text_first_and_numbered_after_the_double_ones():
    tr, _, _, _, cap, _ = _run("flux", 2)
    n_double, n_single = len(tr.transformer_blocks), len(tr.single_transformer_blocks)
    assert [(r.layer, r.meta["block"]) for r in cap.result] == (
        [(i, "double") for i in range(n_double)] + [(n_double + i, "single") for i in range(n_single)])
    names = gen_family_of(tr).modules(tr, "joint")
    assert list(names) == [f"transformer_blocks.{i}.attn" for i in range(n_double)] + [
        f"single_transformer_blocks.{i}.attn" for i in range(n_single)]
    assert all(r.part == "joint" and r.meta["n_text"] == N_TEXT and r.seq_len == N_TEXT + 16 for r in cap.result)


def test_sana_linear_self_attention_is_said_not_captured():
    tr = tiny_transformer("sana")
    kw = forward_inputs("sana", tr, batch=1)
    with pytest.warns(UserWarning, match="linear attention") as w:
        cap = DiffusionCapture(tr, ["s"])
    assert len(w) == 1
    assert set(cap.not_captured) == {"transformer_blocks.0.attn1", "transformer_blocks.1.attn1"}
    assert set(gen_family_of(tr).modules(tr, "self", captured_only=False)) == set(cap.not_captured)
    why = r"'self' of Sana cannot be captured: .*linear attention.*Capturable parts: \['cross'\]"
    with pytest.raises(CaptureError, match=why):
        DiffusionCapture(tr, ["s"], parts=["self"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asking for what exists warns of nothing
        with DiffusionCapture(tr, ["s"], parts=["cross"]) as cap, torch.no_grad():
            tr(**kw)
    assert {r.part for r in cap.result} == {"cross"}


class Foreign:
    """A processor no family knows (it delegates, so the model still runs)."""

    def __init__(self, orig):
        self.inner = orig

    def __call__(self, attn, *args, **kwargs):
        return self.inner(attn, *args, **kwargs)


@pytest.mark.parametrize("family", list(TINY))
def test_unknown_processor_error_names_it_and_its_fixes_work(family):
    _, _, plain, _, _, _ = _run(family, 1)
    tr = tiny_transformer(family)
    kw = forward_inputs(family, tr, batch=1)
    name = next(iter(find_diffusion_attention(tr)))
    mod = tr.get_submodule(name)
    fam_name = EXPECT[family]["family"]

    def capture_works():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DiffusionCapture(tr, ["s"]) as cap, torch.no_grad():
                assert torch.equal(tr(**kw)[0], plain)
        assert len(cap.result) == len(find_diffusion_attention(tr))

    # fix 1: the per-module diffusers call the message spells out, run as written
    mod.processor = Foreign(mod.processor)
    with pytest.raises(CaptureError, match=rf"{re.escape(name)} of this {fam_name} transformer uses Foreign") as e:
        DiffusionCapture(tr, ["s"])
    advice = r"transformer\.get_submodule\('([^']+)'\)\.set_processor\((\w+)\(\)\) with \w+ from ([\w.]+)"
    call = re.search(advice, str(e.value))
    assert call and call.group(1) == name
    cls = getattr(__import__(call.group(3), fromlist=[call.group(2)]), call.group(2))
    tr.get_submodule(call.group(1)).set_processor(cls())
    capture_works()
    # fix 2: restore_processors(transformer)
    mod.processor = Foreign(mod.processor)
    with pytest.raises(CaptureError, match=r"restore_processors\(transformer\)"):
        DiffusionCapture(tr, ["s"])
    restore_processors(tr)
    capture_works()


def test_fused_sd3_says_unfuse_and_unfusing_works():
    _, _, plain, _, _, _ = _run("sd3", 1)
    tr = tiny_transformer("sd3")
    kw = forward_inputs("sd3", tr, batch=1)
    tr.fuse_qkv_projections()
    with pytest.raises(CaptureError, match=r"FusedJointAttnProcessor2_0.*transformer\.unfuse_qkv_projections\(\)"):
        DiffusionCapture(tr, ["s"])
    tr.unfuse_qkv_projections()
    with DiffusionCapture(tr, ["s"]) as cap, torch.no_grad():
        assert torch.equal(tr(**kw)[0], plain)
    assert len(cap.result) == 2


def test_unsupported_transformer_names_the_families_and_the_suggested_registration_works():
    from diffusers import PixArtTransformer2DModel

    from unicache_lib.gen_families.pixart import PixArt

    for f in GEN_FAMILIES.values():  # every family lists classes diffusers has
        import diffusers

        assert all(hasattr(diffusers, c) for c in f.transformer_classes + f.pipeline_classes), f.name
    with pytest.raises(UnsupportedModelError, match="Linear is not a supported generator transformer. Supported generator "
                                                    "families: .*To add a family") as e:
        DiffusionCapture(torch.nn.Linear(2, 2), ["s"])
    assert all(f"{ex['family']} (" in str(e.value) for ex in EXPECT.values())
    with pytest.raises(UnsupportedModelError, match="looks like a pipeline: pass pipe.transformer"):
        gen_family_of(SimpleNamespace(transformer=None))

    class MyPixArt(PixArtTransformer2DModel):
        pass

    torch.manual_seed(0)
    tr = MyPixArt(**TINY["pixart"][1]).eval()
    kw = forward_inputs("pixart", tr, batch=1)
    with pytest.raises(UnsupportedModelError, match=r"MyPixArt subclasses PixArtTransformer2DModel \(PixArt\).*"
                                                    r"@register class Mine\(unicache_lib\.gen_families\.pixart\.PixArt\)"):
        find_diffusion_attention(tr)
    try:
        @register
        class Mine(PixArt):  # what the message says
            name = "mine"
            transformer_classes = ("MyPixArt",)

        assert gen_family_of(tr).name == "mine"
        with torch.no_grad():
            plain = tr(**kw)[0]
            with DiffusionCapture(tr, ["s"]) as cap:
                assert torch.equal(tr(**kw)[0], plain)
        assert {r.part for r in cap.result} == {"self", "cross"}
    finally:
        GEN_FAMILIES.pop("mine", None)
    with pytest.raises(UnsupportedModelError):
        gen_family_of(tr)


def test_lookup_by_class_name():
    assert gen_family_for("FluxPipeline").name == "Flux"
    assert gen_family_for("PixArtSigmaPipeline") is gen_family_for("PixArtTransformer2DModel")
    assert gen_family_for("StableDiffusion3Pipeline").transformer_classes == ("SD3Transformer2DModel",)
    with pytest.raises(UnsupportedModelError, match="'UNet2DConditionModel' is not a supported generator class"):
        gen_family_for("UNet2DConditionModel")


def test_every_family_has_a_key_with_peer_configuration_and_a_tiny_config():
    from unicache_lib.reuse.peers import FAMILY_PEERS
    from unicache_lib.zoo.tiny_random import TINY

    keys = [GEN_FAMILIES[n].key for n in GEN_FAMILIES]
    assert all(keys) and len(set(keys)) == len(keys)
    assert set(keys) <= set(FAMILY_PEERS)
    assert set(keys) <= {k.split(".")[0] for k in TINY}
