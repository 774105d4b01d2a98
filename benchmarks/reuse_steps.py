"""Cross-step reuse at 20 and at 50 denoising steps on the shipped generators: how `step_skip` scales with the step
count, against the fewer-step control (issue #31, item 2; the anchors report at 50 steps).

For each generator and step count: no reuse, `step_skip` at its tuned setting (stride 3) and at coarser strides
(fewer transformer calls), and fewer-step sampling at a sweep of step counts; PSNR of each against the same
generator's images without reuse at that step count, wall-clock speed-up over interleaved repeats in shuffled order,
and each method's PSNR margin over the fewer-step control at its own speed-up and at its own FLOPs
(`reuse.control.control_table`, which refuses a sweep whose timings are not monotone).

    python benchmarks/reuse_steps.py                      # 8 prompts, 10 repeats (results/reuse_steps.txt)
    python benchmarks/reuse_steps.py --prompts 2 --repeats 2 --steps 20   # a smoke run

The strides are not tuned at 50 steps (the tuned setting is stride 3 at 20 steps, on design prompts): the coarser
strides show the trade, they do not choose it.
"""
from __future__ import annotations

import argparse

import torch


def run(gen_name: str, steps: int, prompts: int, repeats: int, strides=(3, 5, 8)):
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.control import control_table, fewer_steps_methods
    from unicache_lib.reuse.evaluate import run_reuse
    from unicache_lib.reuse.policies.step_skip import StepSkip
    from unicache_lib.world.text import prompt_set
    from unicache_lib.zoo.loaders import load_generator

    gen = load_generator(gen_name)
    ps = prompt_set(prompts, 0, 0)
    texts, objs = [p["short"] for p in ps], [p["objects"][0] for p in ps]
    methods = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), steps)}
    for s in strides:
        methods[f"step_skip (stride {s})"] = lambda s=s: ReuseCache(gen.transformer, StepSkip(stride=s), steps)
    fewer = sorted({max(2, round(steps * f)) for f in (0.15, 0.2, 0.25, 0.3, 0.35, 0.45, 0.55, 0.7)})
    methods |= fewer_steps_methods(fewer)
    df = run_reuse(gen, methods, texts, objs, steps, 3.0, 0, prompts, repeats, progress=False)
    calls = {f"step_skip (stride {s})": sum(StepSkip(stride=s).schedule(steps)) for s in strides}
    print(f"\n{gen_name}, {steps} steps, {prompts} prompts, {repeats} interleaved repeats (speed-up: median paired ratio, "
          "95% interval over repeats; PSNR against no reuse at the same step count)")
    cols = ["speedup", "speedup_lo", "speedup_hi", "flops", "psnr", "ssim"]
    print(df[cols].assign(transformer_calls=[calls.get(m, float("nan")) for m in df.index]).round(3).to_string())
    print("PSNR margin over fewer-step sampling at the same speed-up / FLOPs (dB, 95% interval over prompts):")
    try:
        print(control_table(df).round(2).to_string())
    except ValueError as e:  # a scrambled sweep is refused, naming the rows: say so, the rows above stand
        print(f"control not read: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--generators", nargs="+", default=["tiny-mmdit", "tiny-pixart"])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    for g in a.generators:
        for n in a.steps:
            run(g, n, a.prompts, a.repeats)


if __name__ == "__main__":
    main()
