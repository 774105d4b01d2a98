"""Cross-step reuse policies and diffusers' caches on every generator family (tiny random transformers).

A sampling run is simulated: the transformer is called for ``N`` steps with a decreasing timestep (1000 ->
167), the sample moved a little by each step's output, and the callbacks' ``on_step_begin`` /
``on_step_end`` around each call. ``N = 6``: the smallest budget at which every method would skip at
its own settings (the static schedule reuses only in the last third; TaylorSeer computes the first 3
steps in full; PAB and FasterCache skip only inside their timestep windows).
"""
import contextlib
import io
import logging
import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.cache import AttentionCallCounter, attention_modules, module_kind
from unicache_lib.reuse.peers import (FAMILY_ALIASES, FAMILY_PEERS, PEERS, DiffusersCache, PeerUnsupported,
                                      calibrate_magcache, family_of)
from unicache_lib.reuse.policies.base import ReusePolicy
from unicache_lib.zoo.tiny_random import TINY, forward_inputs, tiny_transformer

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
    ns.modules = attention_modules(tr)
    ns.kinds = {n: module_kind(m) for n, m in ns.modules.items()}
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
    assert family_of(f.tr) == FAMILY_ALIASES.get(f.family, f.family)
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
    assert sorted(set(seen)) == sorted(attention_modules(tr)) and len(seen) == 2 * 4
    assert {"transformer_blocks.0.attn", "single_transformer_blocks.0.attn"} <= set(seen)


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
    from diffusers.hooks import (FasterCacheConfig, FirstBlockCacheConfig, PyramidAttentionBroadcastConfig,
                                 TaylorSeerCacheConfig, apply_faster_cache, apply_first_block_cache,
                                 apply_pyramid_attention_broadcast, apply_taylorseer_cache)
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
