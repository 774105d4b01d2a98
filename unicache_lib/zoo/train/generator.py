"""Train a shipped tiny generator (``sd3`` MMDiT or ``pixart`` cross-attention DiT) from scratch.

    python -m unicache_lib.zoo.train.generator --family sd3 --out data/models/tiny-mmdit --seed 0

Rectified flow in pixel space on 32x32 scenes of one or two objects, text encoder trained jointly,
10% of prompts dropped for classifier-free guidance. Half the prompts are short ("a red circle on
the left"), half long (30+ words with clauses that do not change the picture). Bars are measured
on the reloaded checkpoint by segmenting generated images by colour; a model card is written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ...core.compat import diffusers
from ...gen_families import GEN_FAMILIES
from ...runtime.checksums import write_card
from ...runtime.loaders import load_generator
from ...runtime.sampling import sample, to_uint8
from ...runtime.tiny_layouts import MAX_TEXT, Generator, encode_prompts, transformer_forward
from ...world.scenes import COLOURS, POSITIONS, SHAPES
from ...world.segment import score_object
from ...world.text import generation_example, long_prompt, short_prompt
from .. import tiny_generators as tg
from ..tiny_llava import build_tokenizer
from .loop import Stage, fit, parse, recipe_parser, start


def eval_prompts(n: int = 120, seed: int = 777) -> list[dict]:
    """Single-object prompts covering colour x shape x position evenly, in a seeded order."""
    rng = np.random.default_rng(seed)
    combos = [{"colour": c, "shape": s, "position": p} for c in COLOURS for s in SHAPES for p in POSITIONS]
    idx = np.concatenate([rng.permutation(len(combos)) for _ in range(n // len(combos) + 1)])[:n]
    return [combos[i] for i in idx]


def evaluate(gen: Generator, objs: list[dict], long: bool = False, steps=20, guidance=3.0, seed=0,
             batch=40) -> dict:
    """Colour / position / shape correct rates over single-object prompts."""
    rng = np.random.default_rng(seed)
    prompts = [long_prompt([o], rng) if long else short_prompt([o]) for o in objs]
    imgs = np.concatenate([to_uint8(sample(gen, prompts[s : s + batch], steps, guidance, seed=seed + s))
                           for s in range(0, len(prompts), batch)])
    scores = [score_object(im, o) for im, o in zip(imgs, objs)]
    return {k: float(np.mean([sc[k] for sc in scores])) for k in scores[0]} | {"n": len(objs)}


def main(argv=None):
    ap = recipe_parser(__doc__, out=None, lr=1.5e-3, eval_every=1000,
                       ints={"--steps": 4000, "--batch": 32, "--n-eval": 120})
    pixel = {f.key: f for f in GEN_FAMILIES.values() if f.pixel_text_encoder}  # the families with a pixel-space layout
    ap.add_argument("--family", choices=tuple(pixel), required=True)
    ap.add_argument("--text-encoder", choices=("clip", "t5"), default=None,
                    help="default: the family's real kind (sd3: clip, pixart: t5)")
    args = parse(ap, argv)
    adapter = pixel[args.family]
    args.text_encoder = args.text_encoder or adapter.pixel_text_encoder
    torch.manual_seed(args.seed)
    tok = build_tokenizer()
    run = start(args, lambda path: (load_generator(path), tok, None),  # float32 weights
                lambda: (Generator(adapter, tg.build_transformer(adapter), tg.build_text_encoder(tok, kind=args.text_encoder),
                                   tok, diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)),
                         tok))
    gen, rng, log = run.model, run.rng, run.log
    if args.init_from and gen.family != args.family:
        raise SystemExit(f"--init-from {args.init_from} is a {gen.family} model, not {args.family}")
    quick = eval_prompts(30, seed=5)

    def step_loss(step):
        gen.transformer.train()
        gen.text_encoder.train()
        ex = [generation_example(rng) for _ in range(args.batch)]
        prompts = ["" if rng.random() < 0.1 else pr for _, pr in ex]
        x0 = torch.from_numpy(np.stack([sc.image for sc, _ in ex])).permute(0, 3, 1, 2) * 2 - 1
        sigma = torch.sigmoid(torch.from_numpy(rng.normal(0, 1, args.batch)).float())  # logit-normal
        noise = torch.from_numpy(rng.standard_normal(x0.shape)).float()
        s = sigma[:, None, None, None]
        xt = (1 - s) * x0 + s * noise
        v = transformer_forward(gen.transformer, adapter, xt, sigma * 1000, encode_prompts(gen.text_encoder, tok, prompts))
        loss = torch.nn.functional.mse_loss(v, noise - x0)
        return loss, lambda: {"loss": loss.item()}

    def held_out():
        gen.transformer.eval()
        gen.text_encoder.eval()
        r = evaluate(gen, quick, steps=12)
        return {"eval": r}, str(r)

    fit(Stage(None, f"training tiny {args.family}", args.steps, args.lr, 200, (0.9, 0.99), log_last=False,
              eval_every=args.eval_every), list(gen.transformer.parameters()) + list(gen.text_encoder.parameters()),
        step_loss, log, held_out)
    train_min = run.minutes()
    out = Path(args.out)
    gen.transformer.to(torch.float16)
    gen.text_encoder.to(torch.float16)
    gen.save_pretrained(out)

    shipped = load_generator(out, verify=False)  # a card left by an earlier run records other weights
    objs = eval_prompts(args.n_eval)
    card = {
        "model": out.name, "family": args.family, "class": type(gen.transformer).__name__,
        "seed": args.seed, "args": vars(args), "image_size": tg.IMAGE_SIZE, "patch": tg.PATCH,
        "image_tokens": shipped.image_tokens, "text_tokens": MAX_TEXT, "train_minutes": train_min,
        "sampling": {"steps": 20, "guidance": 3.0, "scheduler": "FlowMatchEulerDiscreteScheduler"},
        "eval_short_prompts": evaluate(shipped, objs), "eval_long_prompts": evaluate(shipped, objs, long=True),
        "storage_dtype": "float16", "torch": torch.__version__, "log": log,
    }
    write_card(out, card)
    print(json.dumps({k: card[k] for k in ("eval_short_prompts", "eval_long_prompts", "train_minutes")}, indent=1))


if __name__ == "__main__":
    main()
