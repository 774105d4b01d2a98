"""One shared suite over every head scorer, plus exact masking and physical pruning; the generator half on
the tiny layout and on tiny random diffusers pipelines of every kind (SD3/SD3.5, PixArt-alpha/-sigma, Flux dev/schnell,
Sana) and HunyuanDiT."""
import numpy as np
import pytest
import torch

from unicache_lib.core.errors import UnsupportedError
from unicache_lib.pruning import SCORERS, HeadMask, HeadSpace, ScoringContext, prune_physically
from unicache_lib.quality import psnr, ssim


@pytest.fixture(scope="module")
def vlm():
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world import samples as sample_set
    from unicache_lib.world.questions import heldout_set

    model, proc = load_understanding("tiny-llava")
    recs = capture_samples(model, proc, sample_set.load(per_type=1), progress=False).records
    qas = heldout_set(16, seed=5)
    return model, proc, recs, qas


def _ctx(model, proc, recs, qas, seed=0):
    from unicache_lib.pruning.evaluate import answer_logprobs

    space = HeadSpace.of(model)
    ids = torch.tensor(proc.tokenizer.convert_tokens_to_ids([q.answer for q in qas]))

    def loss():
        from unicache_lib.capture.runner import answer_logits

        imgs = np.stack([q.scene.uint8() for q in qas])
        return torch.nn.functional.cross_entropy(answer_logits(model, proc, [q.question for q in qas], imgs), ids)

    assert answer_logprobs(model, proc, qas[:2]).shape[0] == 2
    return ScoringContext(space, recs, [loss], seed)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_scorer_contract(vlm, name):
    model, proc, recs, qas = vlm
    ctx = _ctx(model, proc, recs, qas)
    scorer = SCORERS[name]()
    s1, s2 = scorer(ctx), scorer(ctx)
    assert s1.shape == ctx.space.shape == (4, 8)
    assert np.isfinite(s1).all()
    np.testing.assert_array_equal(s1, s2)  # deterministic
    keep = ctx.space.keep_mask(s1, 0.25)
    assert int((keep == 0).sum()) == 8 and (keep.sum(1) >= 1).all()
    # the pruned heads are the lowest scored
    assert s1[keep.numpy() == 0].max() <= s1[keep.numpy() == 1].min() + 1e-12
    if scorer.needs:
        empty = ScoringContext(ctx.space, seed=0)
        with pytest.raises(ValueError, match="needs"):
            scorer(empty)
    assert model(**_inputs(proc, qas[0])).logits.isfinite().all()  # no hook left behind by the gradient scorer
    assert not any(len(m._forward_pre_hooks) for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_random_scorer_depends_on_seed(vlm):
    model, proc, recs, qas = vlm
    r = SCORERS["random"]()
    assert not np.array_equal(r(_ctx(model, proc, recs, qas, seed=0)), r(_ctx(model, proc, recs, qas, seed=1)))


def _inputs(proc, qa):
    from unicache_lib.capture.runner import model_inputs

    return model_inputs(proc, qa.scene.uint8(), qa.question)


def test_mask_is_exact_and_physical_pruning_matches(vlm):
    import copy

    model, proc, recs, qas = vlm
    space = HeadSpace.of(model)
    inp = _inputs(proc, qas[0])
    with torch.no_grad():
        base = model(**inp).logits
        ones = space.ones()
        with HeadMask(space, ones):
            same = model(**inp).logits
        assert torch.equal(base, same)
        # a head whose value projection is zero already outputs nothing: masking it changes nothing
        m2 = copy.deepcopy(model)
        sp2 = HeadSpace.of(m2)
        u = sp2.units[1]
        sp2.modules[1].v_proj.weight[2 * u.head_dim:3 * u.head_dim] = 0
        ref = m2(**inp).logits
        mask = sp2.ones()
        mask[1, 2] = 0
        with HeadMask(sp2, mask):
            assert torch.equal(m2(**inp).logits, ref)  # exactly nothing, bit for bit
        # masking real heads changes the output, and physical pruning reproduces the mask
        keep = space.keep_mask(SCORERS["random"]()(ScoringContext(space, seed=3)), 0.3)
        with HeadMask(space, keep):
            masked = model(**inp).logits
        assert (masked - base).abs().max() > 1e-4
        m3 = copy.deepcopy(model)
        kept = prune_physically(HeadSpace.of(m3), keep)
        assert sum(kept.values()) == int(keep.sum())
        assert torch.allclose(m3(**inp).logits, masked, atol=1e-5)
        assert sum(p.numel() for p in m3.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["tiny-mmdit", "tiny-pixart"])
def test_generator_masking(name):
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample

    gen = load_generator(name)
    space = HeadSpace.of(gen.transformer)
    assert space.shape == ((4, 4) if name == "tiny-mmdit" else (8, 4))
    ref = sample(gen, ["a red circle on the left"], steps=3, seed=0)
    with HeadMask(space, space.ones()):
        assert torch.equal(sample(gen, ["a red circle on the left"], steps=3, seed=0), ref)
    keep = space.keep_mask(SCORERS["weight_norm"]()(ScoringContext(space)), 0.5)
    with HeadMask(space, keep):
        pruned = sample(gen, ["a red circle on the left"], steps=3, seed=0)
    assert (pruned - ref).abs().max() > 1e-3
    with pytest.raises(UnsupportedError, match="HeadMask"):
        prune_physically(space, keep)


def test_keep_mask_validation():
    model = torch.nn.Module()
    space = HeadSpace(model, [])
    space.units = [type("U", (), {"heads": 2})(), type("U", (), {"heads": 3})()]
    s = np.array([[0.1, 0.2, np.nan], [0.3, 0.05, 0.4]])
    keep = space.keep_mask(s, 0.4)  # 2 of 5 heads
    assert keep.tolist() == [[0, 1, 1], [1, 0, 1]]  # the two lowest; the padding slot is never pruned
    with pytest.raises(ValueError, match="fraction"):
        space.keep_mask(s, 1.0)
    with pytest.raises(ValueError, match="shape"):
        space.keep_mask(s[:, :2], 0.1)


def test_quality_metrics():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    assert np.isinf(psnr(a, a)).all() and np.allclose(ssim(a, a), 1.0)
    b = np.clip(a.astype(int) + 8, 0, 255).astype(np.uint8)
    c = np.clip(a.astype(int) + 40, 0, 255).astype(np.uint8)
    assert (psnr(b, a) > psnr(c, a)).all() and (ssim(b, a) > ssim(c, a)).all()
    with pytest.raises(ValueError, match="shapes differ"):
        psnr(a[:, :16], a)


# ---- diffusers pipeline generators (tiny random pipelines of every kind) --------------------------------
PIPE_KINDS = ["sd3", "sd3.5", "pixart-alpha", "pixart-sigma", "flux-schnell", "flux-dev", "sana", "hunyuan", "dit"]
# kind -> (units, heads), a guidance batch under guidance > 1 ([uncond | cond]; DiT [cond | uncond])
PIPE_SPACES = {"sd3": ((2, 2), True), "sd3.5": ((5, 2), True), "pixart-alpha": ((4, 2), True),
               "pixart-sigma": ((4, 2), True), "flux-schnell": ((4, 2), False), "flux-dev": ((4, 2), False),
               "sana": ((4, 2), True), "hunyuan": ((4, 2), True), "dit": ((2, 2), True)}
PROMPT = ["a red circle on the left"]


@pytest.fixture(scope="module")
def pipe_folders(tmp_path_factory):
    from unicache_lib.zoo.builders import tiny_pipelines as tp

    root = tmp_path_factory.mktemp("pruning_pipes")
    return {kind: tp.build_tiny(kind, root / kind) for kind in PIPE_KINDS}


def _pipe(pipe_folders, kind):
    from unicache_lib.runtime.loaders import load_generator

    return load_generator(pipe_folders[kind])


def _hooks(module):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


def _zeroed_heads(space, i, heads):
    """A copy of the model with the output-projection columns of ``heads`` of unit ``i`` zeroed (for
    Flux's single-stream attention: the attention columns of the block's proj_out)."""
    import copy

    from unicache_lib.pruning.heads import _out_projections, _output_weight

    m = copy.deepcopy(space.model)
    sp = HeadSpace(m, space.units)
    u, mod = sp.units[i], sp.modules[i]
    ws = [lin.weight for lin in _out_projections(mod)] or [_output_weight(m, u.name, mod)]
    with torch.no_grad():
        for w in ws:
            for h in heads:
                w[:, h * u.head_dim:(h + 1) * u.head_dim] = 0
    return m


@pytest.mark.parametrize("kind", PIPE_KINDS)
def test_pipeline_head_space_and_exact_masking(pipe_folders, kind):
    """Every family's heads (Flux double + single blocks, SD3.5's attn2, Sana's linear self-attention)
    mask exactly: masking a head equals zeroing the weights that read it; all ones changes no pixel;
    masking all heads of any one unit changes the image; physical pruning refuses."""
    from unicache_lib.pruning.evaluate import record_transformer_call
    from unicache_lib.runtime.sampling import sample

    gen = _pipe(pipe_folders, kind)
    tr = gen.transformer
    space = HeadSpace.of(tr)
    assert space.shape == PIPE_SPACES[kind][0]
    if kind.startswith("flux"):
        blocks = [u.name.split(".")[0] for u in space.units]
        assert blocks == ["transformer_blocks"] * 2 + ["single_transformer_blocks"] * 2
        assert [u.layer for u in space.units] == [0, 1, 2, 3]
    if kind == "sd3.5":
        assert [u.part for u in space.units] == ["joint", "self", "joint", "self", "joint"]
    if kind == "sana":
        assert [(u.part, u.mapped) for u in space.units] == [("cross", True), ("self", False)] * 2
        assert HeadSpace.of(tr, mapless=False).shape == (2, 2)
    else:
        assert all(u.mapped for u in space.units)

    kw, _ = record_transformer_call(gen, PROMPT, 2, 3.0, [0])
    with torch.no_grad():
        base = tr(**kw)[0]
        for i, u in enumerate(space.units):  # head 1 of each unit: mask == zeroed output columns, and it matters
            mask = space.ones()
            mask[i, 1] = 0
            with HeadMask(space, mask):
                masked = tr(**kw)[0]
            assert torch.allclose(masked, _zeroed_heads(space, i, [1])(**kw)[0], atol=1e-6), u.name
            assert (masked - base).abs().max() > 1e-5, u.name

    hooks = _hooks(tr)
    ref = sample(gen, PROMPT, steps=2, seed=0)
    with HeadMask(space, space.ones()):
        assert torch.equal(sample(gen, PROMPT, steps=2, seed=0), ref)
    for i, u in enumerate(space.units):
        mask = space.ones()
        mask[i] = 0
        with HeadMask(space, mask):
            assert (sample(gen, PROMPT, steps=2, seed=0) - ref).abs().max() > 1e-4, u.name
    assert _hooks(tr) == hooks
    with pytest.raises(UnsupportedError, match="HeadMask"):
        prune_physically(space, space.ones())


@pytest.mark.parametrize("kind", PIPE_KINDS)
def test_pipeline_gradient_scorer(pipe_folders, kind):
    """The loss closures run on the pipeline: finite losses whose gradient w.r.t. the head mask reaches
    every unit; the gradient scorer gives finite, non-constant scores; deterministic; no hook left."""
    from unicache_lib.pruning.evaluate import generation_loss_fns

    gen = _pipe(pipe_folders, kind)
    space = HeadSpace.of(gen.transformer)
    hooks = _hooks(gen.transformer)
    fns = generation_loss_fns(gen, n_batches=2, batch=2, seed=1)
    assert len(fns) == 2
    mask = space.ones().requires_grad_(True)
    with HeadMask(space, mask):
        losses = [fn() for fn in fns]
        assert all(loss.ndim == 0 and torch.isfinite(loss) for loss in losses)
        (g,) = torch.autograd.grad(sum(losses), mask)
    assert torch.isfinite(g).all() and (g.abs().sum(1) > 0).all()  # every unit
    s = SCORERS["gradient"]()(ScoringContext(space, loss_fns=fns))
    assert s.shape == space.shape and np.isfinite(s).all() and s.std() > 0
    again = generation_loss_fns(gen, n_batches=2, batch=2, seed=1)
    with torch.no_grad():
        assert [f().item() for f in again] == [f().item() for f in fns]
        assert again[0]().item() != generation_loss_fns(gen, n_batches=1, batch=2, seed=2)[0]().item()
    assert _hooks(gen.transformer) == hooks


@pytest.mark.parametrize("kind", PIPE_KINDS)
def test_pipeline_loss_is_the_pipelines_own_call(pipe_folders, kind):
    """The recorded arguments reproduce the pipeline's conditional prediction; the timestep scale is the
    pipeline's; the noising is the family's objective (PixArt: DDPM's add_noise)."""
    from diffusers import DDPMScheduler

    from unicache_lib.pruning.evaluate import flow_timestep, pipeline_loss_batches, record_transformer_call

    gen = _pipe(pipe_folders, kind)
    tr, fam = gen.transformer, gen.family
    seen = []
    h = tr.register_forward_hook(lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o.sample))
    try:
        kw, latents = record_transformer_call(gen, PROMPT * 2, 2, 3.0, [0, 1])
    finally:
        h.remove()
    cfg = PIPE_SPACES[kind][1]
    assert seen[0].shape[0] == (4 if cfg else 2) and kw["hidden_states"].shape[0] == 2
    assert latents.shape == kw["hidden_states"].shape
    cond = seen[0][:2] if fam == "dit" else seen[0][-2:]  # the conditional rows, recomputed
    with torch.no_grad():
        assert torch.allclose(tr(**kw)[0], cond, atol=1e-5)
    sched = gen.scheduler
    if gen.adapter.objective != "flow":
        assert torch.equal(kw["timestep"].float(), sched.timesteps[0].expand(2).float())
    else:  # step 0's noise level, passed as the pipeline passes it
        assert torch.allclose(kw["timestep"].float(), flow_timestep(gen, sched.sigmas[:1]).expand(2), atol=1e-4)

    (lb,) = pipeline_loss_batches(gen, n_batches=1, batch=3, seed=0)
    assert len(lb.prompts) == 3 and "hidden_states" not in lb.kwargs and "timestep" not in lb.kwargs
    if gen.adapter.objective != "flow":  # PixArt, DiT: epsilon; HunyuanDiT: v
        ddpm = DDPMScheduler.from_config(sched.config)
        assert lb.objective == {"pixart": "epsilon", "dit": "epsilon", "hunyuan": "v"}[fam]
        want = lb.noise if lb.objective == "epsilon" else ddpm.get_velocity(lb.x0, lb.noise, lb.level)
        assert torch.allclose(lb.target, want, atol=1e-5)
        assert torch.allclose(lb.xt, ddpm.add_noise(lb.x0, lb.noise, lb.level), atol=1e-5)
    else:
        assert lb.objective == "flow" and torch.equal(lb.target, lb.noise - lb.x0)
        s = lb.level.view(-1, *[1] * (lb.x0.dim() - 1))
        assert torch.allclose(lb.xt, (1 - s) * lb.x0 + s * lb.noise) and ((0 < lb.level) & (lb.level < 1)).all()
        assert torch.equal(lb.timestep, flow_timestep(gen, lb.level))
    if kind == "flux-dev":
        assert torch.equal(lb.kwargs["guidance"], torch.ones(3))
    if kind == "flux-schnell":
        assert lb.kwargs["guidance"] is None


def test_pipeline_loss_refuses_other_objectives(pipe_folders):
    from diffusers import DDPMScheduler, DPMSolverMultistepScheduler

    from unicache_lib.pruning.evaluate import generation_loss_fns

    gen = _pipe(pipe_folders, "pixart-sigma")
    gen.pipe.scheduler = DPMSolverMultistepScheduler.from_config(gen.scheduler.config, prediction_type="v_prediction")
    with pytest.raises(UnsupportedError, match=r"pixart.*'v_prediction'.*epsilon"):
        generation_loss_fns(gen)
    gen = _pipe(pipe_folders, "sd3")
    gen.pipe.scheduler = DDPMScheduler()
    with pytest.raises(UnsupportedError, match=r"sd3: .*DDPMScheduler.*not flow matching"):
        generation_loss_fns(gen)
    from unicache_lib.gen_families import GenFamily

    gen.adapter = type("Unknown", (GenFamily,), {"key": "unknown"})()  # a family whose objective is not known
    with pytest.raises(UnsupportedError, match=r"'unknown'.*no training objective"):
        generation_loss_fns(gen)
    gen = _pipe(pipe_folders, "hunyuan")
    gen.pipe.scheduler = DDPMScheduler.from_config(gen.scheduler.config, prediction_type="epsilon")
    with pytest.raises(UnsupportedError, match=r"hunyuan.*'epsilon'.*v_prediction"):
        generation_loss_fns(gen)


@pytest.mark.parametrize("kind", PIPE_KINDS)
def test_pipeline_sweep(pipe_folders, kind):
    """A 2-step sweep at one fraction on the decoded images: PSNR / SSIM vs unpruned, prompt following."""
    from unicache_lib.pruning.evaluate import sweep_generation
    from unicache_lib.world.text import prompt_set

    gen = _pipe(pipe_folders, kind)
    space = HeadSpace.of(gen.transformer)
    ps = prompt_set(2, 0, seed=0)
    scores = {"weight_norm": SCORERS["weight_norm"]()(ScoringContext(space))}
    df, ref = sweep_generation(gen, space, scores, [0.5], [p["short"] for p in ps], [p["objects"][0] for p in ps],
                               steps=2, guidance=3.0, seed=0, progress=False)
    assert ref.shape == (2, gen.image_size, gen.image_size, 3) and ref.dtype == np.uint8
    assert len(df) == 1 and df.pruned.iloc[0] == space.n_heads // 2
    row = df.iloc[0]
    assert np.isfinite(row.psnr) and row.psnr < 100 and -1 <= row.ssim < 1
    assert {"colour", "position", "shape"} <= set(df.columns) and row.n == 2


def test_statistics_scorers_refuse_mapless_units(pipe_folders):
    gen = _pipe(pipe_folders, "sana")
    space = HeadSpace.of(gen.transformer)
    with pytest.raises(ValueError, match=r"linear attention.*mapless=False"):
        SCORERS["low_variance"]()(ScoringContext(space, records=[object()]))
    assert np.isfinite(SCORERS["weight_norm"]()(ScoringContext(space))).all()


def test_hunyuan_heads_mask_exactly():
    from unicache_lib.zoo.builders.tiny_random import forward_inputs, tiny_transformer

    tr = tiny_transformer("hunyuan")
    space = HeadSpace.of(tr)
    assert space.shape == (4, 2) and {u.part for u in space.units} == {"self", "cross"}
    kw = forward_inputs("hunyuan", tr)
    with torch.no_grad():
        base = tr(**kw)[0]
        with HeadMask(space, space.ones()):
            assert torch.equal(tr(**kw)[0], base)
        for i in range(len(space.units)):
            mask = space.ones()
            mask[i, 0] = 0
            with HeadMask(space, mask):
                masked = tr(**kw)[0]
            assert torch.allclose(masked, _zeroed_heads(space, i, [0])(**kw)[0], atol=1e-6)
            assert (masked - base).abs().max() > 1e-5


def test_prompt_following_checker_at_pipeline_sizes():
    """The world's checker works on decoded images of any square size (thresholds are fractions)."""
    from unicache_lib.world.scenes import make_scene
    from unicache_lib.world.segment import score_object

    rng = np.random.default_rng(0)
    for size in (32, 512):
        for _ in range(4):
            sc = make_scene(rng, "single", size, n_objects=1, radius_range=(0.16, 0.20))
            assert score_object(sc.uint8(), sc.describe()[0]) == {"colour": True, "position": True, "shape": True}
    with pytest.raises(ValueError, match="square"):
        score_object(np.zeros((512, 256, 3), np.uint8), {"colour": "red", "shape": "circle", "position": "left"})


def test_random_heads_is_a_seeded_draw_among_the_eligible():
    from unicache_lib.pruning.downstream import random_heads

    eligible = np.zeros((4, 8), bool)
    eligible[0] = True
    a = random_heads(eligible, 3, seed=0)
    assert a.sum() == 3 and not (a & ~eligible).any()
    assert (a == random_heads(eligible, 3, seed=0)).all()
    assert any((random_heads(eligible, 3, seed=s) != a).any() for s in range(1, 5))
    with pytest.raises(ValueError, match="eligible"):
        random_heads(eligible, 9, seed=0)


def test_downstream_changes_zero_unpruned_and_moved_by_a_shallow_head(vlm):
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.pruning.downstream import downstream_changes
    from unicache_lib.world import samples as sample_set

    model, proc, _, _ = vlm
    space = HeadSpace.of(model)
    samples = sample_set.load(per_type=1)[:2]
    base = capture_samples(model, proc, samples, progress=False).records
    none = downstream_changes(model, proc, space, samples, space.ones(), skip_layers=[0], base=base)
    assert set(none.layer) == set(range(1, len(space.units))) and none["sample"].nunique() == 2
    assert (none[["d_entropy", "d_image_share"]].abs() < 1e-6).all().all()  # nothing masked: nothing moves
    keep = space.ones().clone()
    keep[0, :4] = 0
    moved = downstream_changes(model, proc, space, samples, keep, skip_layers=[0], base=base)
    assert (moved.d_entropy > 1e-4).all()  # every deeper layer notices half of layer 0's heads gone
    with pytest.raises(ValueError, match="base="):
        downstream_changes(model, proc, space, samples, keep, base=base[:-1])
