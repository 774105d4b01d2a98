"""Every reuse method on the same prompts and seeds: quality against the no-reuse images, prompt
following, attention work done, and wall-clock measured side by side (interleaved repeats)."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..quality import psnr, ssim
from ..world.segment import score_object
from ..zoo.sampling import sample, to_uint8
from .cache import AttentionCallCounter, ReuseCache
from .peers import DiffusersCache, PeerUnsupported, magcache_ratios
from .policies import REUSE_POLICIES


def methods_for(gen, steps: int, guidance: float, calibration_prompts: list[str], peers=("pab", "fastercache", "first_block",
                                                                                                "taylorseer", "magcache")) -> dict:
    """label -> zero-argument factory of a context manager that is also a sampling callback."""
    out = {name: (lambda cls=cls: ReuseCache(gen.transformer, cls(), steps)) for name, cls in REUSE_POLICIES.items()}
    ratios = None
    for p in peers:
        if p == "magcache":
            ratios = magcache_ratios(gen, calibration_prompts, steps, guidance)
        out[f"diffusers:{p}"] = lambda p=p: DiffusersCache(gen, p, steps, guidance, calibration=ratios)
    return out


def _run(gen, make, prompts, steps, guidance, seed):
    with make() as m, AttentionCallCounter(gen.transformer) as counter:
        t0 = time.perf_counter()
        x = sample(gen, prompts, steps, guidance, seed=seed, callbacks=[m])
        dt = time.perf_counter() - t0
    work = m.computed_fraction * counter.calls if isinstance(m, ReuseCache) else counter.calls
    return to_uint8(x), dt, work


def run_reuse(gen, methods: dict, prompts, objects, steps=20, guidance=3.0, seed=0, timing_prompts: int = 8,
              repeats: int = 5, progress=True) -> pd.DataFrame:
    """One row per method: psnr, ssim (vs the ``none`` method's images), colour / position / shape
    rates, ``computed`` (attention work / the no-reuse run's), median and IQR seconds for a batch of
    ``timing_prompts`` over ``repeats`` interleaved repeats, and ``speedup`` (none's median / this
    median). Methods that cannot run on this model get a row with the reason in ``note``."""
    if "none" not in methods:
        raise ValueError("methods must include 'none' (the reference)")
    ref, _, ref_work = _run(gen, methods["none"], prompts, steps, guidance, seed)
    rows, usable = {}, {}
    for label, make in tqdm(methods.items(), desc="reuse methods", disable=not progress):
        try:
            imgs, _, work = _run(gen, make, prompts, steps, guidance, seed)
        except PeerUnsupported as e:
            rows[label] = {"method": label, "note": str(e)}
            continue
        sc = [score_object(im, o) for im, o in zip(imgs, objects)]
        rows[label] = {"method": label, "psnr": float(np.mean(np.minimum(psnr(imgs, ref), 100.0))),
                       "ssim": float(np.mean(ssim(imgs, ref))),
                       **{k: float(np.mean([s[k] for s in sc])) for k in ("colour", "position", "shape")},
                       "computed": work / ref_work, "n": len(prompts), "note": ""}
        usable[label] = make
    times = {k: [] for k in usable}
    tp = prompts[:timing_prompts]
    for _ in range(repeats):
        for label, make in usable.items():
            with contextlib.redirect_stdout(None):
                times[label].append(_run(gen, make, tp, steps, guidance, seed)[1])
    base = float(np.median(times["none"]))
    for label, ts in times.items():
        rows[label].update({"median_s": float(np.median(ts)), "iqr_s": float(np.subtract(*np.percentile(ts, [75, 25]))),
                            "speedup": base / float(np.median(ts)), "repeats": repeats})
    return pd.DataFrame(list(rows.values())).set_index("method")
