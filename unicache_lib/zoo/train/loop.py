"""The one optimisation loop every shipped recipe trains with (the recipes in this package keep only what differs: how to build the
model, the loss of one step, and the evaluation).

    stage = Stage("b", "stage b: language model", steps=4200, lr=2e-3, warmup=warmup(4200), betas=(0.9, 0.98))
    fit(stage, [{"params": proj, "lr_scale": 3.0}, {"params": rest}], step_loss, log)

``step_loss(step) -> (loss, read)``: draws the step's batch (from the recipe's own ``rng``, so a seed reproduces a
run), returns the loss to minimise and ``read() -> {name: float}``, the numbers to log, read after the update.
Every step: the learning rate of each parameter group set to ``lr * lr_scale * lr_at(step)`` (linear warm-up, then a
cosine down to 2%), AdamW, gradients clipped to norm 1. The log gets ``{"stage", "step", **read()}`` every
``log_every`` steps (and at the last one, unless ``log_last`` is off) and, every ``eval_every`` steps,
``{"stage", "step", **entries}`` from ``evaluate() -> (entries, message)``.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ...paths import cli_output_path
from ...progress import bar, write
from ...runtime.checksums import write_card
from ..shipping import load_previous, save_and_reload


def lr_at(step, total, warmup, floor=0.02):
    """Linear warm-up to 1, then a cosine down to ``floor`` (every shipped recipe's learning-rate scale)."""
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def warmup(steps: int, cap: int = 150) -> int:
    """The shipped recipes' warm-up: a tenth of the steps, at most ``cap``."""
    return min(cap, steps // 10 + 1)


@dataclass
class Stage:
    """One optimisation stage of a recipe. ``name``: the log's ``"stage"`` key (None: no key); ``desc``: the
    progress bar's text; AdamW's ``betas`` and ``weight_decay``."""

    name: str | None
    desc: str
    steps: int
    lr: float
    warmup: int
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.01
    log_every: int = 50
    log_last: bool = True
    eval_every: int = 0


def fit(stage: Stage, params, step_loss: Callable, log: list, evaluate: Callable | None = None,
        after_step: Callable | None = None) -> dict:
    """Run ``stage``: ``params`` a list of parameters or of AdamW groups (``{"params": [...], "lr_scale": 3.0}``);
    ``after_step(step)`` runs after each update (a codebook kept on the sphere, say). Returns the last numbers
    logged (``{}`` when nothing was)."""
    groups = params if params and isinstance(params[0], dict) else [{"params": list(params)}]
    opt = torch.optim.AdamW(groups, lr=stage.lr, betas=stage.betas, weight_decay=stage.weight_decay)
    every = [p for g in opt.param_groups for p in g["params"]]
    head = {"stage": stage.name} if stage.name is not None else {}
    last: dict = {}
    pbar = bar(range(stage.steps), desc=stage.desc, mininterval=5)
    for step in pbar:
        for g in opt.param_groups:
            g["lr"] = stage.lr * g.get("lr_scale", 1.0) * lr_at(step, stage.steps, stage.warmup)
        loss, read = step_loss(step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(every, 1.0)
        opt.step()
        if after_step is not None:
            after_step(step)
        if step % stage.log_every == 0 or (stage.log_last and step == stage.steps - 1):
            last = read()
            pbar.set_postfix({k: f"{v:.4g}" for k, v in last.items()})
            log.append({**head, "step": step, **last})
        if evaluate is not None and stage.eval_every and (step + 1) % stage.eval_every == 0:
            entries, message = evaluate()
            log.append({**head, "step": step, **entries})
            write(f"step {step + 1}: {message}")
    return last


def recipe_parser(doc: str, *, out: str | None, lr: float, eval_every: int = 500,
                  ints: dict[str, int] | None = None) -> argparse.ArgumentParser:
    """The command line every recipe shares (``--out``, ``--seed``, ``--lr``, ``--threads``, ``--eval-every``,
    ``--init-from``) and the recipe's own whole-number options ``ints`` (option -> default); a recipe adds its other
    options and reads them with :func:`parse`. ``out=None``: required."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=out, required=out is None, help="where the weights and the model card go")
    for name, default in {"--seed": 0, **(ints or {})}.items():
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--eval-every", type=int, default=eval_every, help="held-out evaluation every N steps (0: none)")
    ap.add_argument("--init-from", default=None, help="continue from a saved checkpoint (stage b only where a recipe "
                                                      "has stages: pass --steps-a 0); the card keeps the earlier run")
    return ap


def vqa_options(ap: argparse.ArgumentParser, *, steps_b: int, batch_b: int, weights_help: str,
                curriculum: bool = False) -> None:
    """The options of the recipes that train a vision tower (stage a, patch heads) and then a language model (stage b)
    on the world's questions; ``curriculum``: ``--single-frac`` and ``--exists-negatives`` too."""
    for name, default in (("--steps-a", 1100), ("--steps-b", steps_b), ("--batch-a", 64), ("--batch-b", batch_b),
                          ("--n-heldout", 1500), ("--n-captions", 200)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--qtype-weights", default="", help=weights_help)
    if curriculum:
        ap.add_argument("--single-frac", type=float, default=None,
                        help="share of stage-b steps on one-object scenes only (default: 0.08, or 0 with --init-from)")
        ap.add_argument("--exists-negatives", default="hard", choices=("hard", "random"),
                        help="'is there a ...?' negatives in training: 'hard' (share a colour or shape with a present "
                             "object, as every held-out set) or 'random' (any absent colour x shape): an easier curriculum")


def qtype_weights(args: argparse.Namespace) -> dict[str, float]:
    """``--qtype-weights colour=3,exists=3`` as ``{"colour": 3.0, "exists": 3.0}`` (the other types weigh 1)."""
    return {k: float(v) for k, v in (kv.split("=") for kv in args.qtype_weights.split(",") if kv)}


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse the command line and apply ``--threads``."""
    args = ap.parse_args(argv)
    # not empty, not the repository or a folder of it but outputs/, runs/ and data/models/ (the shipped models a recipe
    # retrains: `make models`)
    cli_output_path(args.out, ap.prog, within=("data/models",))
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


@dataclass
class Run:
    """A recipe's run (:func:`start`): its command line, the model and processor (built, or continued from
    ``--init-from`` with that run's card as ``previous``), the seeded ``rng``, the clock and the training ``log``."""

    args: argparse.Namespace
    model: object
    processor: object
    previous: dict | None
    rng: np.random.Generator
    t0: float
    log: list = field(default_factory=list)

    def minutes(self) -> float:
        return (time.time() - self.t0) / 60


def start(args: argparse.Namespace, model_class: str | Callable, build: Callable) -> Run:
    """The run: ``build() -> (model, processor)``, or the checkpoint ``--init-from`` names, loaded as ``model_class``
    (:func:`~unicache_lib.zoo.shipping.load_previous`) or by ``model_class(path) -> (model, processor, previous)``."""
    rng, t0 = np.random.default_rng(args.seed), time.time()
    if args.init_from:
        load = model_class if callable(model_class) else (lambda path: load_previous(path, model_class))
        return Run(args, *load(args.init_from), rng, t0)
    return Run(args, *build(), None, rng, t0)


def ship(run: Run, measure: Callable, show: tuple, **head) -> None:
    """Save the model where ``--out`` says and write its card: ``head``, then ``measure(model) -> {name: entry}`` on
    the reloaded fp16 checkpoint (every number on the card is measured on what ships), then the run's own entries;
    print the ``show`` entries and the training minutes."""
    train_min = run.minutes()
    out = Path(run.args.out)
    model = save_and_reload(run.model, run.processor, out)
    card = {**head, "class": type(model).__name__, "seed": run.args.seed, "args": vars(run.args), **measure(model),
            "train_minutes": train_min, "storage_dtype": "float16", "torch": torch.__version__, "log": run.log,
            "previous_run": run.previous}
    write_card(out, card)
    print(json.dumps({k: card[k] for k in (*show, "train_minutes")}, indent=1))
