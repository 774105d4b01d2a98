"""One shared suite over every head scorer, plus exact masking and physical pruning."""
import numpy as np
import pytest
import torch

from unicache_lib.pruning import SCORERS, HeadMask, HeadSpace, ScoringContext, prune_physically
from unicache_lib.quality import psnr, ssim


@pytest.fixture(scope="module")
def vlm():
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.world import samples as sample_set
    from unicache_lib.zoo.loaders import load_understanding
    from unicache_lib.zoo.train_llava import heldout_set

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
    from unicache_lib.zoo.loaders import load_generator
    from unicache_lib.zoo.sampling import sample

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
    with pytest.raises(NotImplementedError, match="HeadMask"):
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
