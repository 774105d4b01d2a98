"""Generators that are diffusers pipelines (SD3 / SD3.5, PixArt-alpha / -sigma, Flux.1 dev / schnell, Sana, HunyuanDiT,
DiT), sampled through the pipeline's own ``__call__``: its scheduler, guidance, text encoders and VAE decode; what
differs by family is asked of the family's :class:`~unicache_lib.gen_families.base.GenFamily` adapter.

:func:`unicache_lib.runtime.loaders.load_generator` returns a :class:`PipelineGenerator` for a pipeline folder
(one with ``model_index.json``); :func:`unicache_lib.runtime.sampling.sample` hands it to :func:`sample_pipeline`,
which adapts the library's step callbacks to the pipeline:

``on_step_begin(step, t)``   from a forward pre-hook on the transformer, before the first transformer call
                             of each step (``t`` read from ``pipe.scheduler.timesteps[step]``, 0-1000 scale)
``on_velocity(step, t, u, c)``  from a forward hook on the transformer, where the pipeline batches
                             classifier-free guidance (SD3, PixArt, Sana, HunyuanDiT ``[uncond | cond]``,
                             DiT ``[cond | uncond]``, with guidance > 1): the two predictions ``[B, C, h, w]``
                             before they are combined (noise for PixArt's DPM-Solver, velocity for the
                             flow-matching models; PixArt's learned-variance channels are dropped, as the
                             pipeline drops them). **Flux is never called**: dev is guidance-distilled (the
                             scale enters the transformer as an embedding) and schnell has no guidance.
``on_step_end(step, t, latents)``  from the pipeline's ``callback_on_step_end`` (PixArt: its ``callback``
                             with ``callback_steps=1``; DiT, which has neither: its scheduler's ``step``), with
                             the latents after the step (``[B, C, h, w]``; Flux: packed ``[B, h/2 * w/2, 4C]``)

The hooks are removed when the call returns or raises.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..core.errors import ContractError
from ..gen_families.base import GenFamily
from ..core.hooks import forward_hooks


@dataclass
class PipelineGenerator:
    """A loaded diffusers text-to-image pipeline, usable wherever a tiny-layout
    :class:`~unicache_lib.runtime.tiny_layouts.Generator` is.

    ``adapter``: the family's :class:`~unicache_lib.gen_families.base.GenFamily`, which owns every per-family fact
    used here (token naming and counts, the latent patch); ``pipe``: the pipeline; ``path``: where it was loaded from;
    ``image_size``: side of the (square) images :func:`~unicache_lib.runtime.sampling.sample` asks for, in pixels;
    ``max_sequence_length``: the T5 / Gemma prompt length passed to the pipeline.
    """

    adapter: GenFamily
    pipe: object
    path: str = ""
    image_size: int = 512
    max_sequence_length: int = 256

    @property
    def family(self) -> str:
        """The family's short tag (``"sd3"``, ``"pixart"``, ``"flux"``, ``"sana"``, ``"hunyuan"``, ``"dit"``)."""
        return self.adapter.key

    @property
    def transformer(self) -> torch.nn.Module:
        return self.pipe.transformer

    @property
    def scheduler(self):
        return self.pipe.scheduler

    @property
    def guidance_distilled(self) -> bool:
        """Flux.1-dev: the guidance scale is an input of the transformer (no unconditional branch)."""
        return bool(getattr(self.transformer.config, "guidance_embeds", False))

    @property
    def latent_size(self) -> int:
        """Side of the latent the VAE decodes (``image_size / 8`` for SD3, PixArt and Flux)."""
        return self.image_size // vae_scale_factor(self.pipe)

    @property
    def image_tokens(self) -> int:
        """Image tokens per image: ``(latent side / the family's latent patch)^2``."""
        return (self.latent_size // self.adapter.latent_patch(self.transformer)) ** 2

    @property
    def text_tokens(self) -> int:
        """Text positions per prompt the transformer sees (the family's :meth:`~GenFamily.text_positions`: SD3
        concatenates CLIP's 77 and T5's ``max_sequence_length``; the others see ``max_sequence_length``)."""
        return self.adapter.text_positions(self.pipe, self.max_sequence_length)

    def token_names(self, prompts: list[str]) -> list[list[str | None]] | None:
        """Per prompt, the name of every text position the transformer sees, ``None`` at padding, as the family
        names them (:meth:`~unicache_lib.gen_families.base.GenFamily.token_names`): SD3 CLIP's 77 positions then
        T5's (a T5 copy of a word is ``"t5:<word>"``, so word maps read the CLIP copy, which comes first); PixArt /
        Flux the T5 positions. A word the tokenizer splits into pieces is named at its first piece, its other pieces
        ``"##<piece>"`` (:func:`~unicache_lib.gen_families.base.word_names`). ``None`` for Sana, whose pipeline
        prepends an instruction to every prompt and keeps its last tokens: positions are then not named rather than
        named wrongly (capture still separates padding by the pipeline's own mask)."""
        return self.adapter.token_names(self.pipe, prompts, self.max_sequence_length)


def vae_scale_factor(pipe) -> int:
    """Pixels per latent pixel along a side (DiT's pipeline does not say: read off its VAE's levels)."""
    return int(getattr(pipe, "vae_scale_factor", 0) or 2 ** (len(pipe.vae.config.block_out_channels) - 1))


def default_image_size(pipe) -> int:
    """Side in pixels the pipeline generates by default: ``default_sample_size * vae_scale_factor``
    (SD3-medium 1024, PixArt-sigma-512 512, Flux 1024, Sana-1024 1024)."""
    size = getattr(pipe, "default_sample_size", None) or pipe.transformer.config.sample_size
    return int(size) * vae_scale_factor(pipe)


def pipeline_kwargs(gen: PipelineGenerator, prompts: list[str], steps: int, guidance: float, seeds: list[int]) -> dict:
    """The arguments :func:`sample_pipeline` calls ``gen.pipe`` with (callbacks aside): the prompts as the family
    hands them over (:meth:`~unicache_lib.gen_families.base.GenFamily.call_kwargs`), one CPU ``torch.Generator`` per
    prompt (a sample's noise does not depend on its batch), ``output_type="pt"``, and where the pipeline takes them
    the generator's square size and ``max_sequence_length``, resolution binning off (the size is used as given) and
    caption cleaning off (it needs bs4 / ftfy)."""
    params = inspect.signature(type(gen.pipe).__call__).parameters
    kw = dict(gen.adapter.call_kwargs(gen.pipe, prompts), num_inference_steps=int(steps), guidance_scale=float(guidance),
              generator=[torch.Generator().manual_seed(int(s)) for s in seeds], output_type="pt", return_dict=False)
    return kw | {k: v for k, v in dict(height=gen.image_size, width=gen.image_size, use_resolution_binning=False,
                                       max_sequence_length=gen.max_sequence_length, clean_caption=False).items()
                 if k in params}


def emit(callbacks, name: str, *args) -> None:
    """Call ``name(*args)`` on each callback object that defines it."""
    for cb in callbacks:
        fn = getattr(cb, name, None)
        if fn is not None:
            fn(*args)


class _StepHooks:
    """Adapts the library's step callbacks to one pipeline call (see the module doc)."""

    def __init__(self, gen: PipelineGenerator, callbacks, batch: int):
        self.gen, self.callbacks, self.batch = gen, list(callbacks), batch
        self.step, self.begun, self.ended = 0, False, 0

    def _t(self, step: int) -> float:
        ts = self.gen.scheduler.timesteps
        return float(ts[step]) if step < len(ts) else float("nan")

    def _begin(self) -> None:
        if not self.begun:
            self.begun = True
            emit(self.callbacks, "on_step_begin", self.step, self._t(self.step))

    def pre_hook(self, module, args, kwargs):
        self._begin()

    def post_hook(self, module, args, kwargs, output):
        out = output[0] if isinstance(output, tuple) else getattr(output, "sample", output)
        if out.shape[0] != 2 * self.batch:  # one branch (Flux; guidance <= 1): no velocity pair
            return
        latent_c = self.gen.pipe.vae.config.latent_channels
        if out.ndim == 4 and out.shape[1] == 2 * latent_c:  # PixArt / Sana learned variance: the pipeline drops it
            out = out[:, :latent_c]
        v_un, v_c = out.float().chunk(2)[::-1 if self.gen.adapter.cond_first else 1]
        emit(self.callbacks, "on_velocity", self.step, self._t(self.step), v_un, v_c)

    def end(self, latents) -> None:
        self._begin()  # a step without a transformer call still opens before it closes
        emit(self.callbacks, "on_step_end", self.step, self._t(self.step), latents)
        self.step, self.begun, self.ended = self.step + 1, False, self.ended + 1

    def callback_on_step_end(self, pipe, i, t, callback_kwargs: dict) -> dict:
        self.end(callback_kwargs["latents"])
        return callback_kwargs

    def legacy_callback(self, i, t, latents) -> None:
        self.end(latents)

    @contextmanager
    def scheduler_steps(self, scheduler):
        """A pipeline without a step callback (DiT): each ``scheduler.step`` closes a step, with its conditional
        rows."""
        step = scheduler.step

        def stepped(*args, **kwargs):
            out = step(*args, **kwargs)
            x = out[0]
            if x.shape[0] == 2 * self.batch:  # the guidance batch stepped whole
                x = x[: self.batch] if self.gen.adapter.cond_first else x[self.batch :]
            self.end(x)
            return out

        scheduler.step = stepped
        try:
            yield
        finally:
            del scheduler.step


@torch.no_grad()
def sample_pipeline(gen: PipelineGenerator, prompts: list[str], steps: int, guidance: float, seeds: list[int],
                    callbacks=()) -> torch.Tensor:
    """Generate through ``gen.pipe`` with the library's callbacks (module doc).

    Returns:
        ``[B, 3, image_size, image_size]`` float32 decoded pixels in ``[0, 1]`` on the CPU, equal to
        ``gen.pipe(**pipeline_kwargs(gen, prompts, steps, guidance, seeds))[0]``.
    """
    pipe = gen.pipe
    kw = pipeline_kwargs(gen, prompts, steps, guidance, seeds)
    hooks = _StepHooks(gen, callbacks, len(prompts))
    params, steps_closed = inspect.signature(type(pipe).__call__).parameters, nullcontext()
    if callbacks:
        if "callback_on_step_end" in params:
            kw |= dict(callback_on_step_end=hooks.callback_on_step_end, callback_on_step_end_tensor_inputs=["latents"])
        elif "callback" in params:  # PixArt: only the legacy per-step callback
            kw |= dict(callback=hooks.legacy_callback, callback_steps=1)
        else:
            steps_closed = hooks.scheduler_steps(pipe.scheduler)
    pipe.set_progress_bar_config(disable=True, leave=False)  # as sample(): the callers' loops carry the bar
    with steps_closed, forward_hooks([(gen.transformer, "forward_pre", hooks.pre_hook),
                                      (gen.transformer, "forward", hooks.post_hook)] if callbacks else []):
        images = pipe(**kw)[0]
    n = len(pipe.scheduler.timesteps)
    if callbacks and hooks.ended != n:
        raise ContractError(f"{type(pipe).__name__} reported {hooks.ended} of {n} steps to its step callback "
                            f"(a multi-order scheduler?): the step callbacks cannot be trusted")
    return images.float().cpu()
