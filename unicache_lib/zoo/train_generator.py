"""Train a shipped tiny generator (``sd3`` MMDiT or ``pixart`` cross-attention DiT) from scratch.

    python -m unicache_lib.zoo.train_generator --family sd3 --out data/models/tiny-mmdit --seed 0

Rectified flow in pixel space on 32x32 scenes of one or two objects, text encoder trained jointly,
10% of prompts dropped for classifier-free guidance. Half the prompts are short ("a red circle on
the left"), half long (30+ words with clauses that do not change the picture). Bars are measured
on the reloaded checkpoint by segmenting generated images by colour; a model card is written.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..progress import bar, write
from ..world.scenes import COLOURS, POSITIONS, SHAPES
from ..world.segment import score_object
from ..world.text import long_prompt, short_prompt
from . import tiny_generators as tg
from .checksums import write_card
from .sampling import sample, to_uint8
from .tiny_generators import RADIUS, training_example  # noqa: F401
from .tiny_llava import build_tokenizer


def eval_prompts(n: int = 120, seed: int = 777) -> list[dict]:
    """Single-object prompts covering colour x shape x position evenly, in a seeded order."""
    rng = np.random.default_rng(seed)
    combos = [{"colour": c, "shape": s, "position": p} for c in COLOURS for s in SHAPES for p in POSITIONS]
    idx = np.concatenate([rng.permutation(len(combos)) for _ in range(n // len(combos) + 1)])[:n]
    return [combos[i] for i in idx]


def evaluate(gen: tg.Generator, objs: list[dict], long: bool = False, steps=20, guidance=3.0, seed=0,
             batch=40) -> dict:
    """Colour / position / shape correct rates over single-object prompts."""
    rng = np.random.default_rng(seed)
    prompts = [long_prompt([o], rng) if long else short_prompt([o]) for o in objs]
    imgs = []
    for s in range(0, len(prompts), batch):
        imgs.append(to_uint8(sample(gen, prompts[s : s + batch], steps, guidance, seed=seed + s)))
    imgs = np.concatenate(imgs)
    scores = [score_object(im, o) for im, o in zip(imgs, objs)]
    return {k: float(np.mean([sc[k] for sc in scores])) for k in scores[0]} | {"n": len(objs)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=tg.FAMILIES, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--n-eval", type=int, default=120)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--init-from", default=None, help="continue from a saved generator folder")
    ap.add_argument("--text-encoder", choices=("clip", "t5"), default=None,
                    help="default: the family's real kind (sd3: clip, pixart: t5)")
    args = ap.parse_args(argv)
    args.text_encoder = args.text_encoder or tg.TEXT_ENCODERS[args.family]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    from diffusers import FlowMatchEulerDiscreteScheduler

    tok = build_tokenizer()
    if args.init_from:
        from .loaders import load_generator

        gen = load_generator(args.init_from)  # float32 weights
        if gen.family != args.family:
            raise SystemExit(f"--init-from {args.init_from} is a {gen.family} model, not {args.family}")
    else:
        gen = tg.Generator(args.family, tg.build_transformer(args.family), tg.build_text_encoder(tok, kind=args.text_encoder),
                           tok, FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0))
    params = list(gen.transformer.parameters()) + list(gen.text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    warm = 200
    log = []
    quick = eval_prompts(30, seed=5)
    pbar = bar(range(args.steps), desc=f"training tiny {args.family}", mininterval=5)
    for step in pbar:
        gen.transformer.train()
        gen.text_encoder.train()
        p = (step - warm) / max(1, args.steps - warm)
        f = (step + 1) / warm if step < warm else 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * p))
        for g in opt.param_groups:
            g["lr"] = args.lr * f
        ex = [training_example(rng) for _ in range(args.batch)]
        prompts = ["" if rng.random() < 0.1 else pr for _, pr in ex]
        x0 = torch.from_numpy(np.stack([sc.image for sc, _ in ex])).permute(0, 3, 1, 2) * 2 - 1
        sigma = torch.sigmoid(torch.from_numpy(rng.normal(0, 1, args.batch)).float())  # logit-normal
        noise = torch.from_numpy(rng.standard_normal(x0.shape)).float()
        s = sigma[:, None, None, None]
        xt = (1 - s) * x0 + s * noise
        cond = tg.encode_prompts(gen.text_encoder, tok, prompts)
        v = tg.transformer_forward(gen.transformer, args.family, xt, sigma * 1000, cond)
        loss = torch.nn.functional.mse_loss(v, noise - x0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0:
            pbar.set_postfix(loss=f"{loss.item():.4f}")
            log.append({"step": step, "loss": loss.item()})
        if args.eval_every and (step + 1) % args.eval_every == 0:
            gen.transformer.eval()
            gen.text_encoder.eval()
            r = evaluate(gen, quick, steps=12)
            log.append({"step": step, "eval": r})
            write(f"step {step + 1}: {r}")
    train_min = (time.time() - t0) / 60
    out = Path(args.out)
    gen.transformer.to(torch.float16)
    gen.text_encoder.to(torch.float16)
    gen.save_pretrained(out)
    from .loaders import load_generator

    shipped = load_generator(out, verify=False)  # a card left by an earlier run records other weights
    objs = eval_prompts(args.n_eval)
    card = {
        "model": out.name, "family": args.family, "class": type(gen.transformer).__name__,
        "seed": args.seed, "args": vars(args), "image_size": tg.IMAGE_SIZE, "patch": tg.PATCH,
        "image_tokens": shipped.image_tokens, "text_tokens": tg.MAX_TEXT, "train_minutes": train_min,
        "sampling": {"steps": 20, "guidance": 3.0, "scheduler": "FlowMatchEulerDiscreteScheduler"},
        "eval_short_prompts": evaluate(shipped, objs), "eval_long_prompts": evaluate(shipped, objs, long=True),
        "storage_dtype": "float16", "torch": torch.__version__, "log": log,
    }
    write_card(out, card)
    print(json.dumps({k: card[k] for k in ("eval_short_prompts", "eval_long_prompts", "train_minutes")}, indent=1))


if __name__ == "__main__":
    main()
