"""One shared suite over every cross-step reuse policy, and diffusers' caches as peers."""
import numpy as np
import pandas as pd
import pytest
import torch

from unicache_lib.gen_families import gen_family_of
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.cache import AttentionCallCounter
from unicache_lib.reuse.flops import TransformerFlops
from unicache_lib.reuse.peers import FAMILY_PEERS, PEERS, DiffusersCache, PeerUnsupported, magcache_ratios
from unicache_lib.runtime.loaders import load_generator
from unicache_lib.runtime.sampling import sample

PROMPTS = ["a red circle on the left", "a blue square at the top"]


@pytest.fixture(scope="module", params=["tiny-mmdit", "tiny-pixart"])
def gen(request):
    g = load_generator(request.param)
    g.ref = sample(g, PROMPTS, 8, seed=0)
    return g


def _modules(gen):
    return gen_family_of(gen.transformer).modules(gen.transformer)


def _clean(gen):
    return all(type(m.processor).__name__.endswith("Processor2_0") for m in _modules(gen).values())


@pytest.mark.parametrize("name", sorted(REUSE_POLICIES))
def test_reuse_policy_contract(gen, name):
    runs = []
    for _ in range(2):
        with ReuseCache(gen.transformer, REUSE_POLICIES[name](), 8) as rc:
            runs.append(sample(gen, PROMPTS, 8, seed=0, callbacks=[rc]))
        assert 0 < rc.computed_fraction <= 1
        assert rc.calls == 8 * len(_modules(gen))
    assert torch.equal(runs[0], runs[1])  # deterministic
    assert _clean(gen)
    if name == "none":
        assert torch.equal(runs[0], gen.ref) and rc.computed_fraction == 1
    if name in ("every_2",):
        assert rc.computed_fraction < 1 and (runs[0] - gen.ref).abs().max() > 0
    if name == "text_side" and gen.family == "pixart":  # text K/V never change: reuse is exact
        assert torch.equal(runs[0], gen.ref)


def test_reuse_restores_processors_on_error(gen):
    with pytest.raises(RuntimeError, match="boom"):
        with ReuseCache(gen.transformer, REUSE_POLICIES["every_2"](), 8):
            raise RuntimeError("boom")
    assert _clean(gen)


HELD_OUT = ["a green triangle at the bottom", "a yellow circle in the centre"]  # MagCache calibration only


@pytest.mark.parametrize("kind", PEERS)
def test_diffusers_peers_run_skip_work_or_say_why(gen, kind):
    steps = 20  # FirstBlockCache's threshold skips nothing on PixArt in 8 steps
    ratios = magcache_ratios(gen, HELD_OUT, steps) if kind == "magcache" else None
    if kind == "magcache":
        assert len(ratios) == steps and all(r > 0 for r in ratios)
    full_rows = steps * len(_modules(gen)) * 2 * len(PROMPTS)  # steps x modules x CFG batch
    try:
        with DiffusersCache(gen, kind, steps, calibration=ratios) as pc, AttentionCallCounter(gen.transformer) as counter, \
                TransformerFlops(gen.transformer) as fl:
            out = sample(gen, PROMPTS, steps, seed=0, callbacks=[pc])
    except PeerUnsupported as e:  # only where the family table refuses it, with its reason
        assert str(e) == FAMILY_PEERS[gen.family].unsupported[kind]
        return
    assert out.shape == gen.ref.shape and out.isfinite().all()
    assert 0 < counter.rows < full_rows  # it computed less than everything
    # hooks are gone afterwards: the plain model gives the uncached images, computing everything
    with AttentionCallCounter(gen.transformer) as plain, TransformerFlops(gen.transformer) as plain_fl:
        ref = sample(gen, PROMPTS, steps, seed=0)
    assert plain.rows == full_rows
    assert 0 < fl.flops < plain_fl.flops  # whole-transformer FLOPs show the skipped work too
    assert (out - ref).abs().max() > 0  # skipping changed the image a little
    assert torch.equal(sample(gen, PROMPTS, 8, seed=0), gen.ref)


def test_counter_counts_half_batches_half(gen):
    with AttentionCallCounter(gen.transformer) as c:
        sample(gen, PROMPTS, 2, guidance=1.0, seed=0)  # no CFG: every call carries half the rows
    n_mod = len(_modules(gen))
    assert c.calls == 2 * n_mod and c.rows == 2 * n_mod * len(PROMPTS)


def test_magcache_calibration_must_be_held_out(gen):
    from unicache_lib.reuse.evaluate import methods_for

    with pytest.raises(ValueError, match="held-out prompts"):
        methods_for(gen, 4, 3.0, PROMPTS[:1], peers=("magcache",), scored_prompts=PROMPTS)


# ---- step-level reuse: skipping whole transformer calls ----------------------------------------------------
from unicache_lib.reuse.policies.step_skip import StepSkip, extrapolate, step_schedule  # noqa: E402


def _block_calls(gen):
    """A counter of the transformer's real computations: calls of its first block."""
    n = [0]
    blocks = gen.transformer.transformer_blocks
    h = blocks[0].register_forward_pre_hook(lambda *a: n.__setitem__(0, n[0] + 1))
    return n, h


def _own_forward(module):
    """The module's forward is its class's own (diffusers' hooks, once removed, leave that bound method
    as an instance attribute: that counts as restored too)."""
    return getattr(module.forward, "__func__", None) is type(module).forward


def test_step_schedule_relative_to_n_steps():
    for n in range(1, 41):
        s = step_schedule(n, 0.2, 0.1, 3)
        assert len(s) == n and s[0] and s[-1]
    assert step_schedule(20, 0.2, 0.1, 1) == [True] * 20
    assert sum(step_schedule(20, 0.2, 0.1, 3)) < 20
    with pytest.raises(ValueError, match="stride"):
        step_schedule(20, 0.2, 0.1, 0)


def test_step_skip_really_skips_transformer_calls(gen):
    pol = StepSkip()
    n, h = _block_calls(gen)
    try:
        with ReuseCache(gen.transformer, pol, 20) as rc:
            out = sample(gen, PROMPTS, 20, seed=0, callbacks=[rc])
    finally:
        h.remove()
    want = sum(pol.schedule(20))
    assert n[0] == rc.forward_computed == want < 20  # the work saved is work not done
    assert rc.forward_calls == 20 and rc.computed_fraction == want / 20
    assert out.isfinite().all() and _own_forward(gen.transformer)


@pytest.mark.parametrize("policy", ["step_skip", "every_2"])
def test_a_run_with_another_step_count_than_the_schedule_is_refused(gen, policy):
    """ReuseCache(n_steps=20) sampled with 10 steps would reuse nothing it planned to (computed 1.0), and a 10-step
    plan on 20 steps would reuse from the wrong step: both refused, naming the step counts and the fix."""
    make = (lambda n: ReuseCache(gen.transformer, StepSkip(), n)) if policy == "step_skip" else \
        (lambda n: ReuseCache(gen.transformer, REUSE_POLICIES["every_2"](), n))
    with pytest.raises(ValueError, match=r"built for n_steps=6 but the run had 3 steps.*n_steps=3"):
        with make(6) as rc:
            sample(gen, PROMPTS[:1], 3, seed=0, callbacks=[rc])
    with pytest.raises(ValueError, match=r"built for n_steps=3 but the run reached step 3"):
        with make(3) as rc:
            sample(gen, PROMPTS[:1], 6, seed=0, callbacks=[rc])
    assert _own_forward(gen.transformer)  # restored after either refusal
    with make(3) as rc:  # the fix: the same step count
        sample(gen, PROMPTS[:1], 3, seed=0, callbacks=[rc])


def test_step_skip_computing_every_step_is_exact(gen):
    with ReuseCache(gen.transformer, StepSkip(head=0.5, tail=0.5), 8) as rc:  # both ends computed: no step between
        out = sample(gen, PROMPTS, 8, seed=0, callbacks=[rc])
    assert torch.equal(out, gen.ref) and rc.computed_fraction == 1


@pytest.mark.parametrize("n_steps", [2, 3, 4])
def test_step_skip_smoke_few_steps(gen, n_steps):
    with ReuseCache(gen.transformer, StepSkip(), n_steps) as rc:
        out = sample(gen, PROMPTS, n_steps, seed=0, callbacks=[rc])
    assert out.isfinite().all() and 0 < rc.computed_fraction <= 1


class _Linear(torch.nn.Module):
    """A fake transformer whose output is ``a + b * t**2`` (quadratic in the timestep), in any of the
    three output forms."""

    def __init__(self, form):
        super().__init__()
        self.form, self.calls = form, 0

    def forward(self, hidden_states, timestep, return_dict=True):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput

        self.calls += 1
        out = hidden_states + 0.5 * timestep.view(-1, 1) ** 2
        if self.form == "tensor":
            return out
        if self.form == "tuple":
            return (out, "extra")
        return Transformer2DModelOutput(sample=out)


@pytest.mark.parametrize("form", ["tensor", "tuple", "object"])
@pytest.mark.parametrize("order", [1, 2])
def test_step_skip_extrapolates_as_stated(form, order):
    """Steps 0..2 computed, step 3 skipped: the output is the damped extrapolation of the computed ones."""
    tr = _Linear(form)
    pol = StepSkip(head=0.6, tail=0.2, stride=5, weight=0.5, order=order)  # 5 steps: C C C . C
    assert pol.schedule(5) == [True, True, True, False, True]
    rc = ReuseCache(tr, pol, 5)
    x = torch.arange(6.0).view(2, 3)
    ts = [9.0, 7.0, 4.0, 2.0, 1.0]
    outs = []
    with rc:
        for i, t in enumerate(ts):
            rc.on_step_begin(i, t)
            o = tr(hidden_states=x, timestep=torch.full((2,), t))
            outs.append(o)
    assert tr.calls == 4 and rc.forward_computed == 4
    got = outs[3] if form == "tensor" else outs[3][0]
    if form == "tuple":
        assert outs[3][1] == "extra"
    if form == "object":
        assert torch.equal(got, outs[3].sample)
    f = lambda t: x + 0.5 * t**2  # noqa: E731
    w = 0.5
    if order == 1:  # out = o1 + w (o1 - o0) (t - t1) / (t1 - t0)
        want = f(4.0) + w * (f(4.0) - f(7.0)) * (2.0 - 4.0) / (4.0 - 7.0)
    else:  # the quadratic through three points is exact on a quadratic: damped towards it
        want = f(4.0) + w * (f(2.0) - f(4.0))
    assert torch.allclose(got, want, atol=1e-5)
    assert _own_forward(tr)


def test_extrapolate_checks_its_points():
    o = torch.ones(2)
    with pytest.raises(ValueError, match=">= 2 points"):
        extrapolate([1.0], [o], 0.5, 0.5)
    with pytest.raises(ValueError, match="share a timestep"):
        extrapolate([1.0, 1.0], [o, o], 0.5, 0.5)


def test_step_skip_restores_forward_on_error(gen):
    class Boom(StepSkip):
        def decide(self, step, n_steps, similarity, key="transformer"):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with ReuseCache(gen.transformer, Boom(), 4) as rc:
            sample(gen, PROMPTS, 4, seed=0, callbacks=[rc])
    assert _own_forward(gen.transformer)
    assert torch.equal(sample(gen, PROMPTS, 8, seed=0), gen.ref)


# ---- whole-transformer FLOPs -------------------------------------------------------------------------------
def test_flops_match_a_hand_count():
    from unicache_lib.reuse.flops import TransformerFlops

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 16)

        def forward(self, x):  # x [B, S, 8] -> 4 heads of 4 over S tokens
            q = self.proj(x).unflatten(-1, (4, 4)).transpose(1, 2)  # [B, 4, S, 4]
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    m = Tiny()
    B, S = 2, 5
    with TransformerFlops(m) as fl, torch.no_grad():
        m(torch.randn(B, S, 8))
        m(torch.randn(B, S, 8))
    linear = 2 * B * S * 8 * 16
    sdpa = 2 * (2 * B * 4 * S * S * 4)  # q k^T and p v, 2 flops per multiply-add
    assert fl.calls == 2 and fl.per_call == [linear + sdpa] * 2 and fl.flops == 2 * (linear + sdpa)


def test_run_reuse_flops_and_fewer_step_control(gen):
    from unicache_lib.reuse.control import control_psnr_at, control_table
    from unicache_lib.reuse.evaluate import run_reuse
    from unicache_lib.reuse.control import fewer_steps_methods

    steps = 6
    methods = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), steps),
               "every_2": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["every_2"](), steps),
               "step_skip": lambda: ReuseCache(gen.transformer, StepSkip(), steps)} | fewer_steps_methods([3, 5])
    objs = [{"colour": "red", "shape": "circle", "position": "left"}, {"colour": "blue", "shape": "square", "position": "top"}]
    df = run_reuse(gen, methods, PROMPTS, objs, steps, 3.0, 0, timing_prompts=1, repeats=2, progress=False)
    assert df.loc["none", "flops"] == 1.0 and df.loc["none", "computed"] == 1.0
    assert df.loc["every_2", "flops"] < 1 and df.loc["every_2", "computed"] < 1  # attention skipped, MLPs not
    skip = sum(StepSkip().schedule(steps)) / steps
    assert df.loc["step_skip", "flops"] == pytest.approx(skip) and df.loc["step_skip", "computed"] == pytest.approx(skip)
    assert df.loc["steps:3", "flops"] == pytest.approx(0.5) and df.loc["steps:5", "flops"] == pytest.approx(5 / 6)
    assert df.loc["every_2", "flops"] > df.loc["every_2", "computed"]  # attention is only part of the FLOPs
    # the control interpolated at its own points is itself; in between, linear per prompt
    ctrl = df.loc[["steps:3", "steps:5"]]
    # (wall-clock speed-ups of 2 repeats may come out in either order on a busy machine; the flops are counted)
    assert np.allclose(control_psnr_at(ctrl, float(ctrl.loc["steps:3", "flops"]), "flops"), ctrl.loc["steps:3", "psnr_per_prompt"])
    mid = control_psnr_at(ctrl, 2 / 3, "flops")
    assert np.allclose(mid, 0.5 * (ctrl.loc["steps:3", "psnr_per_prompt"] + ctrl.loc["steps:5", "psnr_per_prompt"]))
    with pytest.raises(ValueError, match="outside the fewer-step control's range"):
        control_psnr_at(ctrl, 0.1, "flops")
    tab = control_table(df)
    assert "steps:3" not in tab.index and {"none", "step_skip"} <= set(tab.index)
    assert np.isnan(tab.loc["none", "margin_flops"]) and "outside" in tab.loc["none", "ctrl_note"]  # 1.0 > 5/6
    assert np.isfinite(tab.loc["step_skip", "margin_flops"])


def _sweep(speedups, flops=None):
    steps = [8, 9, 10]
    return pd.DataFrame({"speedup": speedups, "flops": flops or [n / 20 for n in steps],
                         "psnr_per_prompt": [np.array([30.0 + n, 31.0 + n]) for n in steps],
                         "psnr": [30.5 + n for n in steps]}, index=[f"steps:{n}" for n in steps])


def test_a_scrambled_control_sweep_is_refused_naming_the_rows():
    """PixArt's timings on a loaded machine: 8 steps 2.27x, 9 steps 2.68x, 10 steps 1.79x. Speed-up must fall as the
    step count rises; a margin read off this sweep would be read off a curve that does not exist."""
    from unicache_lib.reuse.control import control_psnr_at, control_table

    scrambled = _sweep([2.27, 2.68, 1.79])
    with pytest.raises(ValueError, match=r"does not fall with the step count \(8 steps 2.27 vs 9 steps 2.68\).*re-time"):
        control_psnr_at(scrambled, 2.0, "speedup")
    with pytest.raises(ValueError, match="does not rise with the step count"):
        control_psnr_at(_sweep([2.6, 2.4, 2.2], flops=[0.4, 0.45, 0.45]), 0.42, "flops")
    assert control_psnr_at(_sweep([2.6, 2.4, 2.2]), 2.4, "speedup") == pytest.approx([39.0, 40.0])  # monotone: read
    df = pd.concat([scrambled, pd.DataFrame({"speedup": [2.0], "flops": [0.45], "psnr": [45.0],
                                             "psnr_per_prompt": [np.array([45.0, 45.0])]}, index=["step_skip"])])
    tab = control_table(df)
    assert np.isnan(tab.loc["step_skip", "margin_speedup"]) and "not monotone" in tab.loc["step_skip", "ctrl_note"]
    assert np.isfinite(tab.loc["step_skip", "margin_flops"])  # the counted FLOPs are monotone: that margin stands


def test_fewer_steps_curve(gen):
    from unicache_lib.reuse.control import fewer_steps_curve
    from unicache_lib.runtime.sampling import to_uint8

    ref = to_uint8(sample(gen, PROMPTS, 4, seed=0))
    df = fewer_steps_curve(gen, PROMPTS, ref, [2, 3, 4], 3.0, 0, full_steps=4, repeats=2, timing_prompts=1)
    assert list(df.index) == [2, 3, 4]
    assert df.loc[4, "psnr"] == 100.0 and df.loc[2, "psnr"] < 100  # the full run is the reference itself
    assert np.allclose(df["flops"], [0.5, 0.75, 1.0])
    assert {"speedup", "speedup_lo", "speedup_hi"} <= set(df.columns)
    assert df.loc[2, "psnr_per_prompt"].shape == (len(PROMPTS),)


def _table():
    """A run_reuse-like table: ours fast and good, a slower better peer, a slower worse peer, a faster worse peer."""
    import pandas as pd

    rng = np.random.default_rng(0)
    base = rng.normal(0, 0.3, 16)

    def row(psnr, speed, flops, t):
        return {"psnr": psnr, "psnr_per_prompt": psnr + base, "speedup": speed, "flops": flops,
                "seconds": t * (1 + 0.01 * rng.normal(size=10))}
    return pd.DataFrame({"ours": row(45.0, 2.0, 0.45, 1.0), "mild": row(50.0, 1.5, 0.6, 1.33),
                         "peer_slow_good": row(48.0, 1.2, 0.8, 1.66), "peer_slow_bad": row(40.0, 1.3, 0.7, 1.54),
                         "peer_fast": row(30.0, 3.0, 0.3, 0.66), "broken": {"psnr": np.nan}}).T


def test_pareto_check_picks_the_best_of_ours_that_saves_as_much():
    from unicache_lib.reuse.evaluate import pareto_check, versus

    df = _table()
    p = pareto_check(df, ["ours", "mild"], ["peer_slow_good", "peer_slow_bad", "peer_fast", "broken", "absent"])
    assert list(p.index) == ["peer_slow_good", "peer_slow_bad", "peer_fast"]  # what did not run is left out
    assert p.loc["peer_slow_good", "match"] == "mild" and p.loc["peer_slow_good", "psnr_diff"] == pytest.approx(2.0)
    assert p.loc["peer_slow_bad", "match"] == "mild"  # the better of the two that are at least as fast
    assert p.loc["peer_fast", "match"] is None and np.isnan(p.loc["peer_fast", "psnr_diff"])  # faster than all of ours
    f = pareto_check(df, ["ours"], ["peer_slow_good"], by="flops")
    assert f.loc["peer_slow_good", "psnr_diff"] == pytest.approx(-3.0)
    assert f.loc["peer_slow_good", "lo"] <= -3.0 <= f.loc["peer_slow_good", "hi"]
    with pytest.raises(ValueError, match="speedup' or 'flops"):
        pareto_check(df, ["ours"], ["peer_fast"], by="time")
    v = versus(df, "ours", ["peer_slow_bad", "peer_slow_good"])
    assert v.loc["peer_slow_bad", "dominates"] and not v.loc["peer_slow_good", "dominates"]
    assert v.loc["peer_slow_bad", "speed_ratio"] == pytest.approx(1.54, rel=0.05)


def test_worst_pareto_gap_and_worst_generator_take_the_smallest_cell():
    from unicache_lib.reuse.evaluate import pareto_check, worst_generator, worst_pareto_gap

    a, b = _table(), _table()
    b.loc["peer_slow_good", "psnr_per_prompt"] = b.loc["peer_slow_good", "psnr_per_prompt"] + 1.5  # closer on b
    tables = {"a": a, "b": b}
    pareto = {g: pareto_check(t, ["ours", "mild"], ["peer_slow_good", "peer_fast"]) for g, t in tables.items()}
    iv, worst, unmatched = worst_pareto_gap(tables, pareto)
    assert worst[:3] == ("b", "peer_slow_good", "mild") and worst[3] == pytest.approx(0.5)  # 50 - 49.5
    assert iv.value == pytest.approx(0.5) and iv.lo <= 0.5 <= iv.hi and iv.unit == "prompts"
    assert unmatched == ["peer_fast on a", "peer_fast on b"]  # faster than every setting of ours: not compared
    none = worst_pareto_gap(tables, {g: pareto_check(t, ["ours"], ["peer_fast"]) for g, t in tables.items()})
    assert none[0] is None and none[1] is None
    g = worst_generator(tables, "mild", "psnr_per_prompt", minus="peer_slow_good")
    assert g.value == pytest.approx(0.5)
    short = {"a": a, "b": b.assign(psnr_per_prompt=[np.zeros(3)] * len(b))}
    with pytest.raises(ValueError, match="same prompts"):
        worst_generator(short, "mild", "psnr_per_prompt")


def test_readings_flag_a_bit_identical_method_as_a_no_op():
    import pandas as pd

    from unicache_lib.reuse.evaluate import PSNR_CAP, readings

    df = pd.DataFrame({"none": {"psnr_per_prompt": np.full(4, PSNR_CAP), "flops": 1.0, "note": ""},
                       "text_side": {"psnr_per_prompt": np.full(4, PSNR_CAP), "flops": 0.924, "note": ""},
                       "step_skip": {"psnr_per_prompt": np.array([45.0, 100.0, 44.0, 46.0]), "flops": 0.45, "note": ""},
                       "steps:8": {"psnr_per_prompt": np.full(4, 39.0), "flops": 0.4, "note": ""},
                       "diffusers:x": {"psnr_per_prompt": None, "flops": np.nan, "note": "unsupported here"}}).T
    r = readings(df)
    assert r["none"] == "reference" and r["steps:8"].startswith("control")
    assert r["text_side"].startswith("no-op on this family") and "8% of FLOPs" in r["text_side"]
    assert r["none"] == "reference"
    idle = readings(df.assign(flops=1.0))  # identical with every FLOP run: a schedule that skipped nothing
    assert idle["text_side"].startswith("reuses nothing") and "bit-identical" in idle["text_side"]
    assert r["step_skip"] == ""  # one identical prompt is not a no-op
    assert r["diffusers:x"] == "did not run: unsupported here"


def test_gallery_leaves_out_a_cache_the_model_cannot_run(gen):
    """The reuse lesson's first picture: every method that runs is drawn with its steps; one that cannot run on this
    family is left out with a warning naming it (as run_reuse leaves it out of its table), not a crash."""
    from unicache_lib.reuse.evaluate import gallery

    class Unsupported:
        def __enter__(self):
            raise PeerUnsupported("no such block on this family (test)")

        def __exit__(self, *exc):
            return False

    methods = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), 4),
               "step_skip": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["step_skip"](), 4),
               "diffusers:broken": Unsupported}
    with pytest.warns(UserWarning, match="diffusers:broken left out of the picture: no such block"):
        G = gallery(gen, methods, "a red circle on the left", steps=4)
    assert list(G) == ["none", "step_skip"] and G["none"]["psnr"] == 100.0
    assert G["none"]["schedule"] == [True] * 4 and G["step_skip"]["schedule"] == REUSE_POLICIES["step_skip"]().schedule(4)


def test_step_skip_hook_matches_reuse_cache_on_the_library_sampler(gen):
    """The diffusers hook on a tiny generator sampled by the library loop: the images of ReuseCache + step_skip
    (torch.equal) with the same transformer calls, twice in a row (a new run is told by its rising timestep)."""
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip

    with ReuseCache(gen.transformer, StepSkip(), 20) as rc:
        ref = sample(gen, PROMPTS, 20, seed=0, callbacks=[rc])
    hook = apply_step_skip(gen.transformer, StepSkipConfig(num_inference_steps=20))
    try:
        runs = [sample(gen, PROMPTS, 20, seed=0) for _ in range(2)]
    finally:
        remove_step_skip(gen.transformer)
    assert torch.equal(runs[0], ref) and torch.equal(runs[1], ref)
    assert hook.computed == 2 * rc.forward_computed == 2 * 9 and hook.calls == 2 * 20
    assert StepSkipConfig(20).pattern() == "CC.C..C..C..C..C..CC"



def test_one_driver_of_step_reuse_per_transformer(gen):
    """step_skip's diffusers hook and a step-level ReuseCache register through one helper with one duplicate check
    (core.hooks.add_model_hook): neither lands on a transformer the other already drives, under either name."""
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip

    apply_step_skip(gen.transformer, StepSkipConfig(20))
    try:
        with pytest.raises(ValueError, match="a hook named 'step_skip' is already on this"):
            with ReuseCache(gen.transformer, StepSkip(), 20):
                pass
        with pytest.raises(ValueError, match="already applied; remove_step_skip"):
            apply_step_skip(gen.transformer, StepSkipConfig(20))
    finally:
        remove_step_skip(gen.transformer)
    with ReuseCache(gen.transformer, StepSkip(), 20):
        with pytest.raises(ValueError, match="a hook named 'unicache_reuse' is already on this"):
            apply_step_skip(gen.transformer, StepSkipConfig(20))
    assert not remove_step_skip(gen.transformer)

def test_calibrate_step_skip_picks_from_its_grid(gen):
    from unicache_lib.reuse.diffusers_hook import calibrate_step_skip
    from unicache_lib.runtime.sampling import to_uint8

    cfg, rows = calibrate_step_skip(lambda: to_uint8(sample(gen, PROMPTS, 8, seed=0)), to_uint8(gen.ref), 8,
                                    gen.transformer, strides=(2, 3), weights=(0.0, 0.5))
    assert len(rows) == 4 and {(r["stride"], r["weight"]) for r in rows} == {(2, 0.0), (2, 0.5), (3, 0.0), (3, 0.5)}
    best = max(r["psnr"] for r in rows)
    chosen = next(r for r in rows if (r["stride"], r["weight"]) == (cfg.stride, cfg.weight))
    assert chosen["psnr"] >= best - 1.0 and all(0 < r["computed"] < 1 for r in rows)
    assert cfg.num_inference_steps == 8


def test_step_skip_hook_refuses_a_module_without_timestep():
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip

    with pytest.raises(ValueError, match="takes no `timestep`"):
        apply_step_skip(torch.nn.Linear(2, 2), StepSkipConfig(num_inference_steps=4))
    with pytest.raises(ValueError, match="num_inference_steps must be >= 1"):
        StepSkipConfig(num_inference_steps=0)


def test_step_skip_hook_warns_after_a_run_shorter_than_its_schedule(gen):
    """A 20-step schedule sampled with 10 steps extrapolated steps it meant to compute: said, naming the count."""
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip

    apply_step_skip(gen.transformer, StepSkipConfig(num_inference_steps=20))
    try:
        sample(gen, PROMPTS[:1], 10, seed=0)
        with pytest.warns(UserWarning, match=r"the run had 10 steps.*StepSkipConfig\(num_inference_steps=10\)"):
            sample(gen, PROMPTS[:1], 10, seed=0)  # the rising timestep of the next run ends the short one
    finally:
        with pytest.warns(UserWarning, match="the run had 10 steps"):
            remove_step_skip(gen.transformer)


def test_peer_options_override_the_config_and_lite_taylorseer_skips_blocks(gen):
    """DiffusersCache(options=...) applies fields to the diffusers config (TaylorSeer at another interval and order, in
    lite mode: whole blocks skipped, the output projection predicted) and refuses an unknown field naming the fields;
    lite mode on SD3's layout (the last block returns None for the text stream) is refused with the reason."""
    opts = {"use_lite_mode": True, "cache_interval": 6, "max_order": 2}
    dc = DiffusersCache(gen, "taylorseer", 20, options={"cache_intervl": 6})
    with pytest.raises(ValueError, match="no field 'cache_intervl'.*cache_interval"):
        dc.config()
    if FAMILY_PEERS[gen.family].tail_passes_encoder:
        with pytest.raises(PeerUnsupported, match="lite mode .* returns None"):
            DiffusersCache(gen, "taylorseer", 20, options=opts).config()
        return
    cfg = DiffusersCache(gen, "taylorseer", 20, options=opts).config()
    assert (cfg.cache_interval, cfg.max_order, cfg.use_lite_mode) == (6, 2, True)
    with TransformerFlops(gen.transformer) as full:
        sample(gen, PROMPTS, 20, seed=0)
    with DiffusersCache(gen, "taylorseer", 20, options=opts) as pc, TransformerFlops(gen.transformer) as fl:
        out = sample(gen, PROMPTS, 20, seed=0, callbacks=[pc])
    assert out.isfinite().all() and fl.flops < 0.5 * full.flops  # 3 warm-up steps, then one in 6 computed


def test_step_skip_config_is_a_plain_config_of_step_skip_s_fields():
    """One set of fields: the diffusers hook's config is a plain dataclass holding the step count and the policy's
    fields, with the policy's defaults and checks; the hook drives the policy it makes."""
    from dataclasses import asdict, fields

    from unicache_lib.reuse.diffusers_hook import StepSkipConfig

    cfg = StepSkipConfig(20, stride=2)
    assert [f.name for f in fields(StepSkipConfig)] == ["num_inference_steps"] + [f.name for f in fields(StepSkip)]
    assert not isinstance(cfg, StepSkip) and cfg.num_inference_steps == 20
    assert isinstance(cfg.policy(), StepSkip) and asdict(cfg.policy()) == asdict(StepSkip(stride=2))
    assert [(f.name, getattr(StepSkipConfig(20), f.name)) for f in fields(StepSkip)] == \
        [(f.name, getattr(StepSkip(), f.name)) for f in fields(StepSkip)]
    assert cfg.schedule(20) == StepSkip(stride=2).schedule(20) and repr(cfg).startswith("StepSkipConfig(num_inference_steps=20, head=")
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        StepSkipConfig(20, order=3)  # StepSkip's own check
