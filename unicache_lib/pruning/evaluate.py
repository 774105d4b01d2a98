"""Measure what pruning does: task accuracy and answer KL for the understanding model, image
quality and prompt following for the generators. Always against the unpruned model's own outputs."""
from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..capture.runner import answer_logits
from ..core.errors import ContractError, InputError, UnsupportedError
from ..core.hooks import forward_hooks
from ..core.scoring import correct, kl_divergence
from ..gen_families.base import GEN_FAMILIES, gen_family_of
from ..inputs import check_fractions
from ..progress import bar
from ..quality import PSNR_CAP, psnr, ssim
from ..runtime.sampling import sample, to_uint8
from ..runtime.tiny_layouts import encode_prompts, transformer_forward
from ..world.segment import score_object
from ..world.text import generation_example, prompt_set
from .heads import HeadMask


@torch.no_grad()
def answer_logprobs(model, processor, qas, batch: int = 100) -> torch.Tensor:
    """``[N, vocab]`` log-probabilities of the first answer token for world questions."""
    return torch.log_softmax(answer_logits(model, processor, [q.question for q in qas],
                                           np.stack([q.scene.uint8() for q in qas]), batch), -1)


def understanding_metrics(logp: torch.Tensor, ref_logp: torch.Tensor, processor, qas) -> dict:
    """Accuracy (:func:`~unicache_lib.core.scoring.same_answer`: word mark and case ignored), agreement with the
    reference answers and mean KL(ref || this); per question in ``correct_q`` (bool ``[N]``, for intervals over
    questions)."""
    pred = getattr(processor, "tokenizer", processor).convert_ids_to_tokens(logp.argmax(-1).tolist())
    ok = correct(pred, [q.answer for q in qas])
    return {"accuracy": float(ok.mean()), "agreement": float((logp.argmax(-1) == ref_logp.argmax(-1)).float().mean()),
            "kl": float(kl_divergence(ref_logp, logp).mean()), "n": len(qas), "correct_q": ok}


def generation_metrics(images: np.ndarray, reference: np.ndarray, objects: list[dict]) -> dict:
    """PSNR / SSIM vs the reference images and colour / position / shape following rates
    (``objects``: the one object each single-object prompt asks for). ``images`` / ``reference``:
    ``[N, H, W, 3]`` uint8 of any square size (the tiny generators' 32 px, a pipeline's decoded 512 or
    1024 px): the prompt-following checker measures in fractions of the image side and area."""
    p = psnr(images, reference)
    scores = [score_object(im, o) for im, o in zip(images, objects)]
    return {"psnr": float(np.mean(np.minimum(p, PSNR_CAP))), "ssim": float(np.mean(ssim(images, reference))),
            **{k: float(np.mean([s[k] for s in scores])) for k in ("colour", "position", "shape")}, "n": len(images)}


def understanding_loss_fns(model, processor, qas, batch: int = 32) -> list:
    """Closures: cross-entropy of the answer token on batches of ``qas`` (for the gradient scorer)."""
    fns = []
    for s in range(0, len(qas), batch):
        chunk = qas[s : s + batch]
        ids = torch.tensor(processor.tokenizer.convert_tokens_to_ids([q.answer for q in chunk]))
        imgs = np.stack([q.scene.uint8() for q in chunk])
        qs = [q.question for q in chunk]
        fns.append(lambda qs=qs, imgs=imgs, ids=ids: torch.nn.functional.cross_entropy(
            answer_logits(model, processor, qs, imgs, batch=len(qs)), ids.to(next(model.parameters()).device)))
    return fns


def generation_loss_fns(gen, n_batches: int = 4, batch: int | None = None, seed: int = 0, *, steps: int = 2,
                        guidance: float = 3.0) -> list:
    """Closures returning the generator's denoising training loss on fixed batches, for the gradient scorer
    (the gradient of the loss w.r.t. a head mask ranks heads, Michel et al.). Deterministic in ``seed``.

    **Tiny layout** (``gen.pipe`` None; ``batch`` defaults to 16): the rectified-flow training loss on
    synthetic pixel-space examples of the world (image and prompt, as in training), the prompts through
    the tiny text encoder: ``x_t = (1 - s) x0 + s eps``, ``s = sigmoid(N(0, 1))``, timestep ``1000 s``,
    ``MSE(v, eps - x0)``. ``steps`` and ``guidance`` are not used.

    **Pipeline** (:class:`~unicache_lib.runtime.pipelines.PipelineGenerator`; ``batch`` defaults to 4): latent
    models have no training images here, so the clean latents ``x0`` are the pipeline's own samples and the
    conditioning is the pipeline's own. Per batch: ``batch`` prompts of
    :func:`~unicache_lib.world.text.prompt_set` (30% two-object, short or long wording at random, as the
    tiny examples) are sampled with ``sample(gen, prompts, steps, guidance)`` while a forward pre-hook on the
    transformer records the arguments of its first call (text embeddings, pooled projections, masks,
    PixArt's added conditions, Flux's position ids and guidance, exactly as the pipeline passes them; where
    the pipeline batches classifier-free guidance as ``[uncond | cond]``, the conditional rows only) and
    ``on_step_end`` the final latents ``x0`` (Flux: packed, as its transformer takes them). Fresh noise
    ``eps`` and noise levels, fixed per closure, then give the family's own objective, the transformer
    called with the recorded arguments, ``hidden_states = x_t`` and the noise level's timestep:

    - SD3 / SD3.5, Flux, Sana: flow matching, ``x_t = (1 - s) x0 + s eps``, ``s = sigmoid(N(0, 1))``,
      loss ``MSE(v, eps - x0)``; the timestep as the pipeline passes it at noise level ``s``
      (:func:`flow_timestep`; ``N`` = the scheduler's ``num_train_timesteps``): ``s N`` for SD3, ``s N / 1000``
      for Flux (its pipeline divides by 1000, its transformer multiplies back), ``int(s N) timestep_scale``
      for Sana (DPM-Solver keeps integer timesteps). Flux.1-dev (guidance
      distilled) gets the guidance input 1.0: the loss is minimised by the conditional velocity, which is
      what the distilled model predicts at guidance 1 (at the sampling guidance it predicts the guided
      velocity, whose target is not ``eps - x0``). Flux.1-schnell has no guidance input.
    - PixArt-alpha / -sigma, DiT: epsilon prediction (DDPM), integer ``t`` uniform in ``[0, N)``,
      ``x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps`` with ``abar`` the scheduler's ``alphas_cumprod``,
      loss ``MSE(first C output channels, eps)`` (the learned-variance channels dropped, as the pipeline
      drops them; a Sana transformer with twice the latent channels out is treated the same way, as its
      pipeline does). HunyuanDiT: the same with v prediction, target ``sqrt(abar_t) eps - sqrt(1 - abar_t) x0``.

    The sampling runs here (``n_batches`` pipeline calls of ``steps`` steps; few steps are cheap but give
    rougher ``x0``); each closure is one transformer forward. Raises UnsupportedError naming the family
    where the checkpoint's objective is not the one above (a PixArt scheduler that does not predict
    its adapter's objective, an SD3 / Flux / Sana scheduler that is not flow matching) or the family has no known
    objective: never an approximation.
    """
    if n_batches < 1 or (batch is not None and batch < 1):
        raise InputError(f"n_batches and batch must be at least 1, got {n_batches} and {batch}")
    if getattr(gen, "pipe", None) is not None:
        return _pipeline_loss_fns(gen, n_batches, 4 if batch is None else batch, seed, steps, guidance)
    batch = 16 if batch is None else batch

    rng = np.random.default_rng(seed)
    fns = []
    for _ in range(n_batches):
        ex = [generation_example(rng) for _ in range(batch)]
        x0 = torch.from_numpy(np.stack([sc.image for sc, _ in ex])).permute(0, 3, 1, 2).float() * 2 - 1
        sigma = torch.sigmoid(torch.from_numpy(rng.normal(0, 1, batch)).float())
        noise = torch.from_numpy(rng.standard_normal(x0.shape)).float()
        xt = (1 - sigma[:, None, None, None]) * x0 + sigma[:, None, None, None] * noise
        prompts = [p for _, p in ex]

        def fn(xt=xt, sigma=sigma, noise=noise, x0=x0, prompts=prompts):
            with torch.no_grad():
                cond = encode_prompts(gen.text_encoder, gen.tokenizer, prompts)
            v = transformer_forward(gen.transformer, gen.adapter, xt, sigma * 1000, cond)
            return torch.nn.functional.mse_loss(v.float(), noise - x0)
        fns.append(fn)
    return fns


def flow_timestep(gen, s: torch.Tensor) -> torch.Tensor:
    """The transformer timestep a flow-matching pipeline passes at noise level ``s``: the scheduler's
    timestep ``s N`` (``N = num_train_timesteps``; truncated to an integer where the scheduler keeps integer
    timesteps, as DPM-Solver does for Sana), then the family's :meth:`~unicache_lib.gen_families.base.GenFamily.
    flow_timestep` (SD3: as is, Flux: ``/ 1000``, Sana: ``* timestep_scale``)."""
    t = s.double() * int(gen.scheduler.config.num_train_timesteps)
    t = t if torch.is_floating_point(torch.as_tensor(gen.scheduler.timesteps)) else t.floor()
    return gen_family_of(gen.transformer).flow_timestep(t, gen.transformer).float()


def generation_objective(gen) -> str:
    """``"flow"`` (SD3 / SD3.5, Flux, Sana with a flow-matching scheduler), ``"epsilon"`` (PixArt, DiT with an
    epsilon-predicting scheduler) or ``"v"`` (HunyuanDiT, v-predicting): the training objective
    :func:`generation_loss_fns` uses for a pipeline, the family's
    :attr:`~unicache_lib.gen_families.base.GenFamily.objective` when the pipeline's scheduler agrees.
    UnsupportedError, naming the family and why, for anything else."""
    adapter = getattr(gen, "adapter", None) or gen_family_of(gen.transformer)
    fam, sched = adapter.key, gen.scheduler
    cname, pred = type(sched).__name__, sched.config.get("prediction_type")
    if adapter.objective == "flow":
        if cname.startswith("FlowMatch") or pred == "flow_prediction":
            return "flow"
        raise UnsupportedError(
            f"{fam}: the pipeline's scheduler {cname} (prediction_type {pred!r}) is not flow matching, so the "
            f"checkpoint's training objective is not the flow-matching loss generation_loss_fns implements for {fam}")
    if adapter.objective in ("epsilon", "v"):
        want = {"epsilon": "epsilon", "v": "v_prediction"}[adapter.objective]
        if pred == want and getattr(sched, "alphas_cumprod", None) is not None:
            return adapter.objective
        raise UnsupportedError(
            f"{fam}: the pipeline's scheduler {cname} predicts {pred!r}, not {want} (or has no alphas_cumprod); "
            f"generation_loss_fns implements {adapter.name}'s {want} DDPM loss only")
    known = ", ".join(f.key for f in GEN_FAMILIES.values() if f.objective)
    raise UnsupportedError(f"generation family {fam!r}: no training objective is known to generation_loss_fns "
                           f"(known: {known}); set its adapter's objective (and flow_timestep) to add one")


class _FirstCall:
    """Records the transformer's first call (arguments by name) and the latents after the last step."""

    def __init__(self, transformer):
        self.sig = inspect.signature(transformer.forward)
        self.kwargs: dict | None = None
        self.latents: torch.Tensor | None = None

    def pre_hook(self, module, args, kwargs):
        if self.kwargs is not None:
            return
        out = {}
        for name, v in self.sig.bind(*args, **kwargs).arguments.items():
            kind = self.sig.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                out.update(v)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if v:
                    raise ContractError(f"the transformer was called with {len(v)} extra positional arguments")
            else:
                out[name] = v
        self.kwargs = out

    def on_step_end(self, step, t, latents):
        self.latents = latents.detach().clone()


def _cond_rows(v, rows: int, half: slice):
    """The conditional ``half`` of every tensor batched with classifier-free guidance (``rows`` = twice the prompts)."""
    return ((v[half] if v.dim() and v.shape[0] == rows else v) if torch.is_tensor(v)
            else {k: _cond_rows(x, rows, half) for k, x in v.items()} if isinstance(v, dict) else v)


def record_transformer_call(gen, prompts: list[str], steps: int, guidance: float, seed) -> tuple[dict, torch.Tensor]:
    """Sample ``prompts`` through the pipeline (:func:`~unicache_lib.runtime.sampling.sample`) and return
    ``(kwargs, latents)``: the arguments of the transformer's first call by name, exactly as the pipeline
    passed them (where it batches classifier-free guidance as ``[uncond | cond]``, the conditional rows
    only), and the latents after the last step (``on_step_end``; Flux: packed)."""
    tr = gen.transformer
    rec = _FirstCall(tr)
    with forward_hooks([(tr, "forward_pre", rec.pre_hook)]):
        sample(gen, prompts, steps, guidance, seed=seed, callbacks=[rec])
    kw, b = rec.kwargs, len(prompts)
    rows = kw["hidden_states"].shape[0]
    if rows == 2 * b:  # [uncond | cond], DiT [cond | uncond]
        half = slice(None, b) if gen.adapter.cond_first else slice(b, None)
        kw = {k: _cond_rows(v, rows, half) for k, v in kw.items()}
    elif rows != b:
        raise ContractError(f"{gen.family}: the transformer saw {rows} rows for {b} prompts")
    if rec.latents.shape != kw["hidden_states"].shape:
        raise ContractError(f"{gen.family}: final latents {tuple(rec.latents.shape)} are not shaped as the "
                           f"transformer's input {tuple(kw['hidden_states'].shape)}")
    return kw, rec.latents


@dataclass
class LossBatch:
    """One batch of a pipeline's :func:`generation_loss_fns` loss. ``kwargs``: the transformer's recorded
    arguments (conditional rows; ``hidden_states`` and ``timestep`` left out; Flux.1-dev's guidance set to
    1); ``x0``: clean latents (the pipeline's samples), ``noise``, ``level`` (flow: ``s [B]``; PixArt:
    integer ``t [B]``), ``xt`` and ``timestep`` as the transformer takes them, ``target`` (float32)."""

    prompts: list
    objective: str
    kwargs: dict
    x0: torch.Tensor
    noise: torch.Tensor
    level: torch.Tensor
    xt: torch.Tensor
    timestep: torch.Tensor
    target: torch.Tensor


def pipeline_loss_batches(gen, n_batches: int = 4, batch: int = 4, seed: int = 0, steps: int = 2,
                          guidance: float = 3.0) -> list[LossBatch]:
    """The fixed batches behind a pipeline's :func:`generation_loss_fns` (its docstring says what they are)."""
    objective = generation_objective(gen)  # before any sampling
    sched = gen.scheduler
    n_train = int(sched.config.num_train_timesteps)
    rng = np.random.default_rng(seed)
    n = n_batches * batch
    n_pairs = int(round(0.3 * n))
    items = prompt_set(n - n_pairs, n_pairs, seed)
    prompts = [items[j]["long"] if rng.random() < 0.5 else items[j]["short"] for j in rng.permutation(n)]
    out = []
    for b in range(n_batches):
        ps = prompts[b * batch : (b + 1) * batch]
        kw, latents = record_transformer_call(gen, ps, steps, guidance, [seed + b * batch + i for i in range(len(ps))])
        x_in, t_in = kw.pop("hidden_states"), kw.pop("timestep")
        device = x_in.device
        x0 = latents.to(device=device, dtype=torch.float32)
        noise = torch.from_numpy(rng.standard_normal(tuple(x0.shape))).float().to(device)
        view = (-1,) + (1,) * (x0.dim() - 1)
        if objective == "flow":
            level = torch.sigmoid(torch.from_numpy(rng.normal(0, 1, len(ps))).float())
            s = level.view(view).to(device)
            xt, target, t = (1 - s) * x0 + s * noise, noise - x0, flow_timestep(gen, level)
            if kw.get("guidance") is not None:  # guidance-distilled (Flux.1-dev): the conditional velocity
                kw["guidance"] = torch.ones_like(kw["guidance"])
        else:
            level = t = torch.from_numpy(rng.integers(0, n_train, len(ps)))
            abar = sched.alphas_cumprod[level].float().view(view).to(device)
            xt = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
            target = noise if objective == "epsilon" else abar.sqrt() * noise - (1 - abar).sqrt() * x0
        kw["return_dict"] = False
        out.append(LossBatch(ps, objective, kw, x0, noise, level, xt.to(x_in.dtype),
                             t.to(device=device, dtype=t_in.dtype), target))
    return out


def _pipeline_loss_fns(gen, n_batches: int, batch: int, seed: int, steps: int, guidance: float) -> list:
    tr = gen.transformer
    latent_c = int(tr.config.in_channels)

    def fn(lb: LossBatch):
        out = tr(**lb.kwargs, hidden_states=lb.xt, timestep=lb.timestep)
        out = out[0] if isinstance(out, (tuple, list)) else out.sample
        # as the pipeline: the first latent_c channels predict the noise
        out = out[:, :latent_c] if gen.adapter.learned_sigma and out.shape[1] == 2 * latent_c else out
        return torch.nn.functional.mse_loss(out.float(), lb.target)

    return [functools.partial(fn, lb) for lb in pipeline_loss_batches(gen, n_batches, batch, seed, steps, guidance)]


def _fractions(space, fractions) -> list[float]:
    """The sweep's fractions, checked as fractions and as the head counts :meth:`~.heads.HeadSpace.keep_mask` prunes
    (``round(fraction x n_heads)``, at most one head short of every unit): two fractions that prune one count, or a
    fraction past the floor, are rows labelled by a fraction that was not pruned: each is said in a warning (a lesson
    run on a model of few heads still ends)."""
    out = check_fractions(fractions, "fraction", upper_inclusive=False, meaning="of the heads pruned")
    for i, f in enumerate(out):
        n, top, k, g = space.n_heads, space.n_heads - len(space.units), round(f * space.n_heads), next(
            (g for g in out[:i] if round(g * space.n_heads) == round(f * space.n_heads)), None)
        if k > top or g is not None or (f and not k):  # said, not refused: a lesson on a small model still runs
            warnings.warn(f"at most {top} of {n} heads can be pruned (one per unit stays): fraction {f:g} asks for "
                          f"{k}; its row prunes {top}; the largest fraction is {top / n:.4g}" if k > top else
                          f"fractions {g:g} and {f:g} both prune {k} of {n} heads: their two rows are one measurement "
                          f"under two labels; drop one" if g is not None else
                          f"fraction {f:g} prunes round({f:g} x {n}) = 0 heads (its row is the unpruned model): a "
                          f"fraction prunes a head from above {0.5 / n:g}; 1/{n} = {1 / n:.4g} prunes one",
                          UserWarning, stacklevel=3)
    return out


def _sweep(space, scores: dict, fractions: list, reference, run, metrics, progress) -> pd.DataFrame:
    """One row per (scorer, fraction): ``metrics(out)`` of ``out = run()`` with the heads that scorer ranks last
    pruned at that fraction (``reference`` at fraction 0: nothing pruned, nothing run)."""
    rows = []
    for label, s in bar(scores.items(), progress, desc="pruning sweep"):
        for f in fractions:
            keep = space.keep_mask(s, f)
            if f == 0:
                out = reference
            else:
                with HeadMask(space, keep):
                    out = run()
            rows.append({"scorer": label, "fraction": f, "pruned": int((keep == 0).sum()), **metrics(out)})
    return pd.DataFrame(rows)


def sweep_understanding(model, processor, space, scores: dict, fractions, qas, ref_logp=None, progress: bool | None = None):
    """Accuracy / agreement / KL for every (scorer, fraction). ``scores``: label -> ``[units, heads]``.
    Returns a tidy DataFrame with one row per (label, fraction); ``correct_q`` holds the per-question
    outcomes (bool ``[N]``)."""
    fractions = _fractions(space, fractions)  # before the reference runs
    ref = answer_logprobs(model, processor, qas) if ref_logp is None else ref_logp
    return _sweep(space, scores, fractions, ref, lambda: answer_logprobs(model, processor, qas),
                  lambda lp: understanding_metrics(lp, ref, processor, qas), progress)


def sweep_generation(gen, space, scores: dict, fractions, prompts, objects, steps=20, guidance=3.0, seed=0,
                     progress: bool | None = None):
    """PSNR / SSIM vs the unpruned images and prompt following for every (scorer, fraction), on the
    decoded images of ``sample(gen, prompts, steps, guidance, seed)``: the tiny generators' pixels or a
    pipeline's VAE-decoded output (:class:`~unicache_lib.runtime.pipelines.PipelineGenerator`), every run with
    the same seeds. Returns ``(DataFrame with one row per (scorer, fraction), reference uint8 images)``."""
    fractions = _fractions(space, fractions)  # before the reference runs
    ref = to_uint8(sample(gen, prompts, steps, guidance, seed=seed))
    return _sweep(space, scores, fractions, ref, lambda: to_uint8(sample(gen, prompts, steps, guidance, seed=seed)),
                  lambda imgs: generation_metrics(imgs, ref, objects), progress), ref
