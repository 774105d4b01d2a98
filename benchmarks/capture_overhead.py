"""Capture overhead at LLaVA-1.5-7B's attention shape: 32 layers x 32 heads, 576 image + 200 text tokens.

The map size depends only on layers, heads and length, so the model is a LLaVA (built from the workbench's
LLaVA-1.5 family adapter, as the rehearsal stand-ins are) with that shape, a narrow head dimension (4) and a
one-layer vision tower, which keeps a CPU run short. Each configuration runs in its own
process; peak extra memory is the rise of the process's peak RSS over a warm plain forward of
the same attention implementation, time is the median of ``--repeats`` forwards. glibc's mmap
threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so freed tensors go back to the OS and the peak RSS
tracks live memory rather than allocator caching.

    python benchmarks/capture_overhead.py            # or: make benchmark

Targets (issue 2): stats mode holds at most 1/10 of the extra memory of output_attentions, at no
more than 1.5x the forward time of plain eager; recompute keeps the forward on sdpa.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = ("eager", "output_attentions", "stats", "sdpa", "recompute")


def child(config: str, layers: int, heads: int, n_image: int, n_text: int, repeats: int) -> dict:
    import torch
    import transformers

    from unicache_lib.capture import AttentionCapture
    from unicache_lib.families import FAMILIES
    from unicache_lib.families.base import Shape
    from unicache_lib.modality import Spans

    torch.manual_seed(0)
    impl = "sdpa" if config in ("sdpa", "recompute") else "eager"
    side = int(round(n_image ** 0.5))
    if side * side != n_image:
        raise SystemExit(f"--n-image must be a square number of patches (LLaVA's grid), got {n_image}")
    fam = FAMILIES["LLaVA-1.5"]
    tok = fam.tokenizer()
    shape = Shape(layers=layers, heads=heads, kv_heads=heads, head_dim=4, vision_layers=1, vision_heads=1,
                  vision_head_dim=8, image_size=side * 14, patch=14)
    cfg = fam.config(tok, shape)
    model = getattr(transformers, fam.model_class_for(cfg.model_type))(cfg).eval()
    model.set_attn_implementation(impl)
    img_id = cfg.image_token_id
    text = torch.randint(5, len(tok), (n_text,))
    text[text == img_id] = 5
    ids = torch.cat([text[:5], torch.full((n_image,), img_id), text[5:]])[None]
    pix = torch.randn(1, 3, side * 14, side * 14)
    spans = Spans.from_kinds([0] * 5 + [1] * n_image + [0] * (n_text - 5))
    run = lambda **kw: model(input_ids=ids, pixel_values=pix, **kw)  # noqa: E731
    with torch.no_grad():
        run()  # warm-up
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        times, kept = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            if config == "output_attentions":
                out = run(output_attentions=True)
                kept = sum(a.numel() * a.element_size() for a in out.attentions)
            elif config in ("stats", "recompute"):
                with AttentionCapture(model, mode=config, spans=spans) as cap:
                    run()
                kept = cap.result.nbytes()
            else:
                run()
            times.append(time.perf_counter() - t)
            out = cap = None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"config": config, "impl": model.config._attn_implementation, "time_s": statistics.median(times),
            "times": times, "extra_peak_mb": (peak - base) / 1024, "kept_mb": kept / 2**20}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--n-image", type=int, default=576)
    ap.add_argument("--n-text", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every configuration")
    ap.add_argument("--child", choices=CONFIGS)
    args = ap.parse_args(argv)
    shape = (args.layers, args.heads, args.n_image, args.n_text, args.repeats)
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(child(args.child, *shape)))
        return
    from unicache_lib.progress import bar

    rows = {}
    for c in bar(CONFIGS, desc="configs"):
        p = subprocess.run([sys.executable, __file__, "--child", c, "--layers", str(args.layers), "--heads",
                            str(args.heads), "--n-image", str(args.n_image), "--n-text", str(args.n_text),
                            "--repeats", str(args.repeats), "--threads", str(args.threads)],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"})
        rows[c] = json.loads(p.stdout.strip().splitlines()[-1])
    S = args.n_image + args.n_text
    print(f"capture overhead, {args.layers} layers x {args.heads} heads, sequence {S} "
          f"({args.n_image} image + {args.n_text} text), median of {args.repeats} forwards, CPU, {args.threads} thread(s)")
    print(f"{'config':<18}{'impl':<8}{'time (s)':>10}{'x eager':>9}{'extra peak MB':>15}{'kept MB':>10}")
    for c, r in rows.items():
        print(f"{c:<18}{r['impl']:<8}{r['time_s']:>10.3f}{r['time_s'] / rows['eager']['time_s']:>9.2f}"
              f"{r['extra_peak_mb']:>15.1f}{r['kept_mb']:>10.2f}")
    mem_ratio = rows["stats"]["extra_peak_mb"] / max(rows["output_attentions"]["extra_peak_mb"], 1e-9)
    time_ratio = rows["stats"]["time_s"] / rows["eager"]["time_s"]
    print(f"\nstats extra memory / output_attentions extra memory = {mem_ratio:.3f}  (target <= 0.100) "
          f"{'PASS' if mem_ratio <= 0.1 else 'MISS'}")
    print(f"stats time / plain eager time = {time_ratio:.2f}  (target <= 1.50) {'PASS' if time_ratio <= 1.5 else 'MISS'}")
    print(f"recompute forward runs on: {rows['recompute']['impl']}; recompute time / plain sdpa = "
          f"{rows['recompute']['time_s'] / rows['sdpa']['time_s']:.2f}")


if __name__ == "__main__":
    main()
