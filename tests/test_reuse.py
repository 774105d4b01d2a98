"""One shared suite over every cross-step reuse policy, and diffusers' caches as peers."""
import pytest
import torch

from unicache_lib.capture.diffusion import find_diffusion_attention
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.cache import AttentionCallCounter
from unicache_lib.reuse.peers import FAMILY_PEERS, PEERS, DiffusersCache, PeerUnsupported, magcache_ratios
from unicache_lib.zoo.loaders import load_generator
from unicache_lib.zoo.sampling import sample

PROMPTS = ["a red circle on the left", "a blue square at the top"]


@pytest.fixture(scope="module", params=["tiny-mmdit", "tiny-pixart"])
def gen(request):
    g = load_generator(request.param)
    g.ref = sample(g, PROMPTS, 8, seed=0)
    return g


def _clean(gen):
    return all(type(m.processor).__name__.endswith("Processor2_0") for _, _, m in find_diffusion_attention(gen.transformer).values())


@pytest.mark.parametrize("name", sorted(REUSE_POLICIES))
def test_reuse_policy_contract(gen, name):
    runs = []
    for _ in range(2):
        with ReuseCache(gen.transformer, REUSE_POLICIES[name](), 8) as rc:
            runs.append(sample(gen, PROMPTS, 8, seed=0, callbacks=[rc]))
        assert 0 < rc.computed_fraction <= 1
        assert rc.calls == 8 * len(find_diffusion_attention(gen.transformer))
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
    full_rows = steps * len(find_diffusion_attention(gen.transformer)) * 2 * len(PROMPTS)  # steps x modules x CFG batch
    try:
        with DiffusersCache(gen, kind, steps, calibration=ratios) as pc, AttentionCallCounter(gen.transformer) as counter:
            out = sample(gen, PROMPTS, steps, seed=0, callbacks=[pc])
    except PeerUnsupported as e:  # only where the family table refuses it, with its reason
        assert str(e) == FAMILY_PEERS[gen.family].unsupported[kind]
        return
    assert out.shape == gen.ref.shape and out.isfinite().all()
    assert 0 < counter.rows < full_rows  # it computed less than everything
    # hooks are gone afterwards: the plain model gives the uncached images, computing everything
    with AttentionCallCounter(gen.transformer) as plain:
        ref = sample(gen, PROMPTS, steps, seed=0)
    assert plain.rows == full_rows
    assert (out - ref).abs().max() > 0  # skipping changed the image a little
    assert torch.equal(sample(gen, PROMPTS, 8, seed=0), gen.ref)


def test_counter_counts_half_batches_half(gen):
    with AttentionCallCounter(gen.transformer) as c:
        sample(gen, PROMPTS, 2, guidance=1.0, seed=0)  # no CFG: every call carries half the rows
    n_mod = len(find_diffusion_attention(gen.transformer))
    assert c.calls == 2 * n_mod and c.rows == 2 * n_mod * len(PROMPTS)


def test_magcache_calibration_must_be_held_out(gen):
    from unicache_lib.reuse.evaluate import methods_for

    with pytest.raises(ValueError, match="held-out prompts"):
        methods_for(gen, 4, 3.0, PROMPTS[:1], peers=("magcache",), scored_prompts=PROMPTS)
