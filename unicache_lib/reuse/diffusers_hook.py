"""``step_skip`` as a diffusers hook: the workbench's step-level reuse inside a user's own pipeline.

    from unicache_lib.reuse.diffusers_hook import StepSkipConfig, apply_step_skip, remove_step_skip

    hook = apply_step_skip(pipe.transformer, StepSkipConfig(num_inference_steps=20))
    image = pipe(prompt, num_inference_steps=20).images[0]
    hook.calls, hook.computed          # transformer calls made / actually run
    remove_step_skip(pipe.transformer)

It follows diffusers' own cache hooks (``first_block_cache.py``, ``taylorseer_cache.py``): a config dataclass, a
hook registered under ``"step_skip"`` in the transformer's ``HookRegistry`` beside diffusers' caches
(:func:`~unicache_lib.core.hooks.add_model_hook`, which refuses a second driver of step reuse), removable (which
frees the outputs it kept), its state reset by ``reset_state`` (diffusers pipelines call it at the end of
``__call__`` for transformers with ``CacheMixin``; for the others a rising timestep starts the next run).

Steps are counted from the ``timestep`` the pipeline hands the transformer: a call with a new timestep
starts the next step; calls with the same timestep (a pipeline that runs the conditional and unconditional
branches as two calls) belong to the same step, each with its own history; a timestep *above* the last one
starts a new run (a pipeline called again without a reset). Timesteps must fall within a run, as in every
supported pipeline (SD3 / SD3.5, PixArt, Flux, Sana). A run with more steps than ``num_inference_steps`` is
refused; one that ends with fewer (img2img with ``strength < 1``, another step count) gets a warning naming the
count to pass, because its schedule was laid out for another run. The decisions and the extrapolation are
:class:`~unicache_lib.reuse.policies.step_skip.StepSkip`'s, made by :class:`StepReuseHook`, the one driver of
step-level reuse (:class:`~unicache_lib.reuse.cache.ReuseCache` registers the same hook, counting steps by the
sampler's callback instead of the timestep), so the images are the workbench's (``torch.equal`` where the
transformer receives the sampler's timesteps; a pipeline that rescales them, e.g. Flux's ``t / 1000``, agrees to
float rounding).

:func:`calibrate_step_skip` chooses the schedule's stride and damping for a pipeline from a few prompts.
"""
import inspect
import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..core.errors import InputError, InputTypeError
from ..core.hooks import add_model_hook, remove_model_hook
from ..inputs import check_count
from ..quality import psnr
from .policies.step_skip import StepSkip

HOOK_NAME = "step_skip"


@dataclass(frozen=True)  # the hook made from it keeps its schedule: a field set later would not reach it
class StepSkipConfig:
    """The hook's settings: the step count its schedule is laid out for (the pipeline's ``num_inference_steps``) and
    :class:`~unicache_lib.reuse.policies.step_skip.StepSkip`'s fields, with its defaults and checks (one set,
    ``benchmarks/results/tune_step_skip.txt``): ``StepSkipConfig(20)``, ``StepSkipConfig(20, stride=2, weight=0.0)``;
    frozen: ``dataclasses.replace(cfg, stride=4)`` makes another (apply it after ``remove_step_skip``)."""

    num_inference_steps: int
    head: float = StepSkip.head
    tail: float = StepSkip.tail
    stride: int = StepSkip.stride
    weight: float = StepSkip.weight
    order: int = StepSkip.order

    def __post_init__(self):
        try:
            check_count(self.num_inference_steps, "num_inference_steps", 1)
        except InputError as e:
            raise type(e)(f"{e}: pass the step count you will call the pipeline with") from None
        self.policy()  # StepSkip's checks

    def policy(self) -> StepSkip:
        """The policy these settings make."""
        return StepSkip(self.head, self.tail, self.stride, self.weight, self.order)

    def schedule(self, n_steps: int) -> list[bool]:
        return self.policy().schedule(n_steps)

    def pattern(self) -> str:
        """The steps the transformer runs, one letter a step: ``C`` computed, ``.`` extrapolated."""
        return "".join("C" if c else "." for c in self.schedule(self.num_inference_steps))


def _prediction(out) -> torch.Tensor:
    """The model's prediction in a transformer's output: a tensor, a tuple's first item, or ``.sample``."""
    if torch.is_tensor(out):
        return out
    if isinstance(out, tuple) and out and torch.is_tensor(out[0]):
        return out[0]
    if torch.is_tensor(getattr(out, "sample", None)):
        return out.sample
    raise InputTypeError(f"cannot find the prediction in a transformer output of type {type(out).__name__}: "
                         "expected a tensor, a tuple whose first item is one, or an object with .sample")


def _with_prediction(template, pred: torch.Tensor):
    """``template`` (a kept output) with its prediction replaced by ``pred``, in the same form."""
    if torch.is_tensor(template):
        return pred
    if isinstance(template, tuple):
        return (pred,) + tuple(template[1:])
    if hasattr(template, "keys"):  # a diffusers BaseOutput (an ordered dict dataclass)
        return type(template)(**{**dict(template.items()), "sample": pred})
    raise InputTypeError(f"cannot rebuild a transformer output of type {type(template).__name__}")


KEEPS = ("a hook keeps the schedule it was applied with: remove_step_skip(transformer), then apply_step_skip("
         "transformer, new_config)")


class StepReuseHook:
    """The one driver of step-level reuse: a step-level policy (``policy.level == "step"``) asked once per
    transformer call. A skipped call returns the policy's extrapolation from the kept outputs in the model's
    output form; a call is computed when the policy says so, the history is too short, the timestep was seen,
    or the batch changed (a new batch clears the history). Calls within one step (a pipeline that runs the
    two guidance branches as two calls) each keep their own history.

    Steps are counted from the timestep the transformer receives (see the module doc), or, with ``clock``,
    from ``clock() -> (step, t)``, a sampler's own count (:class:`~unicache_lib.reuse.cache.ReuseCache`).
    ``calls`` / ``computed``: transformer calls made / actually run, since the hook was made. Registered with
    :func:`~unicache_lib.core.hooks.add_model_hook` (called as ``hook(original_forward, *args, **kwargs)``)."""

    def __init__(self, policy, num_inference_steps: int, clock=None):
        self.policy, self.num_inference_steps, self.clock, self._config = policy, num_inference_steps, clock, None
        self.calls = self.computed = 0
        self._timestep_at = None
        self.reset_state(None)

    @property
    def config(self) -> "StepSkipConfig | None":
        """The :class:`StepSkipConfig` :func:`apply_step_skip` made the hook from (None for a ReuseCache's)."""
        return self._config

    @config.setter
    def config(self, value):  # the hook runs the schedule it was made with: a new config would only be displayed
        raise InputError(KEEPS)

    def initialize_hook(self, module):
        if self.clock is not None:
            return module
        params = list(inspect.signature(module.forward).parameters)  # still the model's own forward here
        if "timestep" not in params:
            raise InputError(f"{type(module).__name__}.forward takes no `timestep` argument (it takes {params}): "
                             "step_skip counts denoising steps by the timestep a pipeline passes its transformer; "
                             "apply it to the pipeline's denoiser (pipe.transformer)")
        self._timestep_at = params.index("timestep")
        return module

    def reset_state(self, module):
        if self.clock is None and 0 <= getattr(self, "step", -1) < self.num_inference_steps - 1:
            warnings.warn(f"step_skip was applied for num_inference_steps={self.num_inference_steps} but the run had "
                          f"{self.step + 1} steps: "
                          f"its schedule was laid out for another run (the last steps it meant to compute were not "
                          f"reached). Apply it with StepSkipConfig(num_inference_steps={self.step + 1})", stacklevel=2)
        self.step, self._t, self._slot, self._history = -1, None, 0, {}
        return module

    def _timestep(self, args, kwargs) -> float:
        ts = kwargs.get("timestep", args[self._timestep_at] if self._timestep_at < len(args) else None)
        if ts is None:
            raise InputError("the transformer was called without a timestep: step_skip cannot tell the steps apart")
        return float(torch.as_tensor(ts).reshape(-1)[0])

    def _advance(self, args, kwargs) -> float:
        """Move to the step this call belongs to; its timestep."""
        if self.clock is not None:
            step, t = self.clock()
            if step != self.step:
                self.step, self._slot = step, 0
            return t
        t = self._timestep(args, kwargs)
        if self._t is None or t != self._t:
            if self._t is not None and t > self._t:  # timesteps fall within a run: a rise is a new run
                self.reset_state(None)
            self.step, self._t, self._slot = self.step + 1, t, 0
        if self.step >= self.num_inference_steps:
            raise InputError(f"step_skip was applied for num_inference_steps={self.num_inference_steps} but the pipeline "
                             f"ran step {self.step + 1}: "
                             f"its schedule is for another run. Apply it again with StepSkipConfig(num_inference_steps="
                             f"<the steps you pass the pipeline>)")
        return t

    def __call__(self, forward, *args, **kwargs):
        if (c := self._config) is not None and (self.num_inference_steps != c.num_inference_steps or (
                type(self.policy), asdict(self.policy)) != (StepSkip, asdict(c.policy()))):
            raise InputError(f"hook.policy or hook.num_inference_steps was changed after it was applied: {KEEPS}")
        t = self._advance(args, kwargs)
        policy, slot = self.policy, self._slot
        self._slot += 1
        self.calls += 1
        ts, outs = self._history.setdefault(slot, ([], []))  # oldest first, the last few kept
        d = policy.decide(self.step, self.num_inference_steps, math.nan, key="transformer")
        if d not in ("compute", "reuse"):
            raise InputError(f"step-level policy {policy.name!r} answered {d!r}; expected 'compute' or 'reuse'")
        h = kwargs.get("hidden_states", args[0] if args else None)
        if (d == "reuse" and outs and (not torch.is_tensor(h) or h.shape[0] == outs[-1][0].shape[0])  # the same batch
                and len(outs) >= policy.min_history and t not in ts):
            return _with_prediction(outs[-1][1], policy.extrapolate(ts, [o[0] for o in outs], t))
        out = forward(*args, **kwargs)
        self.computed += 1
        pred = _prediction(out)
        if outs and outs[-1][0].shape != pred.shape:  # another batch: the history does not apply
            del ts[:], outs[:]
        ts.append(t)
        outs.append((pred.detach(), out))
        del ts[:-max(3, policy.min_history)], outs[:-max(3, policy.min_history)]
        return out


def apply_step_skip(transformer: torch.nn.Module, config: StepSkipConfig) -> StepReuseHook:
    """Register ``step_skip`` on a diffusers transformer (``pipe.transformer``); returns the hook (``config``
    its config; ``calls`` / ``computed`` count the work over every pipeline call since it was applied, not reset
    between runs). Applying it twice, or over a :class:`~unicache_lib.reuse.cache.ReuseCache` driving step reuse,
    raises: remove it first."""
    if not isinstance(config, StepSkipConfig):  # a dict or a StepSkip policy was a raw AttributeError
        raise InputTypeError(f"apply_step_skip takes a StepSkipConfig, e.g. StepSkipConfig(num_inference_steps=20, "
                             f"stride=3), got {type(config).__name__} {config!r}")
    hook = StepReuseHook(config.policy(), config.num_inference_steps)
    hook._config = config
    return add_model_hook(getattr(transformer, "transformer", transformer), HOOK_NAME, hook,
                          "step_skip (or another step reuse) is already applied; remove_step_skip(transformer) first")


def remove_step_skip(transformer: torch.nn.Module) -> bool:
    """Remove the hook; ``False`` when there was none."""
    transformer = getattr(transformer, "transformer", transformer)
    hook = remove_model_hook(transformer, HOOK_NAME)
    if hook is None:
        return False
    hook.reset_state(transformer)  # frees the outputs it kept (and warns after a short run)
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
    score = score or (lambda ref, imgs: float(psnr(np.stack([np.asarray(i) for i in imgs]),
                                                   np.stack([np.asarray(r) for r in ref])).mean()))
    rows = []
    for stride in strides:
        for weight in weights:
            cfg = StepSkipConfig(num_inference_steps, stride=stride, weight=weight)
            hook = apply_step_skip(transformer, cfg)
            try:
                imgs = run()
            finally:
                remove_step_skip(transformer)
            rows.append({**asdict(cfg), "schedule": cfg.pattern(),
                         "computed": hook.computed / max(hook.calls, 1), "psnr": score(reference, imgs)})
    best = max(r["psnr"] for r in rows)
    pick = max((r for r in rows if r["psnr"] >= best - 1.0), key=lambda r: (r["stride"], r["psnr"]))
    return StepSkipConfig(num_inference_steps, stride=pick["stride"], weight=pick["weight"]), rows
