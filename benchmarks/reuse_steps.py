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
    python benchmarks/reuse_steps.py --settle 4 --steps 50   # the 50-step margin at equal FLOPs on every held-out text x 4 seeds

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

import pandas as pd
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
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.world.text import prompt_set

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

    from unicache_lib.core.hooks import forward_hooks
    from unicache_lib.intervals import interleaved_timings
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.policies.step_skip import StepSkip
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.zoo.builders import gen_standins

    tuned = tuned_50() if steps == 50 else None
    policy = StepSkip(**tuned) if tuned else StepSkip()
    calls = sum(policy.schedule(steps))
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            gen = load_generator(gen_standins.build(name, tmp))
            ran = [0]
            counts = {}
            stack = [m for m in gen.transformer.children() if isinstance(m, torch.nn.ModuleList)][0][0]

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
            with forward_hooks([(stack, "forward_pre", lambda *a: ran.__setitem__(0, ran[0] + 1))]):  # block-0 calls
                sample(gen, [prompt], 1, 3.0, seed=0)  # warm-up
                times = interleaved_timings(runs, repeats)
        print(f"\n{name} stand-in ({gen.image_tokens} image tokens), {steps} steps, 1 prompt, guidance 3.0, {repeats} "
              f"interleaved rounds of the whole pipeline call (random weights: time only)")
        print(f"{'method':>12} {'median s':>9} {'speed-up':>9} {'rounds':>22} {'transformer calls':>18}")
        for label, ts in times.items():
            r = times["none"] / ts
            print(f"{label:>12} {np.median(ts):9.2f} {np.median(r):8.2f}x {', '.join(f'{x:.2f}' for x in r):>22} "
                  f"{counts[label]:>10d} of {steps}", flush=True)


def settle(gen_name: str, steps: int, seeds_per_text: int, bar: float = 3.0):
    """Settle the tuned ``step_skip``'s PSNR margin over fewer-step sampling at equal FLOPs on more samples than the
    timed run scores: every one-object prompt text that is not a design prompt (74 of the world's 90), each sampled
    with ``seeds_per_text`` noise seeds (1000 + k; the texts are disjoint from the design prompts). The
    margin is read per sample against the control interpolated at the method's FLOPs (fewer-step runs bracketing
    it), averaged over a text's seeds, and its 95% BCa interval is taken over texts (the unit a reader generalises
    over). Verdict on the interval against ``bar``: holds / does not hold / inconclusive. No timing."""
    import numpy as np

    from unicache_lib.intervals import mean_interval, n_to_settle
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.control import control_psnr_at, control_rows, fewer_steps_methods
    from unicache_lib.reuse.evaluate import score_methods
    from unicache_lib.reuse.policies.step_skip import StepSkip
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.world.text import COLOURS, POSITIONS, SHAPES, prompt_set

    n_combos = len(COLOURS) * len(SHAPES) * len(POSITIONS)
    design = {p["short"] for p in prompt_set(52, 0, 0)[36:52]}  # benchmarks/tune_step_skip.py's design prompts
    ps = [p for p in prompt_set(n_combos, 0, 0) if p["short"] not in design]
    texts = [p["short"] for p in ps for _ in range(seeds_per_text)]
    objs = [p["objects"][0] for p in ps for _ in range(seeds_per_text)]
    seeds = [1000 + k for _ in ps for k in range(seeds_per_text)]
    tuned = tuned_50() if steps == 50 else None
    pol = StepSkip(**tuned) if tuned else StepSkip()
    calls = sum(pol.schedule(steps))
    gen = load_generator(gen_name)
    methods = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), steps),
               "step_skip": lambda: ReuseCache(gen.transformer, pol, steps)}
    methods |= fewer_steps_methods([calls - 2, calls, calls + 3])
    rows, _, _ = score_methods(gen, methods, texts, objs, steps, 3.0, seeds, progress=True)
    df = pd.DataFrame(list(rows.values())).set_index("method")
    x = float(df.loc["step_skip", "flops"])
    per_sample = np.asarray(df.loc["step_skip", "psnr_per_prompt"], dtype=np.float64) - control_psnr_at(
        control_rows(df), x, "flops")
    per_text = per_sample.reshape(len(ps), seeds_per_text).mean(axis=1)
    iv = mean_interval(per_text, "prompt texts")
    verdict = "holds" if iv.lo >= bar else "does not hold" if iv.hi < bar else "inconclusive"
    print(f"\n{gen_name}, {steps} steps, step_skip {calls} of {steps} calls (FLOPs {x:.3f}): {len(ps)} held-out texts x "
          f"{seeds_per_text} seeds = {len(texts)} samples")
    print(df[["flops", "psnr"]].round(3).to_string())
    print(f"margin over fewer steps at equal FLOPs: {iv.value:+.2f} dB [{iv.lo:+.2f}, {iv.hi:+.2f}] (95% BCa over "
          f"{iv.n} texts); bar +{bar:g} dB: {verdict}"
          + (f" (about {n_to_settle(iv, bar):.0f} texts would settle it)" if verdict == "inconclusive" else ""),
          flush=True)


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
    ap.add_argument("--settle", type=int, default=None, metavar="SEEDS",
                    help="settle the margin at equal FLOPs instead: every held-out text x SEEDS noise seeds, no timing")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.settle:
        for g in a.generators:
            for n in a.steps:
                settle(g, n, a.settle)
        return
    if a.standins is not None:
        for n in a.steps:
            standins(a.standins or ["sd3-medium", "pixart-sigma", "flux-dev"], n, a.repeats)
        return
    for g in a.generators:
        for n in a.steps:
            run(g, n, a.prompts, a.repeats, timing_prompts=a.timing_prompts)


if __name__ == "__main__":
    main()
