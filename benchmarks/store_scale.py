"""What a store costs as it grows: one write at 1k, 10k and 100k records, opening the 100k store, reading one sample.

Every store is built through the public write path (``Store.write``), one chunk per write as a capture writes it:
one sample x 20 layers of tiny stats records (one 2 x 8 float32 array each, one file per layer and chunk). Then, in
interleaved repeats (each repeat visits every store once, in a rotating order), a few more writes are timed on each
store, a new ``Store`` object opens it (its first look at the index: ``Store(path).keys()``) and reads one sample
from the middle of it (``read(sample=...)``, its files included). A repeat's write cost is the median of its writes;
ratios to the smallest store are taken per repeat (paired); everything is reported as median [min, max] over the
repeats. The build of the largest store also gives the cost of a write along one pass (medians over windows of it).
The page cache is warm (the stores were just written); torch runs one thread.

    python benchmarks/store_scale.py --out benchmarks/results/store_scale.txt   # about 3 minutes on 2 CPU cores
    python benchmarks/store_scale.py --sizes 40 200 --layers 4 --repeats 2 --writes 2 --json   # seconds (a test)

Targets: a write at 100k records costs at most 1.5x a write at 1k; opening the 100k store and reading one sample
from it take at most 1 s each.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"write": 1.5, "open": 1.0, "read": 1.0}  # ratio to the smallest store; seconds; seconds


def spread(xs, fmt="{:.3g}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


def chunk(sample: int, layers: int) -> list:
    """One write: a sample's tiny stats records, one per layer."""
    import torch

    from unicache_lib.capture.record import Record
    from unicache_lib.core.modality import Spans

    spans = Spans.from_kinds([1] * 4 + [0] * 4)
    return [Record(sample=f"s{sample:06d}", layer=li, part="language", mode="stats", seq_len=8, heads=2, spans=spans,
                   data={"entropy": torch.full((2, 8), (sample * layers + li) % 97 / 97.0)}) for li in range(layers)]


def timed_write(st, sample: int, layers: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process's, user + system) of one write."""
    recs = chunk(sample, layers)
    t, c = time.perf_counter(), time.process_time()
    st.write(recs)
    return time.perf_counter() - t, time.process_time() - c


def run(sizes, layers, repeats, writes, root: Path) -> dict:
    from unicache_lib.store import Store

    sizes = sorted(sizes)
    stores, next_sample, build = {}, {}, {}
    t0 = time.perf_counter()
    for n in sizes:  # built smallest first; the largest store's build is kept as the one-pass curve
        st = stores[n] = Store(root / f"s{n}", meta={"model": "store-scale"})
        build[n] = [timed_write(st, s, layers) for s in range(n // layers)]
        next_sample[n] = n // layers
    build_s = time.perf_counter() - t0
    per = {n: {"write": [], "cpu": [], "open": [], "read": []} for n in sizes}
    for rep in range(repeats):
        order = sizes[rep % len(sizes):] + sizes[:rep % len(sizes)]
        for n in order:
            st = stores[n]
            ts = [timed_write(st, next_sample[n] + i, layers) for i in range(writes)]
            next_sample[n] += writes
            per[n]["write"].append(statistics.median(t for t, _ in ts))
            per[n]["cpu"].append(statistics.median(c for _, c in ts))
            t = time.perf_counter()
            fresh = Store(st.path)
            held = len(fresh.keys())
            per[n]["open"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = fresh.read(sample=f"s{next_sample[n] // 2:06d}")
            per[n]["read"].append(time.perf_counter() - t)
            assert held == next_sample[n] * layers and len(got) == layers, (held, len(got))
    big = sizes[-1]
    windows = {}  # one pass: median write over the records [k - 1000, k) for k in the sizes (scaled for tiny runs)
    for n in sizes:
        hi = n // layers
        lo = max(0, hi - max(1, sizes[0] // layers))
        windows[n] = [statistics.median(x[i] for x in build[big][lo:hi]) for i in (0, 1)]
    log = root / f"s{big}" / "index-rank00000.jsonl"
    return {"sizes": sizes, "layers": layers, "repeats": repeats, "writes": writes, "build_s": build_s,
            "grown": repeats * writes * layers, "index_mb": log.stat().st_size / 1e6,
            "write_ms": {n: [1e3 * x for x in per[n]["write"]] for n in sizes},
            "write_ratio": {n: [a / b for a, b in zip(per[n]["write"], per[sizes[0]]["write"])] for n in sizes},
            "cpu_ms": {n: [1e3 * x for x in per[n]["cpu"]] for n in sizes},
            "cpu_ratio": {n: [a / b for a, b in zip(per[n]["cpu"], per[sizes[0]]["cpu"])] for n in sizes},
            "open_s": {n: per[n]["open"] for n in sizes}, "read_s": {n: per[n]["read"] for n in sizes},
            "one_pass_ms": {n: [1e3 * x for x in windows[n]] for n in sizes}}


def report(r: dict) -> str:
    sizes, big, small = r["sizes"], r["sizes"][-1], r["sizes"][0]
    out = [f"# python benchmarks/store_scale.py {' '.join(sys.argv[1:])}".rstrip() + f"; {os.cpu_count()} CPU cores, "
           f"1 torch thread",
           f"tiny stats records, one write = one sample x {r['layers']} layers (a file per layer), built through "
           f"Store.write; {r['repeats']} interleaved repeats, {r['writes']} timed writes per store per repeat (each store "
           f"grows by {r['grown']} records while timed); time: median [min, max] over repeats",
           f"{'records':>8}  {'write (ms)':>20}  {'/ write at ' + str(small):>18}  {'write CPU (ms)':>20}  "
           f"{'/ CPU at ' + str(small):>18}  {'open (s)':>24}  {'one-sample read (s)':>24}"]
    for n in sizes:
        out.append(f"{n:>8}  {spread(r['write_ms'][n]):>20}  {spread(r['write_ratio'][n], '{:.2f}'):>18}  "
                   f"{spread(r['cpu_ms'][n]):>20}  {spread(r['cpu_ratio'][n], '{:.2f}'):>18}  "
                   f"{spread(r['open_s'][n], '{:.4f}'):>24}  {spread(r['read_s'][n], '{:.4f}'):>24}")
    one = r["one_pass_ms"]
    out.append(f"one pass (building the {big}-record store; median of the {small // r['layers']} writes before each "
               f"size, wall / CPU): " + ", ".join(f"{n}: {one[n][0]:.3g} / {one[n][1]:.3g} ms" for n in sizes)
               + f"; ratio {one[big][0] / one[small][0]:.2f} / {one[big][1] / one[small][1]:.2f}")
    checks = [(f"write at {big} / write at {small}", r["write_ratio"][big], "write", "{:.2f}", ""),
              (f"open, {big} records", r["open_s"][big], "open", "{:.4f}", " s"),
              (f"one-sample read, {big} records", r["read_s"][big], "read", "{:.4f}", " s")]
    for name, xs, key, fmt, unit in checks:
        ok = "PASS" if statistics.median(xs) <= TARGETS[key] else "FAIL"
        out.append(f"{name:<36} {spread(xs, fmt)}{unit}  (target <= {TARGETS[key]}{unit}) {ok}")
    out.append(f"index of the {big}-record store: {r['index_mb']:.1f} MB; building all stores took {r['build_s']:.0f} s")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000], help="records per store")
    ap.add_argument("--layers", type=int, default=20, help="records per write (one sample x this many layers)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--writes", type=int, default=6, help="timed writes per store and repeat")
    ap.add_argument("--dir", help="where to build the stores (default: a temporary folder, removed after)")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--json", action="store_true", help="print the numbers as one JSON line after the report")
    a = ap.parse_args(argv)
    from evaluate import check_out, write_result  # (benchmarks/results/ as the committed run; elsewhere never over a
    # user's file: evaluate's one rule)

    check_out(ap, a)  # a bad --out refused now, not after minutes of measuring
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="store-scale-", dir=a.dir))
    try:
        r = run(a.sizes, a.layers, a.repeats, a.writes, root)
    finally:
        shutil.rmtree(root)
    text = report(r)
    print(text)
    if a.out:
        write_result(a.out, (text + "\n").encode(), ap.prog)
    if a.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
