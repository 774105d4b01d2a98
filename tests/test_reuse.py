"""One shared suite over every cross-step reuse policy, and diffusers' caches as peers."""
import pytest
import torch

from unicache_lib.capture.diffusion import find_diffusion_attention
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.peers import PEERS, DiffusersCache, PeerUnsupported, magcache_ratios
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
        assert torch.allclose(runs[0], gen.ref, atol=1e-5)


def test_reuse_restores_processors_on_error(gen):
    with pytest.raises(RuntimeError, match="boom"):
        with ReuseCache(gen.transformer, REUSE_POLICIES["every_2"](), 8):
            raise RuntimeError("boom")
    assert _clean(gen)


@pytest.mark.parametrize("kind", PEERS)
def test_diffusers_peers_run_or_say_why(gen, kind):
    ratios = magcache_ratios(gen, PROMPTS, 8) if kind == "magcache" else None
    if kind == "magcache":
        assert len(ratios) == 8 and all(r > 0 for r in ratios)
    try:
        with DiffusersCache(gen, kind, 8, calibration=ratios) as pc:
            out = sample(gen, PROMPTS, 8, seed=0, callbacks=[pc])
    except PeerUnsupported as e:
        assert gen.family == "sd3" and kind in ("first_block", "taylorseer") and "context_pre_only" in str(e)
        return
    assert out.shape == gen.ref.shape and out.isfinite().all()
    # hooks are gone afterwards: the plain model gives the reference again
    assert torch.equal(sample(gen, PROMPTS, 8, seed=0), gen.ref)
