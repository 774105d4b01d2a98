"""Where tiny-llava-576's prefill time goes (issue #63 item 4, target S5: a prefill-stage policy's prefill at <= 0.35x of
the full one at 128 of 576 image tokens), and the bound that sets.

One prompt, one torch thread, ``--repeats`` interleaved rounds; each round times, in turn: the vision tower on the
picture, the projector on its features, the language model on the full context (576 image tokens) and on a context
keeping 128 of them (the same text positions, as a prefill-stage policy feeds it), and the whole full prefill as
``prefill`` runs it. Medians and the spread (10th-90th percentile) of each part, and:

- the **bound**: ``(tower + projector + LM(128)) / (tower + projector + LM(576))`` — the smallest prefill ratio any
  policy that selects after the tower can reach on this model, selection itself free;
- the share of the full prefill each part takes.

    python benchmarks/prefill_parts.py                       # -> benchmarks/results/prefill_parts_tiny-llava-576.txt
"""
from __future__ import annotations

import argparse
import sys
import statistics
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import committed_or_outputs, write_result  # noqa: E402 - one rule for where a result goes

OUT = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llava-576")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--kept", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="default: results/prefill_parts_MODEL.txt")
    args = ap.parse_args(argv)
    path = committed_or_outputs(ap, args, OUT / f"prefill_parts_{Path(args.model).name}.txt")
    torch.set_num_threads(1)
    text = "\n\n".join(measure(args, impl) for impl in ("eager", "sdpa"))
    print(text)
    write_result(path, (text + "\n").encode(), ap.prog)
    return 0


def measure(args, impl: str) -> str:
    """The parts under one attention implementation (the decisive run uses eager: its policies read the maps)."""
    from unicache_lib.families import family_of
    from unicache_lib.kv.cache import placement, split_prompt
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set, scene_size

    model, processor = load_understanding(args.model, attn_implementation=impl)
    fam = family_of(model)
    q = heldout_set(1, seed=4242, size=scene_size(model))[0]
    sp = split_prompt(processor, q.scene.uint8(), q.question, model=model)
    dev, dtype = placement(model)
    pv = sp.pixel_values.to(dev, dtype)
    cfg = model.config
    lm = fam.language_model(model)
    ids = sp.context_ids.to(dev)
    img = sp.image_positions
    rng = np.random.default_rng(0)
    keep_img = torch.as_tensor(np.sort(rng.choice(len(img), args.kept, replace=False)))
    non_img = torch.tensor(sorted(set(range(ids.shape[1])) - set(img.tolist())))
    keep = torch.cat([non_img, img[keep_img]]).sort().values

    @torch.no_grad()
    def tower():
        return fam.vision_model(model)(pixel_values=pv, output_hidden_states=True)

    with torch.no_grad():
        vis = tower()
        layer = cfg.vision_feature_layer
        feats = vis.hidden_states[layer]
        if cfg.vision_feature_select_strategy == "default":
            feats = feats[:, 1:]
        embeds = model.get_input_embeddings()(ids)
        proj = fam.projector(model)(feats)
        embeds[0, img] = proj[0].to(embeds.dtype)
        small = embeds[:, keep]

    parts = {
        "tower": tower,
        "projector": lambda: fam.projector(model)(feats),
        "lm_full": lambda: lm(inputs_embeds=embeds, use_cache=True),
        f"lm_{args.kept}": lambda: lm(inputs_embeds=small, use_cache=True),
        "prefill_full": lambda: model(input_ids=ids, pixel_values=pv, use_cache=True),
    }
    times = {k: [] for k in parts}
    with torch.no_grad():
        for f in parts.values():  # warm-up
            f()
        for _ in range(args.repeats):
            for k, f in parts.items():
                t0 = time.perf_counter()
                f()
                times[k].append(1e3 * (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [f"{args.model}, {impl} attention: prefill parts, median ms [10th, 90th percentile] over {args.repeats} interleaved rounds, "
             f"one thread, context {ids.shape[1]} positions ({len(img)} image)"]
    for k, v in times.items():
        lo, hi = np.percentile(v, [10, 90])
        lines.append(f"{k:>14}: {med[k]:8.2f} [{lo:.2f}, {hi:.2f}]  {med[k] / med['prefill_full']:.3f} of the full prefill")
    fixed = med["tower"] + med["projector"]
    bound = (fixed + med[f"lm_{args.kept}"]) / (fixed + med["lm_full"])
    lines.append(f"bound: (tower + projector + LM({args.kept})) / (tower + projector + LM({len(img)})) = {bound:.3f}")
    lines.append(f"tower + projector: {fixed / (fixed + med['lm_full']):.3f} of the full prefill's parts; "
                 f"the language model on {args.kept} image tokens: {med[f'lm_{args.kept}'] / med['lm_full']:.3f}x its full time")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
