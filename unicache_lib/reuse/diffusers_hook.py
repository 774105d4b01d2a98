"""``step_skip`` as a diffusers hook: the workbench's step-level reuse inside a user's own pipeline.

    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip

    hook = apply_step_skip(pipe.transformer, StepSkipConfig(num_inference_steps=20))
    image = pipe(prompt, num_inference_steps=20).images[0]
    hook.calls, hook.computed          # transformer calls made / actually run (9 of 20 at the defaults)
    remove_step_skip(pipe.transformer)

It follows diffusers' own cache hooks (``diffusers/hooks/first_block_cache.py``, ``taylorseer_cache.py``): a
config dataclass, a :class:`~diffusers.hooks.ModelHook` registered in the transformer's ``HookRegistry``
under ``"step_skip"`` (so it sits in the same registry as diffusers' caches), removable (which frees the outputs it
kept), its state reset by ``reset_state`` (diffusers pipelines call it at the end of ``__call__`` for transformers
with diffusers' ``CacheMixin``; for the others a rising timestep starts the next run).

Steps are counted from the ``timestep`` the pipeline hands the transformer: a call with a new timestep
starts the next step; calls with the same timestep (a pipeline that runs the conditional and unconditional
branches as two calls) belong to the same step, each with its own history; a timestep *above* the last one
starts a new run (a pipeline called again without a reset). Timesteps must fall within a run, as in every
supported pipeline (SD3 / SD3.5, PixArt, Flux, Sana). A run with more steps than ``num_inference_steps`` is
refused; one that ends with fewer (img2img with ``strength < 1``, another step count) gets a warning naming the
count to pass, because its schedule was laid out for another run. The decisions and the extrapolation are
:class:`~unicache_lib.reuse.policies.step_skip.StepSkip`'s, made by the same function
(:func:`~unicache_lib.reuse.cache.step_call`) as :class:`~unicache_lib.reuse.cache.ReuseCache`, so the
images are the same as the workbench's (tests: ``torch.equal`` where the transformer receives the
sampler's timesteps; a pipeline that rescales them, e.g. Flux's ``t / 1000``, agrees to float rounding).

:func:`calibrate_step_skip` chooses the schedule's stride and damping for a pipeline from a few prompts.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import asdict

import numpy as np
import torch
from diffusers.hooks import HookRegistry, ModelHook

from ..core.errors import InputError
from ..inputs import check_count
from ..quality import psnr
from .cache import step_call
from .policies.step_skip import StepSkip

HOOK_NAME = "step_skip"


class StepSkipConfig(StepSkip):
    """:class:`~unicache_lib.reuse.policies.step_skip.StepSkip` itself (its fields, tuned defaults and checks: one set,
    ``benchmarks/results/tune_step_skip.txt``) plus the step count its schedule is laid out for, the pipeline's
    ``num_inference_steps``: ``StepSkipConfig(20)``, ``StepSkipConfig(20, stride=2, weight=0.0)``."""

    def __init__(self, num_inference_steps: int, *args, **settings):
        try:
            check_count(num_inference_steps, "num_inference_steps", 1)
        except InputError as e:
            raise type(e)(f"{e}: pass the step count you will call the pipeline with") from None
        super().__init__(*args, **settings)  # StepSkip's fields, checked by StepSkip
        self.num_inference_steps = num_inference_steps

    def __repr__(self) -> str:
        fields = super().__repr__()[len(type(self).__name__) + 1:]
        return f"{type(self).__name__}(num_inference_steps={self.num_inference_steps}, {fields}"

    def pattern(self) -> str:
        """The steps the transformer runs, e.g. ``CC.C..C..C..C..C..CC`` (C computed, . extrapolated)."""
        return "".join("C" if c else "." for c in self.schedule(self.num_inference_steps))


class StepSkipHook(ModelHook):
    """The hook :func:`apply_step_skip` registers. ``calls`` / ``computed``: transformer calls made / run,
    counted over every pipeline call since it was applied (not reset between runs)."""

    _is_stateful = True

    def __init__(self, config: StepSkipConfig):
        super().__init__()
        self.config = self.policy = config
        self.calls = self.computed = 0
        self._timestep_at = None
        self.reset_state(None)

    def initialize_hook(self, module):
        params = list(inspect.signature(module.forward).parameters)  # still the model's own forward here
        if "timestep" not in params:
            raise InputError(f"{type(module).__name__}.forward takes no `timestep` argument (it takes {params}): "
                             "step_skip counts denoising steps by the timestep a pipeline passes its transformer; "
                             "apply it to the pipeline's denoiser (pipe.transformer)")
        self._timestep_at = params.index("timestep")
        return module

    def reset_state(self, module):
        n = self.config.num_inference_steps
        if 0 <= getattr(self, "step", -1) < n - 1:

            warnings.warn(f"step_skip was applied for num_inference_steps={n} but the run had {self.step + 1} steps: "
                          f"its schedule was laid out for another run (the last steps it meant to compute were not "
                          f"reached). Apply it with StepSkipConfig(num_inference_steps={self.step + 1})", stacklevel=2)
        self.step, self._t, self._slot, self._history = -1, None, 0, {}
        return module

    def _timestep(self, args, kwargs) -> float:
        ts = kwargs.get("timestep", args[self._timestep_at] if self._timestep_at < len(args) else None)
        if ts is None:
            raise InputError("the transformer was called without a timestep: step_skip cannot tell the steps apart")
        return float(torch.as_tensor(ts).reshape(-1)[0])

    def new_forward(self, module, *args, **kwargs):
        t = self._timestep(args, kwargs)
        if self._t is None or t != self._t:
            if self._t is not None and t > self._t:  # timesteps fall within a run: a rise is a new run
                self.reset_state(module)
            self.step, self._t, self._slot = self.step + 1, t, 0
        n = self.config.num_inference_steps
        if self.step >= n:
            raise InputError(f"step_skip was applied for num_inference_steps={n} but the pipeline ran step {self.step + 1}: "
                             f"its schedule is for another run. Apply it again with StepSkipConfig(num_inference_steps="
                             f"<the steps you pass the pipeline>)")
        slot = self._slot
        self._slot += 1
        out, computed = step_call(self.policy, self._history.setdefault(slot, ([], [])), self.step, n, t,
                                  self.fn_ref.original_forward, args, kwargs)
        self.calls += 1
        self.computed += computed
        return out


def apply_step_skip(transformer: torch.nn.Module, config: StepSkipConfig) -> StepSkipHook:
    """Register ``step_skip`` on a diffusers transformer (``pipe.transformer``); returns the hook (its
    ``calls`` / ``computed`` count the work). Applying it twice raises: remove it first."""
    transformer = getattr(transformer, "transformer", transformer)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    if registry.get_hook(HOOK_NAME) is not None:
        raise InputError("step_skip is already applied to this transformer: remove_step_skip(transformer) first")
    hook = StepSkipHook(config)
    registry.register_hook(hook, HOOK_NAME)
    return hook


def remove_step_skip(transformer: torch.nn.Module) -> bool:
    """Remove the hook; ``False`` when there was none."""
    transformer = getattr(transformer, "transformer", transformer)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    if registry.get_hook(HOOK_NAME) is None:
        return False
    registry.get_hook(HOOK_NAME).reset_state(transformer)  # frees the outputs it kept (and warns after a short run)
    registry.remove_hook(HOOK_NAME, recurse=False)
    return True


def calibrate_step_skip(run, reference: list, num_inference_steps: int, transformer, strides=(2, 3, 4),
                        weights=(0.0, 0.5, 1.0), score=None) -> tuple[StepSkipConfig, list[dict]]:
    """Choose the stride and damping for a pipeline from a few prompts in one call.

    ``run()``: samples the calibration prompts (e.g. ``lambda: pipe(prompts, num_inference_steps=20,
    generator=...).images``) and returns what ``score(reference, images)`` compares (default: mean PSNR in dB
    of uint8 ``[H, W, 3]`` images: arrays, PIL images, or one ``[N, H, W, 3]`` array); ``reference``: the same call's uncached
    result. Every (stride, weight) is applied and sampled once; the fastest stride whose best PSNR is within
    1 dB of the best overall wins, with its best weight. Returns the config and one row per setting (stride,
    weight, schedule, computed share, psnr). Calibrate on prompts you will not score on."""
    def mean_psnr(ref, imgs):
        return float(psnr(np.stack([np.asarray(i) for i in imgs]), np.stack([np.asarray(r) for r in ref])).mean())

    score = score or mean_psnr
    rows = []
    for stride in strides:
        for weight in weights:
            cfg = StepSkipConfig(num_inference_steps, stride=stride, weight=weight)
            hook = apply_step_skip(transformer, cfg)
            try:
                imgs = run()
            finally:
                remove_step_skip(transformer)
            rows.append({"num_inference_steps": num_inference_steps, **asdict(cfg), "schedule": cfg.pattern(), "computed": hook.computed / max(hook.calls, 1),
                         "psnr": score(reference, imgs)})
    best = max(r["psnr"] for r in rows)
    ok = [r for r in rows if r["psnr"] >= best - 1.0]
    pick = max(ok, key=lambda r: (r["stride"], r["psnr"]))
    return StepSkipConfig(num_inference_steps, stride=pick["stride"], weight=pick["weight"]), rows
