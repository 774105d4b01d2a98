"""Sampling with step callbacks: the library's loop for the tiny generators (SD3 / PixArt transformers in
pixel space, on a real diffusers scheduler, with classifier-free guidance), and a diffusers pipeline's own
``__call__`` for pipeline folders (:mod:`unicache_lib.runtime.pipelines`: SD3, PixArt, Flux, Sana, VAE-decoded).

Capture and reuse code hang on the callbacks: each callback object may define
``on_step_begin(step, timestep)``, ``on_velocity(step, timestep, v_uncond, v_cond)`` (guidance on:
the two velocity predictions ``[B, C, H, W]`` before they are combined; never for Flux) and
``on_step_end(step, timestep, sample)`` (the tiny loop: pixels; a pipeline: its latents).
"""
from __future__ import annotations

import numpy as np
import torch

from ..core.errors import InputError
from ..core.models import placement
from .pipelines import PipelineGenerator, emit, sample_pipeline
from .tiny_layouts import Generator, TextConditioning, encode_prompts, transformer_forward


def initial_noise(seeds: list[int], shape: tuple[int, int, int]) -> torch.Tensor:
    """``[B, C, H, W]`` standard normal noise, one generator per sample, so a sample's noise does
    not depend on which other prompts share its batch."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(int(s))) for s in seeds])


@torch.no_grad()
def sample(gen: Generator | PipelineGenerator, prompts: list[str], steps: int = 20, guidance: float = 3.0,
           seed: int | list[int] = 0, callbacks: list | tuple = ()) -> torch.Tensor:
    """Generate images for ``prompts``: a tiny-layout generator with the library's loop, a pipeline
    (``gen.pipe`` set) through the pipeline itself (:func:`~unicache_lib.runtime.pipelines.sample_pipeline`). No progress
    bar: the callers' loops (capture, sweeps, timing rounds) carry one, and timed runs must not draw one.

    Args:
        steps: number of denoising steps (scheduler ``set_timesteps``).
        guidance: classifier-free guidance scale; 1.0 disables the unconditional branch (pipelines: > 1
            enables it; Flux.1-dev: the distilled guidance scale; Flux.1-schnell: ignored).
        seed: one int (sample ``i`` uses ``seed + i``) or one seed per prompt.
        callbacks: objects with optional ``on_step_begin`` / ``on_velocity`` / ``on_step_end`` (module doc).
    Returns:
        ``[B, 3, H, W]`` float32 images in ``[0, 1]`` on the CPU (pixel-space models: the sample;
        pipelines: the VAE-decoded latents, ``H = W = gen.image_size``).
    """
    if not prompts:
        raise InputError("prompts is empty: pass at least one prompt")
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed + i for i in range(len(prompts))]
    if len(seeds) != len(prompts):
        raise InputError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    if gen.pipe is not None:
        return sample_pipeline(gen, list(prompts), steps, guidance, seeds, callbacks)
    cfg = gen.transformer.config
    dev, dtype = placement(gen.transformer)  # an offloaded (meta-device) transformer is refused in one line
    x = initial_noise(seeds, (cfg.in_channels, cfg.sample_size, cfg.sample_size)).to(dev)
    cond = encode_prompts(gen.text_encoder, gen.tokenizer, prompts)
    use_cfg = guidance != 1.0
    if use_cfg:  # batch order [uncond, cond], as diffusers' FasterCache expects
        un = encode_prompts(gen.text_encoder, gen.tokenizer, [""] * len(prompts))
        cond = TextConditioning(torch.cat([un.hidden, cond.hidden]), torch.cat([un.pooled, cond.pooled]),
                                torch.cat([un.mask, cond.mask]))
    cond = TextConditioning(cond.hidden.to(dtype), cond.pooled.to(dtype), cond.mask)
    sched = gen.scheduler
    sched.set_timesteps(steps, device=x.device)
    for i, t in enumerate(sched.timesteps):
        emit(callbacks, "on_step_begin", i, float(t))
        xin = torch.cat([x, x]) if use_cfg else x
        v = transformer_forward(gen.transformer, gen.adapter, xin.to(dtype), t.expand(xin.shape[0]).to(dtype),
                                cond).float()
        if use_cfg:
            v_un, v_c = v.chunk(2)
            emit(callbacks, "on_velocity", i, float(t), v_un, v_c)
            v = v_un + guidance * (v_c - v_un)
        x = sched.step(v, t, x, return_dict=False)[0]
        emit(callbacks, "on_step_end", i, float(t), x)
    return ((x.clamp(-1, 1) + 1) / 2).float().cpu()


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """:func:`sample`'s channels-first ``[B, 3, H, W]`` in [0, 1] -> ``[B, H, W, 3]`` uint8; for channels-last
    images in [-1, 1] (a Janus decoder's), :func:`unicache_lib.capture.unified.signed_to_uint8`."""
    return (images.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
