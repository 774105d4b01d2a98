"""docs/ARCHITECTURE.md: "A generator family takes two files: the adapter and one suite line." A throw-away family is
written as those two files (its adapter module, with its tiny transformer and tiny pipeline, and its expectations), and
capture, sampling, reuse and pruning run on it through the paths every family takes, with no other file touched."""
import importlib.util
import json
import sys

import pytest
import torch

from unicache_lib.capture.diffusion import DiffusionCapture
from unicache_lib.capture.gen_runner import capture_generation
from unicache_lib.gen_families import GEN_FAMILIES, gen_family_of
from unicache_lib.pruning.evaluate import generation_loss_fns
from unicache_lib.pruning.heads import HeadMask, HeadSpace
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.runtime.pipelines import PipelineGenerator, default_image_size
from unicache_lib.runtime.sampling import sample
from unicache_lib.zoo.builders import tiny_pipelines as tp
from unicache_lib.zoo.builders.tiny_random import forward_inputs, tiny_transformer

# file 1: unicache_lib/gen_families/fork.py in a fork (its own transformer class, a cross-attention DiT)
ADAPTER = '''
from diffusers import PixArtTransformer2DModel

from unicache_lib.gen_families.base import FamilyPeers, GenFamily, register, standard_probs


class ForkTransformer(PixArtTransformer2DModel):
    """The fork's model: self-attention attn1, cross-attention attn2 to its T5 text."""


@register
class Fork(GenFamily):
    name, key = "Fork", "fork"
    peers = FamilyPeers(attention=r"transformer_blocks\\.\\d+\\.attn[12]", spatial=(r"^transformer_blocks\\.\\d+\\.attn1$",),
                        cross=(r"^transformer_blocks\\.\\d+\\.attn2$",),
                        cfg_kwargs=("hidden_states", "encoder_hidden_states", "encoder_attention_mask", "timestep"))
    transformer_classes = ("ForkTransformer",)
    site_patterns = ((r"transformer_blocks\\.(\\d+)\\.attn1", "self"), (r"transformer_blocks\\.(\\d+)\\.attn2", "cross"))
    parts = ("self", "cross")
    processors = {"AttnProcessor2_0": standard_probs}
    text_kv_processors = ("AttnProcessor2_0",)
    default_processors = {p: "diffusers.models.attention_processor:AttnProcessor2_0" for p in parts}
    objective, learned_sigma = "epsilon", True
    tiny = {"fork": (ForkTransformer, dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=3, cross_attention_dim=16,
        caption_channels=16, sample_size=8, patch_size=2, norm_num_groups=1, use_additional_conditions=False))}
    tiny_pipelines = {"fork": ("PixArtSigmaPipeline", "fork", {"out_channels": 8}, "DPMSolverMultistepScheduler", {})}
    tiny_vae = ("kl_vae", dict(scaling_factor=0.18215))

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), encoder_hidden_states=rn(batch, n_text + n_pad, 16),
                    encoder_attention_mask=mask, timestep=t, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                    return_dict=False)

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        t5 = build.t5_tokenizer()
        return dict(tokenizer=t5, text_encoder=build.t5_encoder(t5, transformer.config.caption_channels, text_layers),
                    vae=build.vae(self.key, transformer.config.in_channels, vae_channels, vae_blocks))
'''
# file 2: its line of the suite's expectations (EXPECT in tests/test_gen_families.py)
EXPECT = {"family": "Fork", "tag": "fork", "kind": "fork", "parts": ["cross", "self"], "n_image": 16, "units": [6, 2]}
PROMPTS = ["a red circle on the left", "two blue squares at the top"]


@pytest.fixture
def fork(tmp_path):
    (tmp_path / "fork.py").write_text(ADAPTER)
    (tmp_path / "fork_expect.json").write_text(json.dumps(EXPECT))
    spec = importlib.util.spec_from_file_location("fork", tmp_path / "fork.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the family
    ex = json.loads((tmp_path / "fork_expect.json").read_text())
    try:
        yield GEN_FAMILIES[ex["family"]], ex
    finally:
        GEN_FAMILIES.pop(ex["family"])
        sys.modules.pop("fork", None)


def test_a_generator_family_is_two_files(fork):
    fam, ex = fork
    # capture, one forward of its tiny transformer: a record for every attention site, of the expected parts
    tr = tiny_transformer(ex["tag"])
    assert gen_family_of(tr) is fam
    kw = forward_inputs(ex["tag"], tr, batch=2)
    with torch.no_grad():
        plain = tr(**kw)[0]
        with DiffusionCapture(tr, ["s"], mode="full") as cap:
            assert torch.equal(tr(**kw)[0], plain)
    sites = {(s.layer, s.part) for s in fam.sites(tr) if s.captured}
    assert {(r.layer, r.part) for r in cap.result} == sites and {p for _, p in sites} == set(ex["parts"])
    assert all(r.probs.shape[-2] == ex["n_image"] for r in cap.result)

    # sampling through PipelineGenerator: its tiny pipeline, built from the adapter
    pipe = tp.build_pipeline(ex["kind"], tp.tiny_transformer(ex["kind"]), vae_blocks=fam.tiny_vae_blocks)
    gen = PipelineGenerator(fam, pipe, "", default_image_size(pipe), fam.max_sequence_length(pipe))
    x = sample(gen, PROMPTS, steps=2, guidance=3.0, seed=0)
    assert x.shape == (2, 3, 16, 16) and x.isfinite().all() and gen.family == "fork"
    run = capture_generation(gen, PROMPTS, "f", steps=1, guidance=3.0, progress=False)  # one captured step
    assert {(r.layer, r.part) for r in run.result.records} == sites and "red" in run.tokens[0]

    # reuse: one policy, less than all the attention work done
    with ReuseCache(gen, REUSE_POLICIES["every_2"](), 4) as rc:
        y = sample(gen, PROMPTS, 4, 3.0, seed=0, callbacks=[rc])
    assert y.shape == x.shape and y.isfinite().all() and rc.computed_fraction < 1

    # pruning: its heads, a masked unit changes the image, the loss of the adapter's objective
    space = HeadSpace.of(gen.transformer)
    assert list(space.shape) == ex["units"]
    mask = space.ones()
    mask[0] = 0
    with HeadMask(space, mask):
        assert (sample(gen, PROMPTS, steps=2, guidance=3.0, seed=0) - x).abs().max() > 1e-4
    (loss,) = [f() for f in generation_loss_fns(gen, n_batches=1, batch=2)]
    assert torch.isfinite(loss)
