"""The real-shape rehearsal at LLaVA-1.5-7B's real width, on a GPU (make gpu-rehearsal).

When CUDA is present: builds a random-weight LLaVA-1.5-7B stand-in at its real widths (hidden 4096,
32 layers x 32 heads x 128, CLIP ViT-L/14-336 tower: 576 image tokens) directly on the GPU in fp16, then

1. capture overhead, from interleaved repeats in shuffled order with their spread and a 95% interval:
   ``stats`` mode vs the plain eager forward, ``recompute`` mode vs the plain sdpa forward;
2. KV eviction: bytes held and the time of one decode step on the full cache and at 25% and 10% of the
   image KV (same interleaved protocol);
3. (unless ``--skip-notebooks``) the rehearsal notebooks 01, 02, 04, 05, 07 on that model through
   papermill with ``DEVICE="cuda", DTYPE="float16"`` (by parameters only), wall-clock and peak host RSS;
4. (unless ``--skip-generators``) cross-step reuse at real width and 1,024 px (4,096 image tokens):
   random-weight SD3-medium- (24 joint blocks, 24 x 64 heads, 333 text tokens, CFG batch of 2) and
   FLUX.1-dev-shaped (19 double + 38 single blocks, 24 x 128 heads, 512 text tokens, bf16) transformers
   run ``--gen-steps`` denoising steps under every reuse policy of the workbench and every diffusers
   cache; the speed-up over no reuse per method, from interleaved repeats, with the share of attention
   work computed. A method that cannot run on a family prints its reason. Then at the anchors'
   ``--anchor-steps`` (50; 0 skips it): no reuse, ``step_skip`` at the setting tuned for that step count
   (``benchmarks/results/tune_step_skip_50.json``: 12 of 50 calls) and fewer-step sampling at as many
   transformer calls (the control at equal FLOPs), interleaved, speed-ups over no reuse (time only: random
   weights);
5. (unless ``--skip-capture``) diffusion capture of one SD3-medium joint block at 1,024 px (4,096 image +
   333 text tokens, fp16): the plain forward against ``stats`` (the map formed whole), the map formed again
   and nothing read, ``mode="recompute"`` (streamed from the logits) and ``recompute`` with the adjacent-step
   similarities: time over the plain forward (interleaved repeats, 95% interval) and peak device memory
   over the plain forward's, as a share of one map (``benchmarks/capture_overhead.py``'s configurations).

On a machine without CUDA it prints why and exits 0 (``--cpu-smoke`` checks the script itself on a CPU with
the reduced-width stand-in). Meant to finish in under 10 minutes on one GPU.

    python benchmarks/gpu_rehearsal.py [--repeats 10] [--skip-notebooks] [--out outputs/gpu_rehearsal]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOOL = "gpu_rehearsal.py"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-notebooks", action="store_true")
    ap.add_argument("--skip-generators", action="store_true")
    ap.add_argument("--only-generators", action="store_true", help="skip the LLaVA part (parts 1-3)")
    ap.add_argument("--gen-steps", type=int, default=10)
    ap.add_argument("--gen-repeats", type=int, default=5)
    ap.add_argument("--anchor-steps", type=int, default=50,
                    help="part 4's step_skip vs fewer steps at equal FLOPs at this step count (0: skip)")
    ap.add_argument("--notebooks", nargs="*", default=None)
    ap.add_argument("--skip-capture", action="store_true", help="skip part 5 (diffusion capture of an SD3 block)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu_rehearsal"))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script on a CPU: the reduced-width stand-in, fp32, no notebooks (numbers mean nothing)")
    a = ap.parse_args(argv)
    from unicache_lib.core.errors import InputError
    from unicache_lib.core.untrusted import folder_inside
    from unicache_lib.paths import claim_output_folder, cli_output_path

    cli_output_path(a.out, TOOL)  # not the repository nor one of its folders (checked again, and claimed, below)
    device, dtype, real = ("cpu", torch.float32, False) if a.cpu_smoke else ("cuda", torch.float16, True)
    if a.cpu_smoke:
        a.skip_notebooks = True
    elif not torch.cuda.is_available():
        print(f"gpu-rehearsal: skipped, torch {torch.__version__} sees no CUDA device on this machine "
              f"({'a CPU-only build' if not torch.version.cuda else 'no GPU visible'}). Run `make gpu-rehearsal` on a machine "
              "with a GPU; `make rehearsal` is the CPU version at reduced width.")
        return 0
    # new, empty or this tool's own (then marked), before anything is built
    out = claim_output_folder(a.out, TOOL, writes="its stand-ins and outputs")
    try:  # its folders under --out: real ones, never a link put there (checked again as each is used)
        for sub in ("models", "runs"):
            folder_inside(out, sub, create=True)
    except InputError as e:
        ap.error(str(e))
    t_start = time.perf_counter()
    if not a.only_generators:
        try:  # a link or special file in a model folder under --out (standins.model_folder): one line, exit status 2
            understanding(a, out, device, dtype, real)
        except InputError as e:
            ap.error(str(e))
    if not a.skip_generators:
        generators(a, device, real)
    if not a.skip_capture:
        diffusion_capture(a, device, real)
    print(f"\ngpu-rehearsal: {time.perf_counter() - t_start:.0f} s in all")
    return 0


def understanding(a, out: Path, device: str, dtype: torch.dtype, real: bool) -> None:
    """Parts 1-3: capture overhead, KV eviction and the notebooks on the LLaVA-1.5-7B stand-in."""
    from unicache_lib.capture import AttentionCapture
    from unicache_lib.capture.runner import inputs_for
    from unicache_lib.core.models import language_attention
    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill, split_prompt
    from unicache_lib.kv.cache import forward_question
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world import samples as sample_set
    from unicache_lib.core.untrusted import folder_inside
    from unicache_lib.zoo.builders.standins import build

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    print(f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu (smoke run)'}, torch {torch.__version__}")
    t0 = time.perf_counter()
    path = build("llava-1.5-7b", folder_inside(out, "models", create=True), real_width=real, device=device, dtype=dtype)
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"built {path} in {time.perf_counter() - t0:.0f} s")
    model, proc = load_understanding(str(path), attn_implementation="eager", dtype=dtype, device=device)
    n_params = sum(p.numel() for p in model.parameters())
    s = sample_set.load(per_type=1)[0]
    inputs = inputs_for(model, proc, s.image, s.question)
    mem = f", GPU memory after load {torch.cuda.memory_allocated() / 2**30:.1f} GB" if device == "cuda" else ""
    print(f"{n_params / 1e9:.2f}B parameters, sequence of {inputs['input_ids'].shape[1]} tokens{mem}")

    def timed(fn):
        def run():
            with torch.no_grad():
                fn()
            sync()
        return run

    def plain():
        model(**inputs)

    def stats():
        with AttentionCapture(model, "stats"):
            model(**inputs)

    def sdpa():
        with language_attention(model, "sdpa"):
            model(**inputs)

    def recompute():
        with language_attention(model, "sdpa"), AttentionCapture(model, "recompute"):
            model(**inputs)

    fns = {"eager": timed(plain), "stats": timed(stats), "sdpa": timed(sdpa), "recompute": timed(recompute)}
    for f in fns.values():  # warm-up
        f()
    T = interleaved_timings(fns, a.repeats)
    print(f"\ncapture overhead ({a.repeats} interleaved repeats, shuffled; median [95% interval over repeats])")
    for label, base in (("stats", "eager"), ("recompute", "sdpa")):
        iv = speedup_interval(T[label], T[base], min_repeats=min(a.repeats, 10 if not a.cpu_smoke else 2))
        print(f"  {label:9s} / {base:5s}: {iv.value:.3f}x [{iv.lo:.3f}, {iv.hi:.3f}]   "
              f"({1e3 * float(torch.tensor(T[label]).median()):.1f} ms vs {1e3 * float(torch.tensor(T[base]).median()):.1f} ms)")

    sp = split_prompt(proc, s.image, s.question, model=model)
    pre = prefill(model, sp)
    ctx = pre.context()
    caches = {"full": evict(pre.cache, POLICIES["full"]().select(ctx, 1.0))}
    for b in (0.25, 0.10):
        caches[f"{b:.0%} image KV"] = evict(pre.cache, POLICIES["h2o"]().select(ctx, b))
    for c in caches.values():  # the question fed on each cache: what follows are decode steps
        with torch.no_grad():
            answer(model, c, sp)
    full_bytes = kv_bytes(caches["full"])
    n = sp.context_ids.shape[1] + sp.question_ids.shape[1]
    token = torch.tensor([[proc.tokenizer.eos_token_id]], device=device)
    pos = torch.tensor([[n]], device=device)

    def step(cache):
        def run():
            c = evict(cache, [None] * len(cache.layers))  # a copy: timed steps do not grow the cache
            with torch.no_grad():
                forward_question(sp.family, model, token, c, pos)
            sync()
        return run

    D = interleaved_timings({k: step(c) for k, c in caches.items()}, a.repeats)
    print(f"\nKV eviction: one decode step on the compressed cache ({a.repeats} interleaved repeats)")
    for k, c in caches.items():
        iv = speedup_interval(D[k], D["full"], min_repeats=min(a.repeats, 10 if not a.cpu_smoke else 2))
        print(f"  {k:14s} KV {kv_bytes(c) / 2**20:8.1f} MiB ({kv_bytes(c) / full_bytes:.2f} of full), "
              f"step time {iv.value:.3f}x of full [{iv.lo:.3f}, {iv.hi:.3f}]")
    del model, pre, caches
    if device == "cuda":
        torch.cuda.empty_cache()

    if not a.skip_notebooks:
        from unicache_lib.rehearsal import NOTEBOOKS, _isolated, notebook_params

        print("\nrehearsal notebooks at real width (DEVICE=cuda, DTYPE=float16)")
        for nb in a.notebooks or NOTEBOOKS:
            runs = folder_inside(out, f"runs/{nb}", create=True).parent  # its folders: never through a link
            res = _isolated(nb, notebook_params(nb, path, runs, "cuda", "float16"), runs / f"{nb}.ipynb")
            print(f"  {nb:24s} {res['wall_s']:7.1f} s, peak host RSS {res['peak_rss_mb'] / 1024:.1f} GB")


# real configs (diffusers' config.json of the repositories named), at 1,024 px
GENERATOR_SHAPES = {
    "sd3-medium": ("sd3", "SD3Transformer2DModel", dict(
        sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
        num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
        pos_embed_max_size=192), {"latent": 128, "text": 333, "batch": 2}),
    "flux-dev": ("flux", "FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
     {"latent": 64, "text": 512, "batch": 1}),  # 128x128 latents packed 2x2: 64x64 = 4,096 tokens
}


def generator_inputs(family: str, tr, shape: dict, device, dtype) -> dict:
    """One denoising call's inputs at the shape's token counts (random values)."""
    g = torch.Generator().manual_seed(0)
    c, b, n, t = tr.config, shape["batch"], shape["latent"], shape["text"]
    rn = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    if family == "sd3":
        return dict(hidden_states=rn(b, c.in_channels, n, n), encoder_hidden_states=rn(b, t, c.joint_attention_dim),
                    pooled_projections=rn(b, c.pooled_projection_dim), timestep=torch.full((b,), 1000.0, device=device, dtype=dtype))
    img_ids = torch.zeros(n, n, 3)
    img_ids[..., 1], img_ids[..., 2] = torch.arange(n)[:, None], torch.arange(n)[None, :]
    kw = dict(hidden_states=rn(b, n * n, c.in_channels), encoder_hidden_states=rn(b, t, c.joint_attention_dim),
              pooled_projections=rn(b, c.pooled_projection_dim), timestep=torch.ones(b, device=device, dtype=dtype),
              img_ids=img_ids.reshape(-1, 3).to(device, dtype), txt_ids=torch.zeros(t, 3, device=device, dtype=dtype))
    if c.guidance_embeds:
        kw["guidance"] = torch.full((b,), 3.5, device=device, dtype=dtype)
    return kw


def generators(a, device: str, real: bool) -> None:
    """Part 4: per-step reuse speed-ups at real width on SD3-medium- and FLUX.1-dev-shaped transformers."""
    import contextlib
    import io
    import logging

    import diffusers

    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
    from unicache_lib.reuse.cache import AttentionCallCounter
    from unicache_lib.reuse.peers import PEERS, DiffusersCache, PeerUnsupported, calibrate_magcache
    from unicache_lib.zoo.builders.tiny_random import forward_inputs, tiny_transformer

    logging.getLogger("diffusers").setLevel(logging.ERROR)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n_steps = a.gen_steps
    for label, (family, cls, cfg, shape) in GENERATOR_SHAPES.items():
        dtype = (torch.bfloat16 if family == "flux" else torch.float16) if real else torch.float32
        t0 = time.perf_counter()
        if real:
            with torch.device(device):
                tr = getattr(diffusers, cls)(**cfg).to(dtype).eval()
            inputs = generator_inputs(family, tr, shape, device, dtype)
        else:  # smoke: the tiny random transformer of the family, tiny inputs
            tr = tiny_transformer(family)
            inputs = forward_inputs(family, tr, batch=shape["batch"], n_text=5)
        n_img = inputs["hidden_states"].shape[1] if inputs["hidden_states"].dim() == 3 else \
            (inputs["hidden_states"].shape[-1] // tr.config.patch_size) ** 2
        print(f"\n{label}{'' if real else ' (smoke: tiny random)'}: {sum(p.numel() for p in tr.parameters()) / 1e9:.2f}B "
              f"parameters, {dtype}, {n_img} image + {inputs['encoder_hidden_states'].shape[1]} text tokens, batch "
              f"{inputs['hidden_states'].shape[0]}, {n_steps} steps (built in {time.perf_counter() - t0:.0f} s)")
        def denoise(callbacks=(), n_steps=n_steps):
            x = inputs["hidden_states"]
            timesteps = [1000.0 * (1 - i / n_steps) for i in range(n_steps)]
            with torch.no_grad():
                for i, t in enumerate(timesteps):
                    for cb in callbacks:
                        cb.on_step_begin(i, t)
                    tt = torch.full_like(inputs["timestep"], t / 1000 if family == "flux" else t)
                    out = tr(**dict(inputs, hidden_states=x, timestep=tt, return_dict=False))[0]
                    for cb in callbacks:
                        if hasattr(cb, "on_step_end"):
                            cb.on_step_end(i, t, None)
                    x = x - (1.0 / n_steps) * out[:, : x.shape[1]] if x.dim() == 4 else x - (1.0 / n_steps) * out
            sync()

        ratios = None
        with contextlib.suppress(PeerUnsupported):
            ratios = calibrate_magcache(tr, n_steps, lambda pc: denoise([pc]))
        methods = {name: (lambda cls=c: ReuseCache(tr, cls(), n_steps)) for name, c in REUSE_POLICIES.items()}
        for p in PEERS:
            methods[f"diffusers:{p}"] = lambda p=p: DiffusersCache(tr, p, n_steps, calibration=ratios)
        runnable, work = {}, {}
        with AttentionCallCounter(tr) as ref:
            denoise()
        for name, make in methods.items():
            try:
                with make() as m, AttentionCallCounter(tr) as cnt, contextlib.redirect_stdout(io.StringIO()):
                    denoise([m])
            except PeerUnsupported as e:
                print(f"  {name:24s} cannot run: {e}")
                continue
            work[name] = (m.computed_fraction * cnt.rows if isinstance(m, ReuseCache) else cnt.rows) / ref.rows

            def run(make=make):
                with make() as m, contextlib.redirect_stdout(io.StringIO()):
                    denoise([m])
            runnable[name] = run
        T = interleaved_timings(runnable, a.gen_repeats)
        print(f"  speed-up over no reuse ({a.gen_repeats} interleaved repeats, median [95% interval]), attention work computed")
        for name in runnable:
            iv = speedup_interval(T["none"], T[name], min_repeats=2)
            print(f"  {name:24s} {iv.value:6.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]   computed {work[name]:.2f}   "
                  f"{1e3 * float(torch.tensor(T[name]).median()) / n_steps:8.1f} ms/step")
        if a.anchor_steps:
            anchor_steps(a, tr, denoise, a.anchor_steps)
        del tr, inputs
        if device == "cuda":
            torch.cuda.empty_cache()


def anchor_steps(a, tr, denoise, n: int) -> None:
    """Part 4, at the anchors' step count: no reuse, ``step_skip`` at the setting tuned for ``n`` steps (the 50-step
    one from ``results/tune_step_skip_50.json`` at 50, else the shipped one) and fewer-step sampling at as many
    transformer calls (equal FLOPs), in interleaved repeats; speed-ups over no reuse."""
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reuse_steps import tuned_50

    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.reuse import ReuseCache
    from unicache_lib.reuse.policies.step_skip import StepSkip

    setting = tuned_50() if n == 50 else None
    policy = StepSkip(**setting) if setting else StepSkip()
    calls = sum(policy.schedule(n))

    def skip():
        with ReuseCache(tr, policy, n) as rc, contextlib.redirect_stdout(io.StringIO()):
            denoise([rc], n_steps=n)

    T = interleaved_timings({"none": lambda: denoise(n_steps=n), "step_skip": skip,
                             f"steps:{calls}": lambda: denoise(n_steps=calls)}, a.gen_repeats)
    print(f"  at {n} steps: {policy} ({calls} of {n} calls) against {calls}-step sampling (equal FLOPs); "
          f"speed-up over no reuse at {n} steps ({a.gen_repeats} interleaved repeats, median [95% interval]; "
          "random weights: time only)")
    for name in ("step_skip", f"steps:{calls}"):
        iv = speedup_interval(T["none"], T[name], min_repeats=2)
        print(f"  {name:24s} {iv.value:6.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]")


def diffusion_capture(a, device: str, real: bool) -> None:
    """Part 5: capture of one SD3-medium joint block at 1,024 px, every configuration of capture_overhead's SD3
    regime: time over the plain forward and peak device memory over the plain forward's (CPU smoke: a tiny block,
    time only)."""
    from unicache_lib.intervals import interleaved_timings, speedup_interval

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import capture_overhead as co
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    n_img, n_txt = (4096, 333) if real else (64, 8)
    dtype = torch.float16 if real else torch.float32
    tr, kw = co.sd3_block(n_img, n_txt)
    tr = tr.to(device, dtype)
    kw = {k: v.to(device, dtype if v.is_floating_point() else v.dtype) for k, v in kw.items()}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    runs = {c: co.sd3_runner(tr, kw, c) for c in co.sd3_configs(co.SD3_STRIDES)}  # exact, then sampled

    def timed(run):
        def go():
            run()
            sync()
        return go

    one_map = 24 * (n_img + n_txt) ** 2 * 4 / 2**20
    mem = {}
    with torch.no_grad():
        for c, run in runs.items():  # warm-up (the adjacent configuration captures its step 0 here), then peak memory
            run()
            sync()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                run()
                sync()
                mem[c] = (torch.cuda.max_memory_allocated() - base) / 2**20
        T = interleaved_timings({c: timed(r) for c, r in runs.items()}, a.repeats)
    print(f"\ndiffusion capture, one SD3-medium joint block{'' if real else ' (smoke: tiny)'}: {n_img} image + {n_txt} text "
          f"tokens, {dtype}; one map = {one_map:,.0f} MB float32; {a.repeats} interleaved repeats")
    print(f"  {'config':22s} {'time / plain [95%]':>24s} {'peak over plain':>16s} {'of one map':>11s}")
    for c in runs:
        iv = speedup_interval(T[c], T["plain"], min_repeats=2)  # this configuration's time / the plain forward's
        extra = mem.get(c, float("nan")) - mem.get("plain", float("nan"))
        print(f"  {c:22s} {iv.value:10.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] {extra:13.0f} MB {extra / one_map:11.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
