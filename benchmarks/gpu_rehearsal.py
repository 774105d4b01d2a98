"""The real-shape rehearsal at LLaVA-1.5-7B's real width, on a GPU (make gpu-rehearsal).

When CUDA is present: builds a random-weight LLaVA-1.5-7B stand-in at its real widths (hidden 4096,
32 layers x 32 heads x 128, CLIP ViT-L/14-336 tower: 576 image tokens) directly on the GPU in fp16, then

1. capture overhead, from interleaved repeats in shuffled order with their spread and a 95% interval:
   ``stats`` mode vs the plain eager forward, ``recompute`` mode vs the plain sdpa forward;
2. KV eviction: bytes held and the time of one decode step on the full cache and at 25% and 10% of the
   image KV (same interleaved protocol);
3. (unless ``--skip-notebooks``) the rehearsal notebooks 01, 02, 04, 05, 06 on that model through
   papermill with ``DEVICE="cuda", DTYPE="float16"`` (by parameters only), wall-clock and peak host RSS.

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-notebooks", action="store_true")
    ap.add_argument("--notebooks", nargs="*", default=None)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu_rehearsal"))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check this script on a CPU: the reduced-width stand-in, fp32, no notebooks (numbers mean nothing)")
    a = ap.parse_args(argv)
    device, dtype, real = ("cpu", torch.float32, False) if a.cpu_smoke else ("cuda", torch.float16, True)
    if a.cpu_smoke:
        a.skip_notebooks = True
    elif not torch.cuda.is_available():
        print(f"gpu-rehearsal: skipped, torch {torch.__version__} sees no CUDA device on this machine "
              f"({'a CPU-only build' if not torch.version.cuda else 'no GPU visible'}). Run `make gpu-rehearsal` on a machine "
              "with a GPU; `make rehearsal` is the CPU version at reduced width.")
        return 0
    t_start = time.perf_counter()
    out = Path(a.out)
    from unicache_lib.capture import AttentionCapture
    from unicache_lib.capture.runner import inputs_for
    from unicache_lib.capture.vlm import language_attention
    from unicache_lib.intervals import interleaved_timings, speedup_interval
    from unicache_lib.kv import POLICIES, answer, evict, kv_bytes, prefill, split_prompt
    from unicache_lib.kv.cache import forward_question
    from unicache_lib.world import samples as sample_set
    from unicache_lib.zoo.loaders import load_understanding
    from unicache_lib.zoo.standins import build

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    print(f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu (smoke run)'}, torch {torch.__version__}")
    t0 = time.perf_counter()
    path = build("llava-1.5-7b", out / "models", real_width=real, device=device, dtype=dtype)
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
            res = _isolated(nb, notebook_params(nb, path, out / "runs", "cuda", "float16"), out / "runs" / f"{nb}.ipynb")
            print(f"  {nb:24s} {res['wall_s']:7.1f} s, peak host RSS {res['peak_rss_mb'] / 1024:.1f} GB")
    print(f"\ngpu-rehearsal: {time.perf_counter() - t_start:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
