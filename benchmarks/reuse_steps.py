"""Cross-step reuse at 20 and at 50 denoising steps on the shipped generators: how `step_skip` scales with the step
count, against the fewer-step control (issue #31, item 2; the anchors report at 50 steps).

For each generator and step count: no reuse, `step_skip` at its tuned setting (stride 3) and at coarser strides
(fewer transformer calls), and fewer-step sampling at a sweep of step counts; PSNR of each against the same
generator's images without reuse at that step count, wall-clock speed-up over interleaved repeats in shuffled order,
and each method's PSNR margin over the fewer-step control at its own speed-up and at its own FLOPs
(`reuse.control.control_table`, which refuses a sweep whose timings are not monotone).

    python benchmarks/reuse_steps.py --prompts 32         # 32 scored prompts, 8 timed, 10 repeats (results/reuse_steps.txt)
    python benchmarks/reuse_steps.py --prompts 2 --repeats 2 --steps 20   # a smoke run
    python benchmarks/reuse_steps.py --standins --steps 50 --repeats 3    # the schedules timed on the pipeline stand-ins

Rows at each step count:
- ``step_skip`` at its shipped setting (tuned at 20 steps on design prompts) and at coarser strides (the trade);
- at 50 steps, ``step_skip (tuned at 50)``: the setting ``benchmarks/tune_step_skip.py --steps 50 --max-computed 12``
  chose on the design prompts (``results/tune_step_skip_50.json``; these scored prompts are disjoint from them);
- TaylorSeer's higher-order prediction two ways: ``step_skip (order 2, w=1)``, the Taylor/Newton extrapolation of
  the whole output on the same schedule (TaylorSeer's predictor at exactly step_skip's FLOPs), and diffusers'
  ``TaylorSeerCacheConfig`` itself: at its defaults (attention modules, interval 5, order 1) and in lite mode
  (whole blocks skipped, the output projection predicted) at intervals near step_skip's FLOPs, orders 1 and 2;
  lite mode is refused on SD3's layout (the row says why);
- fewer-step sampling at a sweep of step counts: the control, read at each method's speed-up and FLOPs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


TUNED_50 = Path(__file__).parent / "results" / "tune_step_skip_50.json"
TAYLOR_INTERVALS = {20: (3,), 50: (5, 6)}  # lite-mode intervals near step_skip's transformer calls


def tuned_50() -> dict | None:
    """The 50-step setting chosen on the design prompts (None before the tuning has run)."""
    if not TUNED_50.exists():
        return None
    c = json.loads(TUNED_50.read_text())
    return {k: c[k] for k in ("head", "tail", "stride", "weight", "order")}


def run(gen_name: str, steps: int, prompts: int, repeats: int, strides=(3, 5, 8), timing_prompts: int = 8):
    from unicache_lib.core.models import quiet
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.control import control_table, fewer_steps_methods
    from unicache_lib.reuse.evaluate import run_reuse
    from unicache_lib.reuse.peers import DiffusersCache
    from unicache_lib.reuse.policies.step_skip import StepSkip
    from unicache_lib.world.text import prompt_set
    from unicache_lib.zoo.loaders import load_generator

    gen = load_generator(gen_name)
    ps = prompt_set(prompts, 0, 0)
    texts, objs = [p["short"] for p in ps], [p["objects"][0] for p in ps]
    methods = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), steps)}
    policies = {f"step_skip (stride {s})": StepSkip(stride=s) for s in strides}
    tuned = tuned_50() if steps == 50 else None
    best = StepSkip(**tuned) if tuned else StepSkip()
    if tuned:
        policies["step_skip (tuned at 50)"] = best
    # TaylorSeer's predictor (finite differences = the Lagrange polynomial, undamped) on the same schedule
    policies["step_skip (order 2, w=1)"] = StepSkip(best.head, best.tail, best.stride, weight=1.0, order=2)
    for label, pol in policies.items():
        methods[label] = lambda pol=pol: ReuseCache(gen.transformer, pol, steps)
    methods["diffusers:taylorseer"] = lambda: DiffusersCache(gen, "taylorseer", steps)
    for n in TAYLOR_INTERVALS.get(steps, (3,)):
        for o in (1, 2):
            opts = {"use_lite_mode": True, "cache_interval": n, "max_order": o}
            methods[f"diffusers:taylorseer lite (N={n}, order {o})"] = lambda opts=opts: DiffusersCache(gen, "taylorseer", steps,
                                                                                                        options=opts)
    fewer = sorted({max(2, round(steps * f)) for f in (0.15, 0.2, 0.25, 0.3, 0.35, 0.45, 0.55, 0.7, 0.85)})
    methods |= fewer_steps_methods(fewer)
    with quiet(loggers=("diffusers.hooks.taylorseer_cache",)):  # "Lite mode overrides user patterns." at every apply
        df = run_reuse(gen, methods, texts, objs, steps, 3.0, 0, min(prompts, timing_prompts), repeats, progress=False)
    calls = {label: sum(pol.schedule(steps)) for label, pol in policies.items()}
    print(f"\n{gen_name}, {steps} steps, {prompts} prompts ({min(prompts, timing_prompts)} timed), {repeats} interleaved "
          f"repeats (speed-up: median paired ratio, "
          "95% interval over repeats; PSNR against no reuse at the same step count)")
    cols = ["speedup", "speedup_lo", "speedup_hi", "flops", "psnr", "ssim"]
    shown = df.reindex(columns=cols + ["note"]).assign(note=lambda d: d.note.fillna("").str.slice(0, 70))
    print(shown.assign(transformer_calls=[calls.get(m, float("nan")) for m in df.index]).round(3).to_string())
    print("PSNR margin over fewer-step sampling at the same speed-up / FLOPs (dB, 95% interval over prompts):")
    try:
        print(control_table(df).round(2).to_string())
    except ValueError as e:  # a scrambled sweep is refused, naming the rows: say so, the rows above stand
        print(f"control not read: {e}")


def standins(names, steps: int, repeats: int, prompt: str = "a red circle on the left"):
    """The same schedules timed on pipeline stand-ins (random weights at real depth and token counts: time only, their
    images mean nothing): the whole pipeline call with no reuse, with ``step_skip`` at its setting for ``steps`` (the
    50-step one at 50), and with fewer-step sampling at as many transformer calls; ``repeats`` interleaved rounds after
    a one-step warm-up, transformer calls counted."""
    import tempfile

    import numpy as np

    from unicache_lib.intervals import interleaved_timings
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.policies.step_skip import StepSkip
    from unicache_lib.zoo import gen_standins
    from unicache_lib.zoo.loaders import load_generator
    from unicache_lib.zoo.sampling import sample

    tuned = tuned_50() if steps == 50 else None
    policy = StepSkip(**tuned) if tuned else StepSkip()
    calls = sum(policy.schedule(steps))
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            gen = load_generator(gen_standins.build(name, tmp))
            ran = [0]
            counts = {}
            stack = [m for m in gen.transformer.children() if isinstance(m, torch.nn.ModuleList)][0][0]
            hook = stack.register_forward_pre_hook(lambda *a: ran.__setitem__(0, ran[0] + 1))

            def go(label, make, n):
                def f():
                    ran[0] = 0
                    with make() as cb:
                        sample(gen, [prompt], n, 3.0, seed=0, callbacks=[cb])
                    counts[label] = ran[0]
                return f

            runs = {"none": go("none", lambda: ReuseCache(gen, REUSE_POLICIES["none"](), steps), steps),
                    "step_skip": go("step_skip", lambda: ReuseCache(gen, policy, steps), steps),
                    f"steps:{calls}": go(f"steps:{calls}", lambda: ReuseCache(gen, REUSE_POLICIES["none"](), calls), calls)}
            try:
                sample(gen, [prompt], 1, 3.0, seed=0)  # warm-up
                times = interleaved_timings(runs, repeats)
            finally:
                hook.remove()
        print(f"\n{name} stand-in ({gen.image_tokens} image tokens), {steps} steps, 1 prompt, guidance 3.0, {repeats} "
              f"interleaved rounds of the whole pipeline call (random weights: time only)")
        print(f"{'method':>12} {'median s':>9} {'speed-up':>9} {'rounds':>22} {'transformer calls':>18}")
        for label, ts in times.items():
            r = times["none"] / ts
            print(f"{label:>12} {np.median(ts):9.2f} {np.median(r):8.2f}x {', '.join(f'{x:.2f}' for x in r):>22} "
                  f"{counts[label]:>10d} of {steps}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--timing-prompts", type=int, default=8, help="prompts in each timed batch")
    ap.add_argument("--steps", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--generators", nargs="+", default=["tiny-mmdit", "tiny-pixart"])
    ap.add_argument("--standins", nargs="*", default=None, metavar="NAME",
                    help="time the schedules on these pipeline stand-ins instead (sd3-medium pixart-sigma flux-dev; "
                         "results/reuse_steps_standins.txt), at each --steps, with --repeats rounds")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.standins is not None:
        for n in a.steps:
            standins(a.standins or ["sd3-medium", "pixart-sigma", "flux-dev"], n, a.repeats)
        return
    for g in a.generators:
        for n in a.steps:
            run(g, n, a.prompts, a.repeats, timing_prompts=a.timing_prompts)


if __name__ == "__main__":
    main()
