"""Random-weight stand-ins of real text-to-image pipelines, for the generator notebooks at real shapes.

The generator-side counterpart of :mod:`unicache_lib.zoo.builders.standins`: each stand-in is the real pipeline class
(``StableDiffusion3Pipeline``, ``PixArtSigmaPipeline``, ``FluxPipeline``) at 512 pixels with the real
transformer depth, head count, image tokens (1,024) and text tokens (the real ``max_sequence_length`` and
CLIP length), a reduced head dimension, tiny random text encoders and a tiny random VAE (few channels, the
real 8x down-sampling and latent channels), saved with ``save_pretrained`` and a model card that says
``"stand_in": true`` (:mod:`unicache_lib.zoo.builders.tiny_pipelines` builds the parts). They test code paths, memory
and time at real shapes; their images and statistics mean nothing.

    python -m unicache_lib.zoo.builders.gen_standins --out outputs/rehearsal/models            # all three
    python -m unicache_lib.zoo.builders.gen_standins --out DIR --only flux-dev --step          # + one timed step
"""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ...core.compat import diffusers
from ...core.errors import UnknownNameError
from ...runtime.loaders import load_generator
from ...runtime.sampling import sample
from .standins import model_folder, record_model, standins_cli
from .tiny_pipelines import build_pipeline, kinds, save_pipeline

IMAGE_SIZE = 512


@dataclass(frozen=True)
class GenStandIn:
    """``kind``: a :func:`~unicache_lib.zoo.builders.tiny_pipelines.kinds` key; ``imitates``: the hub checkpoint;
    ``transformer``: the diffusers class and its kwargs (real depth, heads, patch and channels; reduced
    widths); ``real``: the published sizes; ``reduced``: what differs from the real model;
    ``image_tokens`` / ``text_tokens``: per image at :data:`IMAGE_SIZE`; ``max_sequence_length``: T5's."""

    kind: str
    imitates: str
    transformer: tuple[str, dict]
    real: dict
    reduced: str
    image_tokens: int
    text_tokens: int
    max_sequence_length: int
    blocks: str


HEAD_DIM = 8  # real: 64 (SD3), 72 (PixArt), 128 (Flux)
TEXT_WIDTH = 64  # T5 d_model and the caption / joint-attention input width (real: 4096)

GEN_STANDINS: dict[str, GenStandIn] = {
    "sd3-medium": GenStandIn(
        "sd3", "stabilityai/stable-diffusion-3-medium-diffusers",
        ("SD3Transformer2DModel", dict(
            sample_size=IMAGE_SIZE // 8, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
            num_attention_heads=24, attention_head_dim=HEAD_DIM, joint_attention_dim=TEXT_WIDTH,
            caption_projection_dim=24 * HEAD_DIM, pooled_projection_dim=TEXT_WIDTH, pos_embed_max_size=192)),
        real={"transformer": "MMDiT 24 joint blocks x 24 heads x 64 (hidden 1536), patch 2, 16 latent channels",
              "text": "CLIP-L (768) + CLIP-G (1280), 77 tokens each, pooled 2048; T5-XXL (4096), 256 tokens",
              "vae": "AutoencoderKL 128-512 channels, 8x, 16 latent channels"},
        reduced=f"head dim {HEAD_DIM} (real 64): hidden 192; text encoders 1 layer, CLIPs 32 wide, T5 {TEXT_WIDTH} "
                f"wide; VAE 8 channels per level",
        image_tokens=1024, text_tokens=77 + 256, max_sequence_length=256, blocks="24 joint"),
    "pixart-sigma": GenStandIn(
        "pixart-sigma", "PixArt-alpha/PixArt-Sigma-XL-2-512-MS",
        ("PixArtTransformer2DModel", dict(
            sample_size=IMAGE_SIZE // 8, patch_size=2, in_channels=4, out_channels=8, num_layers=28,
            num_attention_heads=16, attention_head_dim=HEAD_DIM, cross_attention_dim=16 * HEAD_DIM,
            caption_channels=TEXT_WIDTH, norm_type="ada_norm_single", use_additional_conditions=False)),
        real={"transformer": "28 blocks x 16 heads x 72 (hidden 1152): self-attention, cross-attention to T5",
              "text": "T5-XXL (4096), 300 tokens", "vae": "SD AutoencoderKL 128-512 channels, 8x, 4 latent channels"},
        reduced=f"head dim {HEAD_DIM} (real 72): hidden 128; T5 1 layer, {TEXT_WIDTH} wide; VAE 8 channels per level",
        image_tokens=1024, text_tokens=300, max_sequence_length=300, blocks="28 (self + cross)"),
    "flux-dev": GenStandIn(
        "flux-dev", "black-forest-labs/FLUX.1-dev",
        ("FluxTransformer2DModel", dict(
            patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, num_attention_heads=24,
            attention_head_dim=HEAD_DIM, joint_attention_dim=TEXT_WIDTH, pooled_projection_dim=32,
            guidance_embeds=True, axes_dims_rope=(2, 2, 4))),
        real={"transformer": "19 double-stream + 38 single-stream blocks x 24 heads x 128 (hidden 3072), "
                             "rotary axes (16, 56, 56), guidance embedding",
              "text": "CLIP-L pooled (768); T5-XXL (4096), 512 tokens",
              "vae": "AutoencoderKL 128-512 channels, 8x, 16 latent channels packed 2x2 -> 64"},
        reduced=f"head dim {HEAD_DIM} (real 128; rotary axes (2, 2, 4) for (16, 56, 56)): hidden 192; text encoders "
                f"1 layer, CLIP 32 wide, T5 {TEXT_WIDTH} wide; VAE 8 channels per level",
        image_tokens=1024, text_tokens=512, max_sequence_length=512, blocks="19 double + 38 single"),
}


def attention_shapes(spec: GenStandIn) -> list[tuple[int, int, int]]:
    """``(heads, queries, keys)`` of every attention map of one sample in one denoising step."""
    kw = spec.transformer[1]
    h, img, txt = kw["num_attention_heads"], spec.image_tokens, spec.text_tokens
    if spec.kind in ("sd3", "sd3.5"):
        return [(h, img + txt, img + txt)] * kw["num_layers"]
    return ([(h, img, img), (h, img, txt)] * kw["num_layers"] if spec.kind.startswith("pixart")
            else [(h, img + txt, img + txt)] * (kw["num_layers"] + kw["num_single_layers"]))  # flux: joint everywhere


def memory_estimate(spec: GenStandIn, batch: int = 1) -> dict:
    """Float32 bytes of full attention maps (what a capture with ``mode="full"`` recomputes and keeps):
    the largest single map of the batch (``[2B, H, Sq, Sk]`` with classifier-free guidance, recomputed one
    block at a time), and all blocks' maps of one step for the conditional half (what a step of full
    capture keeps, before thinning with ``query_stride``)."""
    cfg = 1 if spec.kind.startswith("flux") else 2
    maps = [h * q * k * 4 for h, q, k in attention_shapes(spec)]
    return {"largest_map_mb": round(max(maps) * cfg * batch / 2**20),
            "one_step_all_blocks_mb": round(sum(maps) * batch / 2**20)}


def build(name: str, out: str | Path, seed: int = 0) -> Path:
    """Build the stand-in ``name`` into ``out / name`` (pipeline folder and card)."""
    if name not in GEN_STANDINS:
        raise UnknownNameError(f"unknown generator stand-in {name!r}; known: {', '.join(GEN_STANDINS)}")
    spec, d = GEN_STANDINS[name], model_folder(out, name)  # (refused before anything is built)
    t0 = time.perf_counter()
    cls, kw = spec.transformer
    torch.manual_seed(seed)
    pipe = build_pipeline(spec.kind, getattr(diffusers, cls)(**kw).eval(), seed=seed)
    n_params = {k: sum(p.numel() for p in m.parameters()) for k, m in pipe.components.items()
                if isinstance(m, torch.nn.Module)}
    card = {"model": name, "stand_in": True, "imitates": spec.imitates, "kind": spec.kind,
            "family": kinds()[spec.kind][1].key, "pipeline": kinds()[spec.kind][0], "seed": seed, "image_size": IMAGE_SIZE,
            "max_sequence_length": spec.max_sequence_length, "image_tokens": spec.image_tokens,
            "text_tokens": spec.text_tokens, "blocks": spec.blocks, "heads": kw["num_attention_heads"],
            "head_dim": kw["attention_head_dim"], "real": spec.real, "reduced": spec.reduced,
            "transformer": {"class": cls, **kw}, "parameters": n_params, "full_map_memory": memory_estimate(spec),
            "what_it_is_for": "code paths, memory and time at the real pipeline's token counts and depth; random "
                              "weights, so no image, statistic or verdict of it means anything",
            "build_seconds": round(time.perf_counter() - t0, 1)}
    return record_model(out, save_pipeline(pipe, d, card))


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB, Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_step(folder: str | Path, prompts=("a red circle on the left",), guidance: float = 3.0) -> dict:
    """Load a stand-in and sample one denoising step (text encoders, transformer, VAE decode) for ``prompts``;
    returns seconds (load, step) and the peak RSS of the process."""
    t0 = time.perf_counter()
    gen = load_generator(folder)
    t1 = time.perf_counter()
    x = sample(gen, list(prompts), steps=1, guidance=guidance, seed=0)
    t2 = time.perf_counter()
    return {"model": Path(folder).name, "image": list(x.shape), "image_tokens": gen.image_tokens,
            "text_tokens": gen.text_tokens, "load_s": round(t1 - t0, 2), "step_s": round(t2 - t1, 2),
            "peak_rss_mb": round(peak_rss_mb())}


def main(argv=None):
    a = standins_cli(__doc__, GEN_STANDINS, argv, step=True)
    for name in a.only or GEN_STANDINS:
        d = build(name, Path(a.out), a.seed)
        print(d, json.dumps({"full_map_memory": memory_estimate(GEN_STANDINS[name])}))
        if a.step:
            print(json.dumps(one_step(d)), flush=True)


if __name__ == "__main__":
    main()
