"""The error of ``stats_stride``'s sampled statistics against the exact ones, on the shipped generators' trained maps
(issue #31, item 3: "say which and its error against the full map").

``DiffusionCapture(stats_stride=k)`` computes every statistic, and the step-to-step map similarities, from every
k-th image row and every k-th text row, each weighted by the rows it stands for. This benchmark samples the same
prompts with the same seeds once exactly (``stats_stride=1``) and once per stride (the capture does not change the
images, checked, so the trajectories are identical), pairs the records by (sample, part, layer, step) and reports,
per statistic of :func:`~unicache_lib.analysis.generation.step_table`, the absolute error of the estimate: median,
95th percentile and maximum over records, beside the spread of the exact values (their standard deviation around
their part's mean over prompts, layers and steps: the scale an analysis compares); and, for the step-reuse reading
the notebooks take from these statistics, how many per-layer knees of the map-similarity curve
(:func:`~unicache_lib.analysis.generation.knee_table`) the estimate moves at 0.95 and 0.99 (on the shipped generators
the map cosines stay above 0.97 after step 1, so 0.99 is the threshold notebook 03 reads knees at).

The shipped generators have 64 image tokens, so each stride keeps few rows (9 at stride 7); SD3-medium at
1,024 px keeps 585 of its 4,096 image rows at stride 7 and 315 at stride 13. These are findings of the small models: how large the error
is on another model is measured on that model (``--generators`` takes a diffusers pipeline folder too).

    python benchmarks/stats_stride_error.py                    # both generators, 8 prompts, strides 2 4 7 13
    python benchmarks/stats_stride_error.py --prompts 2 --strides 7 --generators tiny-mmdit   # a smoke run
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import committed_or_outputs, write_result  # noqa: E402 - one rule for where a result goes

RESULTS = Path(__file__).resolve().parent / "results" / "stats_stride_error.txt"
KEYS = ["sample", "part", "layer", "step"]
# the statistics read in notebooks 03/06 and the diagnostics report (step_table's numeric columns); not out_sim_*:
# the attention outputs' step-to-step cosines are computed from every row whatever the stride
COLUMNS = ["img_entropy", "txt_entropy", "img_max", "text_share", "text_entropy", "share_ii", "share_it", "share_ti",
           "share_tt", "sim", "sim_ii", "redundancy"]


def error_table(exact: pd.DataFrame, est: pd.DataFrame, columns=COLUMNS) -> pd.DataFrame:
    """Per column: ``median |err|``, ``p95 |err|``, ``max |err|`` over the records both tables hold (paired on
    ``KEYS``), ``exact sd`` (the spread of the exact values around their part's mean: the scale an analysis compares
    within a part) and ``n`` (pairs with both values finite). Columns fixed by the part's structure (no spread
    within any part and no error: a cross-attention map's text share is 1) are left out."""
    m = exact.merge(est, on=KEYS, suffixes=("", "_est"), validate="one_to_one")
    if len(m) != len(exact):
        raise ValueError(f"{len(exact)} exact records but {len(m)} paired: the runs did not capture the same sites")
    rows = []
    for c in columns:
        if c not in m:
            continue
        ok = np.isfinite(m[c].to_numpy(float)) & np.isfinite(m[f"{c}_est"].to_numpy(float))
        if not ok.any():
            continue
        d = m[ok]
        e = np.abs(d[c].to_numpy(float) - d[f"{c}_est"].to_numpy(float))
        sd = float(np.sqrt(((d[c] - d.groupby("part")[c].transform("mean")) ** 2).mean()))
        if sd < 1e-6 and e.max() < 1e-6:
            continue
        rows.append({"statistic": c, "median |err|": np.median(e), "p95 |err|": np.quantile(e, 0.95),
                     "max |err|": e.max(), "exact sd": sd, "n": int(ok.sum())})
    return pd.DataFrame(rows).set_index("statistic")


def knee_moves(exact: pd.DataFrame, est: pd.DataFrame, thresholds=(0.95, 0.99)) -> dict:
    """``{threshold: (knees the estimate moves, knees, the exact knees as text)}`` of the per-(part, layer)
    map-similarity curves (a knee that never comes: "-")."""
    from unicache_lib.analysis.generation import knee_table

    by = ("part", "layer")
    ke, ks = knee_table(exact, thresholds, by), knee_table(est, thresholds, by)
    out = {}
    for t in thresholds:
        col = f"knee (maps) @{t:g}"
        a, b = ke[col].to_numpy(float), ks.loc[ke.index, col].to_numpy(float)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        out[t] = (int((~same).sum()), len(a), " ".join("-" if np.isnan(x) else f"{x:.0f}" for x in a))
    return out


def run(gen_name: str, prompts: int, strides, steps: int, seed: int = 0):
    """``(generator, {stride: step_table})``: one exact capture and one per stride of the same samples."""
    from unicache_lib.analysis.generation import step_table
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.world.text import prompt_set

    gen = load_generator(gen_name)
    texts = [p["short"] for p in prompt_set(prompts, 0, seed)]
    tables, images = {}, {}
    for k in (1, *strides):
        r = capture_generation(gen, texts, "p", steps=steps, seed=seed, stats_stride=k, progress=False)
        tables[k], images[k] = step_table(r.result.records), r.images
    for k in strides:  # the capture must not change the samples: otherwise the pairs compare different maps
        if not np.array_equal(images[k], images[1]):
            raise AssertionError(f"{gen_name}: images differ between stats_stride=1 and {k}")
    return gen, tables


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generators", nargs="+", default=["tiny-mmdit", "tiny-pixart"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--strides", type=int, nargs="+", default=[2, 4, 7, 13])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULTS.name} in results/ (the committed run)")
    a = ap.parse_args(argv)
    a.out = committed_or_outputs(ap, a, RESULTS)
    import torch

    from unicache_lib.stats import sample_rows

    torch.set_num_threads(1)
    lines = [f"# python benchmarks/stats_stride_error.py --prompts {a.prompts} --strides {' '.join(map(str, a.strides))} "
             f"--steps {a.steps}: |sampled - exact| per statistic over every (prompt, part, layer, step) record"]
    pd.set_option("display.width", 160)
    for g in a.generators:
        gen, tables = run(g, a.prompts, a.strides, a.steps)
        n_image = int(gen.image_tokens)
        for k in a.strides:
            t = error_table(tables[1], tables[k])
            kn = knee_moves(tables[1], tables[k])
            kept = len(sample_rows(np.zeros(n_image, int), k)[0])  # image rows the stride keeps
            lines += ["", f"{g}: {n_image} image queries per map, stats_stride {k} keeps {kept} rows; "
                          f"{a.prompts} prompts x {a.steps} steps, {len(tables[1])} records",
                      t.to_string(float_format=lambda v: f"{v:.4f}"),
                      "map-similarity knees moved by the estimate: "
                      + ", ".join(f"@{th:g}: {m} of {n}" for th, (m, n, _) in kn.items())
                      + " (exact knees, step per layer: " + "; ".join(f"@{th:g}: {v}" for th, (_, _, v) in kn.items())
                      + ")"]
            print("\n".join(lines[-3:]), flush=True)
    write_result(a.out, ("\n".join(lines) + "\n").encode(), ap.prog)  # never over a user's file, nor half written
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
