"""Every generator family, from tiny random configs: capture leaves outputs bit-identical, its maps are the
softmax of the processors' own queries and keys, parts and spans are right, and errors say what works; every
reuse policy and diffusers cache runs and skips work, or fails as its stated reason says (second half).

Reuse: Cross-step reuse policies and diffusers' caches on every generator family (tiny random transformers).

A sampling run is simulated: the transformer is called for ``N`` steps with a decreasing timestep (1000 ->
167), the sample moved a little by each step's output, and the callbacks' ``on_step_begin`` /
``on_step_end`` around each call. ``N = 6``: the smallest budget at which every method would skip at
its own settings (the static schedule reuses only in the last third; TaylorSeer computes the first 3
steps in full; PAB and FasterCache skip only inside their timestep windows).
"""
import contextlib
import functools
import inspect
import io
import logging
import re
import warnings
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from unicache_lib.capture.diffusion import DiffusionCapture, attention_probs
from unicache_lib.capture.vlm import CaptureError
from unicache_lib.core.hooks import ProcessorWrapper, processors
from unicache_lib.core.modality import BLOCKS, IMAGE, TEXT
from unicache_lib.families import UnsupportedModelError
from unicache_lib.gen_families import GEN_FAMILIES, gen_family_for, gen_family_of, register, restore_processors
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.cache import AttentionCallCounter, module_kinds
from unicache_lib.reuse.peers import (
    FAMILY_ALIASES,
    FAMILY_PEERS,
    PEERS,
    DiffusersCache,
    PeerUnsupported,
    calibrate_magcache,
    peer_family_key,
)
from unicache_lib.reuse.policies.base import ReusePolicy
from unicache_lib.stats import step_statistics
from unicache_lib.zoo.builders.tiny_random import TINY, forward_inputs, tiny_transformer

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
    (name,) = [s.name for s in gen_family_of(tr).sites(tr) if s.captured and (s.layer, s.part) == (rec.layer, rec.part)]
    return name


@pytest.mark.parametrize("family,batch", CASES)
def test_output_unchanged(family, batch):
    _, _, plain, got, cap, _ = _run(family, batch)
    assert torch.equal(plain, got)
    assert len(cap.result) == len(gen_family_of(cap.transformer).modules(cap.transformer))  # one record a module, one sample


@pytest.mark.parametrize("family,batch", CASES)
def test_maps_are_the_softmax_of_the_processors_own_queries_and_keys(family, batch):
    tr, _, _, _, cap, truth = _run(family, batch)
    row = batch - 1  # the conditional half
    assert set(truth) >= set(gen_family_of(tr).modules(tr))
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

    class Spy(ProcessorWrapper):
        def __init__(self, name, part, orig):
            super().__init__(orig)
            self.name, self.part = name, part

        def __call__(self, attn, *args, **kwargs):
            out = self.orig(attn, *args, **kwargs)
            named = inspect.signature(self.orig.__call__).bind(attn, *args, **kwargs).arguments
            named = {k: v for k, v in named.items() if k not in ("attn", "args", "kwargs")}
            got[self.name] = attention_probs(attn, self.part, **named)
            return out

    sites = {s.name: s for s in gen_family_of(tr).sites(tr) if s.captured}
    with processors({n: s.module for n, s in sites.items()}, lambda n, orig: Spy(n, sites[n].part, orig)), torch.no_grad():
        assert torch.equal(tr(**kw)[0], plain)
    assert got.keys() == sites.keys()
    for n, P in got.items():
        assert float((P - truth[n]).abs().max()) <= 1e-5, n


def _spans(r, family: str):
    """``(query kinds, key kinds, real keys)`` of a record of the tiny ``family``, written out from EXPECT
    (not from the family's adapter), for recomputing its statistics from its map."""
    ex, m = EXPECT[family], r.meta
    real = np.array(ex["real"], bool)
    if r.part == "joint":
        spans = {"image": np.full(m["n_image"], IMAGE), "text": np.full(m["n_text"], TEXT)}
        qk = kk = np.concatenate([spans[x] for x in ex["order"]])
    elif r.part == "cross":
        qk, kk = np.full(m["n_image"], IMAGE), np.full(m["n_text"], TEXT)
    else:
        qk = kk = np.full(m["n_image"], IMAGE)
    kreal = np.ones(len(kk), bool)
    if r.part != "self":
        kreal[kk == TEXT] = real
    return qk, kk, kreal


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
            assert m["token_order"] == "|".join(ex["order"])
        elif r.part == "cross":
            assert P.shape[-2:] == (m["n_image"], m["n_text"])
            assert torch.allclose(r.data["blocks"][:, BLOCKS.index("image->text")], torch.ones(r.heads))
            if ex.get("masked"):  # padding keys masked: exactly zero mass
                assert torch.equal(P[..., ~real], torch.zeros_like(P[..., ~real]))
        else:
            assert torch.allclose(r.data["blocks"][:, BLOCKS.index("image->image")], torch.ones(r.heads))
        if r.part != "self":
            assert m["n_text_real"] == real.sum() and r.data["word_map"].shape == (m["n_image"], real.sum())
        qk, kk, kreal = _spans(r, family)
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
    name = next(iter(gen_family_of(tr).modules(tr)))
    mod = tr.get_submodule(name)
    fam_name = EXPECT[family]["family"]

    def capture_works():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DiffusionCapture(tr, ["s"]) as cap, torch.no_grad():
                assert torch.equal(tr(**kw)[0], plain)
        assert len(cap.result) == len(gen_family_of(tr).modules(tr))

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
        gen_family_of(tr)
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
    from unicache_lib.zoo.builders.tiny_random import TINY

    keys = [GEN_FAMILIES[n].key for n in GEN_FAMILIES]
    assert all(keys) and len(set(keys)) == len(keys)
    assert set(keys) <= set(FAMILY_PEERS)
    assert set(keys) <= {k.split(".")[0] for k in TINY}


def test_a_family_registered_from_one_file_brings_its_cache_settings():
    """The peers' settings live on the adapter: a family registered in one file is configured for diffusers' caches
    with nothing added in reuse/peers.py."""
    import dataclasses

    from unicache_lib.gen_families import register as register_gen
    from unicache_lib.gen_families.pixart import PixArt
    from unicache_lib.reuse.peers import FAMILY_PEERS

    @register_gen
    class MyPixArt(PixArt):  # unicache_lib/gen_families/my_pixart.py in a fork
        name, key = "my-pixart", "my_pixart"
        peers = dataclasses.replace(PixArt.peers, notes={"pab": "a fork's note"})
        transformer_classes = ("MyPixArtTransformer2DModel",)
        pipeline_classes = ()

    try:
        assert FAMILY_PEERS["my_pixart"].notes == {"pab": "a fork's note"} and "my_pixart" in set(FAMILY_PEERS)
    finally:
        GEN_FAMILIES.pop("my-pixart")
    assert "my_pixart" not in set(FAMILY_PEERS)  # read from the registry at each lookup


# ==== cross-step reuse and diffusers' caches on every family ==========================================
N = 6
TIMESTEPS = [1000.0 * (1 - i / N) for i in range(N)]


def _quiet():
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*should be kept in float32.*")


def steps(f, callbacks=(), inputs=None, n=N, move=True, timesteps=TIMESTEPS):
    """Outputs of ``n`` denoising calls of ``f.tr``, callbacks around each."""
    inputs = inputs or f.inputs
    x, outs = inputs["hidden_states"], []
    with torch.no_grad():
        for i, t in enumerate(timesteps[:n]):
            for cb in callbacks:
                cb.on_step_begin(i, t)
            tt = torch.full_like(inputs["timestep"], t / 1000 if f.family == "flux" else t)
            out = f.tr(**dict(inputs, hidden_states=x, timestep=tt))[0]
            for cb in callbacks:
                if hasattr(cb, "on_step_end"):
                    cb.on_step_end(i, t, None)
            outs.append(out)
            if move:  # a small Euler-like step, so the inputs change from step to step as in sampling
                x = x - 0.05 * (out[:, : x.shape[1]] if x.dim() == 4 else out[..., : x.shape[-1]])
    return outs


@pytest.fixture(scope="module", params=list(TINY))
def f(request):
    _quiet()
    fam = request.param
    tr = tiny_transformer(fam)
    ns = SimpleNamespace(family=fam, tr=tr, inputs=forward_inputs(fam, tr, batch=2, n_text=5))
    with AttentionCallCounter(tr) as c:
        ns.ref = steps(ns)
    ns.calls, ns.rows = c.calls, c.rows
    ns.modules = gen_family_of(tr).modules(tr)
    ns.kinds = module_kinds(tr)
    ns.processors = {n: m.processor for n, m in ns.modules.items()}
    return ns


def _good(outs, ref):
    return all(o.shape == r.shape and bool(o.isfinite().all()) for o, r in zip(outs, ref)) and len(outs) == len(ref)


def _untouched(f):
    """Processors back, no diffusers hook left, and the plain model gives the uncached outputs."""
    assert all(m.processor is f.processors[n] for n, m in f.modules.items())
    assert not [n for n, m in f.tr.named_modules() if getattr(m, "_diffusers_hook", None) is not None and m._diffusers_hook.hooks]
    # and no hook left in a forward chain: a module's forward is its class's own
    assert all(getattr(m.forward, "__func__", None) is type(m).forward for m in f.tr.modules())
    with AttentionCallCounter(f.tr) as c:
        again = steps(f)
    assert c.rows == f.rows and all(torch.equal(a, b) for a, b in zip(again, f.ref))


# ---- the family table ------------------------------------------------------------------------------------
def test_family_table_names_every_attention_module(f):
    spec = FAMILY_PEERS[FAMILY_ALIASES.get(f.family, f.family)]
    assert peer_family_key(f.tr) == FAMILY_ALIASES.get(f.family, f.family)
    for name, kind in f.kinds.items():
        assert re.fullmatch(spec.attention, name), name
        spatial = any(re.search(p, name) for p in spec.spatial)
        cross = any(re.search(p, name) for p in spec.cross or ())
        assert (spatial, cross) == ((False, True) if kind == "cross" else (True, False)), name


def test_generator_or_transformer():
    _quiet()
    tr = tiny_transformer("sd3.5")
    gen = SimpleNamespace(transformer=tr, family="sd3.5")
    assert DiffusersCache(gen, "pab", 4).family == DiffusersCache(tr, "pab", 4).family == "sd3"
    from unicache_lib.families import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="Supported generator families"):
        DiffusersCache(torch.nn.Linear(2, 2), "pab", 4)


# ---- the study's reuse policies ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REUSE_POLICIES))
def test_reuse_policy_runs_and_skips(f, name):
    cross_k = [m.to_k for n, m in f.modules.items() if f.kinds[n] == "cross"]
    k_calls = [0]
    hooks = [k.register_forward_hook(lambda *a: k_calls.__setitem__(0, k_calls[0] + 1)) for k in cross_k]
    try:
        with ReuseCache(f.tr, REUSE_POLICIES[name](), N) as rc:
            outs = steps(f, [rc])
    finally:
        for h in hooks:
            h.remove()
    assert _good(outs, f.ref)
    assert rc.calls == N * len(f.modules) and 0 < rc.computed_fraction <= 1
    text_stream = any(k in ("joint", "single") for k in f.kinds.values())
    if name == "none":  # the reference: computes everything, changes nothing
        assert rc.computed_fraction == 1 and all(torch.equal(a, b) for a, b in zip(outs, f.ref))
    elif name == "text_side" and not text_stream:
        # no text stream: the text side is the cross-attention's keys and values (projected once, the
        # attention itself computed, counted in full) and the output is exactly the uncached one; DiT has no text
        assert rc.computed_fraction == 1
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(outs, f.ref))
        assert k_calls[0] == 2 * len(cross_k)  # computed at step 0, projected once more for the reuse, then kept
    else:
        assert rc.computed_fraction < 1
    _untouched(f)


class _TextFromStep1(ReusePolicy):
    name = "test_text_from_1"

    def decide(self, step, n_steps, similarity, key=None):
        return "reuse_text" if step == 1 else "compute"


def test_image_side_matches_the_processor(f):
    """With the same inputs at both steps, reusing the text side is exact: the image side computed alone
    (rotary embeddings, norms, masks and all) equals the original processor's."""
    with ReuseCache(f.tr, _TextFromStep1(), 2) as rc:
        outs = steps(f, [rc], n=2, move=False, timesteps=[500.0, 500.0])
    ref = steps(f, n=2, move=False, timesteps=[500.0, 500.0])
    assert torch.allclose(outs[1], ref[1], atol=1e-5, rtol=1e-4)
    text_stream = any(k in ("joint", "single") for k in f.kinds.values())
    assert (rc.work < rc.calls) == text_stream


def test_reuse_keys_on_names_not_block_numbers():
    """Flux's single-stream blocks repeat the double-stream blocks' numbers; every module keeps its own."""
    _quiet()
    tr = tiny_transformer("flux")
    seen = []

    class Every2(ReusePolicy):
        def decide(self, step, n_steps, similarity, key=None):
            seen.append(key)
            return "compute" if step % 2 == 0 else "reuse"

    f = SimpleNamespace(family="flux", tr=tr, inputs=forward_inputs("flux", tr))
    with ReuseCache(tr, Every2(), 2):
        steps(f, n=2)
    assert sorted(set(seen)) == sorted(gen_family_of(tr).modules(tr)) and len(seen) == 2 * 4
    assert {"transformer_blocks.0.attn", "single_transformer_blocks.0.attn"} <= set(seen)


def test_step_skip_skips_whole_transformer_calls(f):
    """The step-level policy on every family: skipped steps never run a block (counted), the stand-in output
    has the model's shape, and the forward is the class's own again afterwards."""
    from unicache_lib.reuse.policies.step_skip import StepSkip

    pol = StepSkip()
    blocks = [m for n, m in f.tr.named_children() if isinstance(m, torch.nn.ModuleList)][0]
    ran = [0]
    h = blocks[0].register_forward_pre_hook(lambda *a: ran.__setitem__(0, ran[0] + 1))
    try:
        with ReuseCache(f.tr, pol, N) as rc:
            outs = steps(f, [rc])
    finally:
        h.remove()
    assert _good(outs, f.ref)
    assert ran[0] == rc.forward_computed < N == rc.forward_calls
    assert torch.equal(outs[0], f.ref[0])  # computed steps before any skip are the model's own
    _untouched(f)


# ---- diffusers' caches --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", PEERS)
def test_peer_runs_and_skips_or_fails_as_stated(f, kind):
    reason = _spec(f.family).unsupported.get(kind)
    if reason is not None:  # refused with the table's reason (test_every_refusal_is_verified: it really fails)
        with pytest.raises(PeerUnsupported, match=re.escape(reason)):
            DiffusersCache(f.tr, kind, N).__enter__()
        _untouched(f)
        return
    ratios = None
    if kind == "magcache":  # calibrated on other inputs than the scored run's
        held_out = forward_inputs(f.family, f.tr, batch=2, n_text=5, seed=1)
        ratios = calibrate_magcache(f.tr, N, lambda pc: steps(f, [pc], inputs=held_out))
        assert len(ratios) == N and all(r > 0 for r in ratios)
    with DiffusersCache(f.tr, kind, N, calibration=ratios) as pc, AttentionCallCounter(f.tr) as c:
        outs = steps(f, [pc])
    assert _good(outs, f.ref)
    assert 0 < c.rows < f.rows  # it computed less than everything
    assert any((a - b).abs().max() > 0 for a, b in zip(outs, f.ref))  # and skipping changed the outputs
    _untouched(f)


def _unmodified(f, kind, move=True, **cfg):
    """Run diffusers' cache with its own defaults (identifiers included) and nothing this library adds."""
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
        apply_faster_cache,
        apply_first_block_cache,
        apply_pyramid_attention_broadcast,
        apply_taylorseer_cache,
    )
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    cur = {"t": 1000.0}
    make = {"pab": (apply_pyramid_attention_broadcast, lambda: PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2, current_timestep_callback=lambda: cur["t"], **cfg)),
            "fastercache": (apply_faster_cache, lambda: FasterCacheConfig(
                current_timestep_callback=lambda: cur["t"], attention_weight_callback=lambda _: 0.3,
                tensor_format="BCHW", **cfg)),
            "first_block": (apply_first_block_cache, lambda: FirstBlockCacheConfig(threshold=0.2, **cfg)),
            "taylorseer": (apply_taylorseer_cache, lambda: TaylorSeerCacheConfig(taylor_factors_dtype=torch.float32, **cfg))}
    apply, config = make[kind]

    class Ctx:
        def on_step_begin(self, i, t):
            cur["t"] = t
            _set_cache_context(f.tr, CacheContext("cfg", step_index=i, num_inference_steps=N, timestep=t))

        def on_step_end(self, i, t, _):
            _set_cache_context(f.tr, None)

    try:
        apply(f.tr, config())
        for m in f.tr.modules():
            if getattr(m, "_diffusers_hook", None) is not None:
                m._diffusers_hook._child_registries_cache = None
        with AttentionCallCounter(f.tr) as c:
            outs = steps(f, [Ctx()], move=move)
        return outs, c
    finally:
        _remove_all_hooks(f.tr)


# What the family table adds to diffusers' caches, each checked by running the cache without it.
def _spec(family):
    return FAMILY_PEERS[FAMILY_ALIASES.get(family, family)]


def _remove_all_hooks(tr):
    from diffusers.hooks import HookRegistry

    for m in tr.modules():
        reg = getattr(m, "_diffusers_hook", None)
        if isinstance(reg, HookRegistry):
            for name in reversed(reg._hook_order):  # newest first (see DiffusersCache._remove)
                reg.remove_hook(name, recurse=False)
            reg._child_registries_cache = None


@pytest.mark.parametrize("f", [fam for fam in TINY if _spec(fam).tail_passes_encoder], indirect=True)
def test_first_block_cache_needs_sd3s_tail_to_pass_text_on(f):
    """SD3's last block (context_pre_only) returns None for the text stream; FirstBlockCache's tail hook
    subtracts from it."""
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for -: 'NoneType' and 'Tensor'"):
        _unmodified(f, "first_block")
    _untouched(f)


@pytest.mark.parametrize("kind", ["first_block", "magcache"])
@pytest.mark.parametrize("f", [fam for fam in TINY if _spec(fam).blocks], indirect=True)
def test_block_caches_need_block_metadata(f, kind):
    """diffusers 0.42.1 has no TransformerBlockRegistry entry for Sana's and HunyuanDiT's blocks."""
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, apply_first_block_cache, apply_mag_cache
    from diffusers.hooks._helpers import TransformerBlockRegistry

    TransformerBlockRegistry._register()
    assert not set(_spec(f.family).blocks) & {c.__name__ for c in TransformerBlockRegistry._registry}  # none left behind
    if kind == "first_block":
        cfg = FirstBlockCacheConfig(threshold=0.2)
    else:
        cfg = MagCacheConfig(mag_ratios=[1.0] * N, num_inference_steps=N)
    try:
        with pytest.raises(ValueError, match="not registered"):
            (apply_first_block_cache if kind == "first_block" else apply_mag_cache)(f.tr, cfg)
    finally:
        _remove_all_hooks(f.tr)
    _untouched(f)


_DEFAULT_CFG_KWARGS = ("hidden_states", "encoder_hidden_states", "timestep", "attention_mask", "encoder_attention_mask")


def _batched(f):
    return {k for k, v in f.inputs.items() if torch.is_tensor(v) and v.dim() and v.shape[0] == 2}


def test_cfg_kwargs_are_the_batched_arguments(f):
    """FasterCache halves exactly the keyword arguments the table lists: all batched tensors, nothing else."""
    assert set(_spec(f.family).cfg_kwargs) & set(f.inputs) == _batched(f)


@pytest.mark.parametrize("f", [fam for fam in TINY if not _spec(fam).guidance_distilled and any(
    k not in _DEFAULT_CFG_KWARGS for k in _spec(fam).cfg_kwargs)], indirect=True)
def test_fastercache_needs_the_familys_batched_kwargs(f):
    """diffusers' default list of [uncond | cond] arguments misses SD3's pooled projections, DiT's class
    labels, HunyuanDiT's second text encoder, masks, size and style: the skipped-unconditional call mixes a
    half batch with full-batch arguments, and fails or returns the wrong batch."""
    missing = _batched(f) - set(_DEFAULT_CFG_KWARGS)
    assert missing
    try:
        outs, _ = _unmodified(f, "fastercache", move=False, spatial_attention_block_identifiers=_spec(f.family).spatial)
    except RuntimeError as e:
        assert "size" in str(e) or "Sizes" in str(e)
    else:
        assert any(o.shape[0] != 2 for o in outs)
    _untouched(f)


@pytest.mark.parametrize("f", [fam for fam in TINY if _spec(fam).guidance_distilled], indirect=True)
def test_fastercache_on_flux_only_guidance_distilled(f):
    """Flux is guidance-distilled (diffusers' Flux tests configure FasterCache so); its CFG-batch frequency
    split assumes BCHW / BCFHW outputs and fails on Flux's packed [B, S, C] tokens."""
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        _unmodified(f, "fastercache")
    _untouched(f)


@pytest.mark.parametrize("f", [fam for fam in TINY if not re.fullmatch(_spec(fam).attention, "transformer_blocks.0.attn")],
                         indirect=True)
def test_taylorseer_default_identifiers_miss_attn1_attn2_names(f):
    """diffusers' default TaylorSeer patterns (``^blocks.*attn`` etc., full match) hook no ``attn1`` /
    ``attn2`` module: without the family's names it caches nothing."""
    outs, c = _unmodified(f, "taylorseer")
    assert c.rows == f.rows and all(torch.equal(a, b) for a, b in zip(outs, f.ref))
    _untouched(f)


def test_taylorseer_runs_on_sd3_with_sd3s_module_names():
    """It was refused on SD3 for a wrong reason; with SD3's names (transformer_blocks.N.attn) it runs and
    computes fewer attention calls. PixArt's attn1/attn2 patterns hook nothing on SD3."""
    _quiet()
    tr = tiny_transformer("sd3")
    f = SimpleNamespace(family="sd3", tr=tr, inputs=forward_inputs("sd3", tr))
    with AttentionCallCounter(tr) as plain:
        steps(f)
    pc = DiffusersCache(tr, "taylorseer", N)
    assert pc.config().cache_identifiers == [r"transformer_blocks\.\d+\.attn2?"]
    with pc, AttentionCallCounter(tr) as c:
        outs = steps(f, [pc])
    assert all(o.isfinite().all() for o in outs)
    assert c.calls < plain.calls  # steps 3 and 5 predicted: 8 of 12 calls computed
    _, c_pixart_names = _unmodified(f, "taylorseer", cache_identifiers=[r"transformer_blocks\.\d+\.attn1",
                                                                        r"transformer_blocks\.\d+\.attn2"])
    assert c_pixart_names.calls == plain.calls


def test_fastercache_refused_on_pixart_with_additional_conditions():
    """PixArt-alpha at 1024 px passes resolution and aspect ratio inside added_cond_kwargs (a dict):
    FasterCache does not halve them when it skips the unconditional branch, and that call fails."""
    import diffusers

    _quiet()
    kw = dict(TINY["pixart"][1], use_additional_conditions=True, attention_head_dim=12, cross_attention_dim=24)
    torch.manual_seed(0)
    tr = diffusers.PixArtTransformer2DModel(**kw).eval()
    inputs = forward_inputs("pixart", tr)
    inputs["added_cond_kwargs"] = {"resolution": torch.tensor([[64.0, 64.0]] * 2), "aspect_ratio": torch.tensor([[1.0]] * 2)}
    f = SimpleNamespace(family="pixart", tr=tr, inputs=inputs)
    with pytest.raises(PeerUnsupported, match="added_cond_kwargs"):
        DiffusersCache(tr, "fastercache", N).__enter__()
    spec = FAMILY_PEERS["pixart"]
    with pytest.raises(RuntimeError, match="must match the size"):
        _unmodified(f, "fastercache", spatial_attention_block_identifiers=spec.spatial,
                    _unconditional_conditional_input_kwargs_identifiers=spec.cfg_kwargs)
    with DiffusersCache(tr, "fastercache", N, guidance=1.0) as pc:  # no CFG batch: nothing to halve, it runs
        assert all(o.isfinite().all() for o in steps(f, [pc]))


def test_magcache_calibration_output_is_read():
    from unicache_lib.reuse.peers import ratios_from_output

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print("\n[MagCache] Calibration Complete. Copy these values to MagCacheConfig(mag_ratios=...):\n[1.0, 0.9, 1.1]\n")
    assert ratios_from_output(buf.getvalue()) == [1.0, 0.9, 1.1]
    with pytest.raises(PeerUnsupported, match="printed no ratios"):
        ratios_from_output("nothing")


# (family, peer) -> the test above that tries the peer there as diffusers ships it and sees it fail the
# way the table's reason says; every refusal in the table must have one
VERIFIED_REFUSALS = {("pixart", "fastercache"): test_fastercache_refused_on_pixart_with_additional_conditions}


def test_every_refusal_is_verified():
    stated = {(fam, peer) for fam, spec in FAMILY_PEERS.items() for peer in (*spec.unsupported, *spec.unsupported_when)}
    assert stated == set(VERIFIED_REFUSALS), "add a test that runs the peer unmodified where the table refuses it"
    assert all(peer in PEERS for _, peer in stated)


@pytest.mark.parametrize("family,batch", CASES)
def test_recompute_mode_streams_the_same_statistics(family, batch):
    """mode='recompute' (issue #31: bounded-memory diffusion capture): every map is formed one row chunk at a time from
    its logits and the previous step is held as queries and keys; over three steps every record's statistics and
    adjacent-step similarities equal stats mode's (float rounding), the output is unchanged, and no map-sized
    tensor is formed (inside streamed_maps, softmax_map hands out LogitRows)."""
    from unicache_lib.gen_families import base as gb
    from unicache_lib.stats import LogitRows

    tr = tiny_transformer(family)
    kw = forward_inputs(family, tr, batch=batch, n_text=N_TEXT, n_pad=N_PAD)
    runs, outs, handed = {}, {}, {"stats": set(), "recompute": set()}
    record = DiffusionCapture._record

    def spy(cap, w, probs, *a):  # what each family's map recomputation hands the capture
        handed[cap.mode].add(type(probs[0]))
        return record(cap, w, probs, *a)

    for mode in ("stats", "recompute"):
        with warnings.catch_warnings(), torch.no_grad(), mock.patch.object(DiffusionCapture, "_record", spy):
            warnings.simplefilter("ignore")  # Sana's "not captured" warning
            with DiffusionCapture(tr, ["s"], mode=mode, query_stride=2) as cap:
                outs[mode] = []
                for step, t in enumerate((900.0, 700.0, 500.0)):
                    cap.on_step_begin(step, t)
                    outs[mode].append(tr(**{**kw, "timestep": kw["timestep"] * 0 + t})[0])
                    cap.on_step_end(step, t)
        runs[mode] = {(r.layer, r.part, r.step): r for r in cap.result}
    assert all(torch.equal(a, b) for a, b in zip(outs["stats"], outs["recompute"]))
    assert handed == {"stats": {torch.Tensor}, "recompute": {LogitRows}}  # streamed: no map was formed whole
    assert set(runs["stats"]) == set(runs["recompute"]) and len(runs["stats"]) >= 3
    for key, r in runs["stats"].items():
        q = runs["recompute"][key]
        assert set(q.data) == set(r.data)
        for name, v in r.data.items():
            assert torch.allclose(q.data[name], v, atol=2e-5, rtol=1e-4, equal_nan=True), (key, name)
    assert any(torch.isfinite(r.data["sim_prev_all"]).all() for r in runs["recompute"].values())  # steps 1, 2 compared
    assert isinstance(gb.softmax_map(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)), torch.Tensor)  # outside: formed
    with gb.streamed_maps():
        assert isinstance(gb.softmax_map(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))[0], LogitRows)


def test_a_family_registered_from_one_file_brings_its_tiny_model_and_passes_the_capture_checks():
    """Adding a generator family is its adapter file (plus its EXPECT line here): the adapter carries its tiny config
    and inputs, so tiny_configs() finds it and the suite's capture checks run on it: outputs unchanged under capture,
    maps equal to the softmax of what its processors hand sdpa, streamed statistics equal to stats mode's."""
    from diffusers import PixArtTransformer2DModel

    from unicache_lib.gen_families import register as register_gen
    from unicache_lib.gen_families.pixart import PixArt
    from unicache_lib.zoo.builders.tiny_random import tiny_configs

    class MyTransformer(PixArtTransformer2DModel):  # a fork's transformer class
        pass

    @register_gen
    class MyPixArt(PixArt):  # unicache_lib/gen_families/my_pixart.py in a fork
        name, key = "my-pixart", "my_pixart"
        tiny = {"my_pixart": (MyTransformer, dict(PixArt.tiny["pixart"][1], num_layers=3))}
        transformer_classes = ("MyTransformer",)
        pipeline_classes = ()

    try:
        assert "my_pixart" in tiny_configs() and "my_pixart" not in TINY  # found from the registry, not a table
        tr = tiny_transformer("my_pixart")
        assert gen_family_of(tr).name == "my-pixart"  # the capture below runs through the new adapter
        kw = forward_inputs("my_pixart", tr, batch=2, n_text=N_TEXT, n_pad=N_PAD)
        truth = _processor_maps(tr, kw)
        with torch.no_grad():
            plain = tr(**kw)[0]
            recs = {}
            for mode in ("full", "recompute"):
                with DiffusionCapture(tr, ["s"], mode=mode) as cap:
                    assert torch.equal(tr(**kw)[0], plain)
                recs[mode] = {(r.layer, r.part): r for r in cap.result}
        assert len(recs["full"]) == 6  # 3 blocks x (self, cross)
        for key, r in recs["full"].items():
            assert float((r.probs - truth[_site_of(tr, r)][1]).abs().max()) <= 1e-5
            for name, v in recs["recompute"][key].data.items():
                assert torch.allclose(v, r.data[name], atol=2e-5, rtol=1e-4, equal_nan=True), (key, name)
    finally:
        GEN_FAMILIES.pop("my-pixart")
    assert "my_pixart" not in tiny_configs()


@pytest.mark.parametrize("family,batch", CASES)
def test_stats_stride_samples_the_same_rows_in_both_modes_and_says_so(family, batch):
    """stats_stride=2: the formed map (stats) and the streamed one (recompute) give the same estimates from the same
    rows, over two steps (the adjacent similarities too); every record says it is sampled and holds no word map;
    mode 'full' refuses the option."""
    tr = tiny_transformer(family)
    kw = forward_inputs(family, tr, batch=batch, n_text=N_TEXT, n_pad=N_PAD)
    from unicache_lib.core.errors import InputError

    with pytest.raises(InputError, match="query_stride"):
        DiffusionCapture(tr, ["s"], mode="full", stats_stride=2)
    runs = {}
    for mode in ("stats", "recompute"):
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            with DiffusionCapture(tr, ["s"], mode=mode, stats_stride=2) as cap:
                for step, t in enumerate((900.0, 700.0)):
                    cap.on_step_begin(step, t)
                    tr(**{**kw, "timestep": kw["timestep"] * 0 + t})
                    cap.on_step_end(step, t)
        runs[mode] = {(r.layer, r.part, r.step): r for r in cap.result}
    assert set(runs["stats"]) == set(runs["recompute"]) and runs["stats"]
    for key, r in runs["stats"].items():
        q = runs["recompute"][key]
        assert r.meta["stats_stride"] == q.meta["stats_stride"] == 2 and "word_map" not in r.data
        for name, v in r.data.items():
            assert torch.allclose(q.data[name], v, atol=2e-5, rtol=1e-4, equal_nan=True), (key, name)


@pytest.mark.parametrize("family", list(TINY))
def test_stats_stride_is_the_statistics_of_every_kth_row_of_the_exact_map(family):
    """stats_stride=3 on one forward: each statistic equals step_statistics of every third image row and every
    third text row (from the second) of the exact map (captured in mode 'full' from the same forward), each weighted by the rows it
    stands for, under spans written out independently of the adapter; and it is an estimate: on the tiny models
    some statistic differs from the exact one."""
    tr, kw, _, _, cap, _ = _run(family, 2)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with DiffusionCapture(tr, ["s"], mode="stats", stats_stride=3) as sampled:
            tr(**kw)
    exact = {(r.layer, r.part): r for r in cap.result}
    assert {(r.layer, r.part) for r in sampled.result} == set(exact)
    differs = False
    for r in sampled.result:
        e = exact[(r.layer, r.part)]
        qk, kk, kreal = _spans(e, family)
        # every third row of each kind, from the second (or the middle of a kind of fewer than three rows)
        picks = [np.flatnonzero(qk == kind) for kind in (IMAGE, TEXT)]
        rows = np.sort(np.concatenate([idx[min(1, (len(idx) - 1) // 2)::3] for idx in picks]))
        n = {kind: (qk == kind).sum() / (qk[rows] == kind).sum() for kind in (IMAGE, TEXT) if (qk == kind).any()}
        want = step_statistics(e.probs[:, rows], qk[rows], kk, kreal, q_weights=[n[x] for x in qk[rows]])
        full = step_statistics(e.probs, qk, kk, kreal)
        for k in ("blocks", "block_entropy", "row_entropy", "max_weight", "text_share", "text_entropy", "head_sim", "variance"):
            assert torch.allclose(r.data[k], want[k], atol=1e-5, equal_nan=True), (r.layer, r.part, k)
            differs |= not torch.allclose(r.data[k], full[k], atol=1e-4, equal_nan=True)
    assert differs
