"""Caching benchmarks, every ratio measured side by side in one run.

1. KV eviction at LLaVA-1.5-7B's attention shape (32 layers x 32 heads, 576 image tokens + a short
   text context; narrow head dimension so a CPU run stays short): bytes held and the time of one
   decode step on the full cache vs caches evicted by `key_coverage` to 50 / 25 / 10 % of the image
   positions, and what choosing costs (`key_coverage`'s k-center cover vs H2O's top-k) once per image.
1b. The same on the LLaVA-1.5-7B stand-in (random weights from the real config: 576 image tokens, 32 layers,
   reduced width) on one real question: `key_coverage` (cache stage: full prefill, then evicted) beside
   DivPrune, the same cover on the projected features (`key_coverage_features`) and on the first layer's keys
   (`key_coverage_prefill`) (prefill stage: only the kept
   tokens are prefilled) at 25 / 10 %: KV bytes, prefill time and
   the time of one decode step, each relative to the full cache.
2. Cross-step reuse on the shipped generators: wall-clock of a batch over interleaved repeats, every
   workbench policy and diffusers cache and the fewer-step control (``steps:N``), speed-up relative to no
   reuse, attention work and whole-transformer FLOPs, and each method's PSNR margin over the fewer-step
   control at its own speed-up and FLOPs.
3. The step-skip policy on the SD3-medium pipeline stand-in (real depth, heads and token counts, random
   weights; built into a temporary folder): wall-clock of the whole pipeline call (text encoders, the
   denoising loop, VAE decode) with and without step skipping, interleaved, and the transformer calls run.

    python benchmarks/caching.py            # or: make benchmark
"""
from __future__ import annotations

import argparse
import statistics

import torch


def eviction(layers=32, heads=32, head_dim=8, n_image=576, n_text=40, repeats=30):
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.kv.cache import evict, kv_bytes

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=heads * head_dim, intermediate_size=heads * head_dim * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096)
    from unicache_lib.kv.policies import POLICIES, EvictionContext

    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    C = 5 + n_image + n_text
    ids = torch.randint(0, 512, (1, C))
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, output_attentions=True)
    image = torch.arange(5, 5 + n_image)
    reads = [(lambda li=li: (cache.layers[li].keys[0], cache.layers[li].values[0])) for li in range(layers)]
    ctx = EvictionContext(C, image, layers, [a[0].float() for a in out.attentions], kv=reads)
    del out
    choosers = {n: (lambda n=n, b=b: POLICIES[n]().select(ctx, b)) for n in ("key_coverage", "h2o") for b in (0.25,)}
    choose_t = interleaved_timings(choosers, max(3, repeats // 5))
    print(f"\nchoosing 25% of {n_image} image positions in {layers} layers, once per image (median of {max(3, repeats // 5)}): "
          + ", ".join(f"{n} {1e3 * statistics.median(t):.0f} ms" for n, t in choose_t.items()))
    from unicache_lib.kv.policies.key_coverage import farthest_point

    wide = torch.randn(n_image, 4096)  # one layer's image keys at LLaVA-1.5-7B's real width (32 heads x 128)
    t = interleaved_timings({"cover": lambda: farthest_point(wide, n_image // 4, 0)}, 3)["cover"]
    print(f"key_coverage at the real width (keys {n_image} x 4096 per layer): {1e3 * statistics.median(t):.0f} ms per layer, "
          f"~{layers * statistics.median(t):.1f} s per image on this CPU for {layers} layers (once per image, not per token)")
    caches = {"full": cache}
    for b in (0.5, 0.25, 0.1):
        caches[f"{b:.0%} image KV"] = evict(cache, POLICIES["key_coverage"]().select(ctx, b))
    held = {k: c.get_seq_length() for k, c in caches.items()}

    def trim():  # drop any decoded token again: every call sees the same cache
        for k, c in caches.items():
            for layer in c.layers:
                layer.keys, layer.values = layer.keys[:, :, :held[k]], layer.values[:, :, :held[k]]

    def step(c, n):
        return lambda: model(input_ids=torch.tensor([[1]]), past_key_values=c, position_ids=torch.tensor([[C]]),
                             attention_mask=torch.ones(1, n + 1, dtype=torch.long), use_cache=True)

    with torch.no_grad():
        times = interleaved_timings({k: step(c, held[k]) for k, c in caches.items()}, repeats, before=trim)
    full_b, full_t = kv_bytes(caches["full"]), statistics.median(times["full"])
    real = {k: c.get_seq_length() * layers * 2 * 4096 * 2 / 1e6 for k, c in caches.items()}  # fp16, hidden 4096
    print("\nKV held at LLaVA-1.5-7B's real width (fp16, 32 layers x 4096 x K and V): "
          + ", ".join(f"{k} {v:.0f} MB" for k, v in real.items()))
    print(f"\nKV eviction, {layers} layers x {heads} heads, context {C} ({n_image} image), {repeats} interleaved repeats "
          "in shuffled order (time/full: median paired ratio with its 95% interval over repeats)")
    print(f"{'cache':>16} {'KV MB':>8} {'bytes/full':>10} {'decode ms':>10} {'time/full':>22}")
    for k, c in caches.items():
        t = statistics.median(times[k])
        r = speedup_interval(times[k], times["full"], min_repeats=2)  # this cache's time / the full cache's
        print(f"{k:>16} {kv_bytes(c) / 1e6:8.2f} {kv_bytes(c) / full_b:10.3f} {1e3 * t:10.2f} "
              f"{r.value:8.3f} [{r.lo:.3f}, {r.hi:.3f}]")


def eviction_standin(repeats=10):
    import tempfile

    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.kv import POLICIES, evict, kv_bytes, prefill, split_prompt
    from unicache_lib.kv.cache import forward_question, prefill_pruned
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set
    from unicache_lib.zoo.builders import standins

    with tempfile.TemporaryDirectory() as tmp:
        model, proc = load_understanding(str(standins.build("llava-1.5-7b", tmp)), attn_implementation="eager")
    q = heldout_set(1, seed=7000)[0]
    sp = split_prompt(proc, q.scene.uint8(), q.question, model=model)
    pre = prefill(model, sp)
    ctx = pre.context()
    C, n_img = sp.context_ids.shape[1], ctx.n_image
    runs = {"full": (lambda: prefill(model, sp, attentions=False), lambda p: (p.cache, sp))}
    for b in (0.25, 0.1):
        keep = POLICIES["key_coverage"]().select(ctx, b)
        runs[f"key_coverage {b:.0%}"] = (lambda: prefill(model, sp, attentions=False),
                                         lambda p, keep=keep: (evict(p.cache, keep), sp))
        for name in ("divprune", "key_coverage_features", "key_coverage_prefill"):  # prefill stage: kept tokens only
            pol = POLICIES[name]()
            pick = pol.token_picker(ctx, b)
            runs[f"{name} {b:.0%}"] = (lambda pick=pick, pol=pol: prefill_pruned(model, sp, pick, renumber=pol.renumber)[0],
                                       lambda p: (p.cache, p.split))
    built = {n: after(make()) for n, (make, after) in runs.items()}
    held = {n: c.get_seq_length() for n, (c, _) in built.items()}
    dev = next(model.parameters()).device

    def trim():
        for n, (c, _) in built.items():
            for layer in c.layers:
                layer.keys, layer.values = layer.keys[:, :, :held[n]], layer.values[:, :, :held[n]]

    def step(n):
        c, s = built[n]
        pos = torch.tensor([[s.context_ids.shape[1]]], device=dev)
        return lambda: forward_question(s.family or sp.family, model, s.question_ids[:, :1].to(dev), c, pos)

    with torch.no_grad():
        pre_t = interleaved_timings({n: make for n, (make, _) in runs.items()}, max(3, repeats // 2))
        dec_t = interleaved_timings({n: step(n) for n in built}, repeats, before=trim)
    full_b = kv_bytes(built["full"][0])
    print(f"\nLLaVA-1.5-7B stand-in (random weights, {C}-position context with {n_img} image tokens, 32 layers, reduced "
          f"width), one question; times relative to the full cache: median paired ratio [95% interval over repeats]")
    print(f"{'cache':>26} {'positions':>9} {'bytes/full':>10} {'prefill/full':>22} {'decode step/full':>22}")
    for n in built:
        p = speedup_interval(pre_t[n], pre_t["full"], min_repeats=2)
        d = speedup_interval(dec_t[n], dec_t["full"], min_repeats=2)
        print(f"{n:>26} {held[n]:9d} {kv_bytes(built[n][0]) / full_b:10.3f} {p.value:8.3f} [{p.lo:.3f}, {p.hi:.3f}] "
              f"{d.value:8.3f} [{d.lo:.3f}, {d.hi:.3f}]")


def reuse(steps=20, prompts=8, repeats=10):
    from unicache_lib.reuse.control import control_table
    from unicache_lib.reuse.evaluate import methods_for, run_reuse
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.world.text import prompt_set

    ps = prompt_set(prompts + 4, 0, 0)  # the last 4 are held out for MagCache's calibration
    texts, objs = [p["short"] for p in ps[:prompts]], [p["objects"][0] for p in ps[:prompts]]
    calib = [p["short"] for p in ps[prompts:]]
    for name in ("tiny-mmdit", "tiny-pixart"):
        gen = load_generator(name)
        methods = methods_for(gen, steps, 3.0, calib, scored_prompts=texts, fewer_steps=range(6, steps))
        df = run_reuse(gen, methods, texts, objs, steps, 3.0, 0, prompts, repeats)
        print(f"\ncross-step reuse on {name}: {prompts} prompts x {steps} steps, {repeats} interleaved repeats in shuffled order"
              " (speed-up: median paired ratio, 95% bootstrap interval over repeats)")
        print(df[["speedup", "speedup_lo", "speedup_hi", "median_s", "iqr_s", "computed", "flops", "psnr", "ssim",
                  "note"]].round(3).to_string())
        print("PSNR margin over fewer-step sampling at the same speed-up / FLOPs (dB, 95% interval over prompts):")
        print(control_table(df).round(2).to_string())


def standin_step_skip(name="sd3-medium", steps=20, repeats=3, prompts=("a red circle on the left",)):
    """Step-skip vs no reuse on a pipeline stand-in: whole-call wall-clock (text encoders, the denoising
    loop, VAE decode), ``repeats`` interleaved rounds after a one-step warm-up; transformer calls that ran
    counted on the first block."""
    import tempfile

    import numpy as np

    from unicache_lib.core.hooks import forward_hooks
    from unicache_lib.intervals import interleaved_timings
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.zoo.builders import gen_standins

    with tempfile.TemporaryDirectory() as tmp:
        gen = load_generator(gen_standins.build(name, tmp))
        first = [m for m in gen.transformer.children() if isinstance(m, torch.nn.ModuleList)][0][0]
        ran, counts = [0], {}

        def run(policy):
            def go():
                ran[0] = 0
                with ReuseCache(gen, REUSE_POLICIES[policy](), steps) as rc:
                    sample(gen, list(prompts), steps, 3.0, seed=0, callbacks=[rc])
                counts[policy] = ran[0]
            return go

        with forward_hooks([(first, "forward_pre", lambda *a: ran.__setitem__(0, ran[0] + 1))]):  # counts block-0 calls
            sample(gen, list(prompts), 1, 3.0, seed=0)  # warm-up
            times = interleaved_timings({p: run(p) for p in ("none", "step_skip")}, repeats)
    ratios = times["none"] / times["step_skip"]
    print(f"\nstep_skip on the {name} stand-in ({gen.image_tokens} image tokens, {steps} steps, {len(prompts)} prompt, "
          f"guidance 3.0), {repeats} interleaved rounds of the whole pipeline call")
    print(f"{'method':>10} {'median s':>9} {'transformer calls run':>22}")
    for p in ("none", "step_skip"):
        print(f"{p:>10} {np.median(times[p]):9.2f} {counts[p]:>16d} of {steps}")
    print(f"speed-up (median paired ratio): {np.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8, help="scored prompts of the reuse table (32: the notebook's)")
    ap.add_argument("--standin-steps", type=int, default=20)
    ap.add_argument("--parts", nargs="*", default=["eviction", "reuse", "standin"],
                    choices=["eviction", "eviction-standin", "reuse", "standin"])
    a = ap.parse_args()
    if "eviction" in a.parts:
        eviction(repeats=3 * a.repeats)
    if "eviction" in a.parts or "eviction-standin" in a.parts:
        eviction_standin(repeats=a.repeats)
    if "reuse" in a.parts:
        reuse(prompts=a.prompts, repeats=a.repeats)
    if "standin" in a.parts:
        standin_step_skip(steps=a.standin_steps)
