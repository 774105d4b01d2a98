"""`make test`: the unit tests and nbval on the committed notebooks, split evenly over the cores, with the time of each
part and the CPU-minutes of the whole.

    python tools/run_tests.py [--serial] [--threads N] [--nbval-threads N] [--setup-seconds S] [--only unit|nbval]
                              [--runner lanes|xdist] [--record] [-- PYTEST ARGS]

Two kinds of work, each run by pytest:

- **unit**: the files ``tests/test_*.py`` (unit and property tests, the quick papermill runs, the browser test);
- **nbval**: ``pytest --nbval-lax`` on ``notebooks/NN_*.ipynb`` as committed, compared by the workbook's rule for
  checked outputs (``tests/nbval_digits.py``, docs/TESTING.md).

On a machine with two or more cores the work is split into two lanes that run at the same time, one torch thread
each (``--threads``): test files and notebooks are dealt out longest first to the lane with less work, by the seconds
each took in the recorded run (``tests/costs.json``), so `make test` takes about half the CPU time. A lane runs at most
two pytest processes one after the other (its unit files, then its notebooks). nbval runs at ``--nbval-threads``
(default 1) while the committed notebooks were executed with 2 threads (`make notebooks` on 2 cores): another
reduction order than the one that wrote the outputs, so every `make test` also checks that the checked outputs are
portable across thread counts. The first lane prints as it goes; the second lane's output is printed when it ends.
The exit status is non-zero when any part fails; the last lines give each part's wall-clock time, its CPU time (the
process and everything it waited for: papermill kernels, the browser, torchrun ranks), the 25 slowest tests of each
part (``--durations``) and the sum of the CPU times. Every run writes the seconds per file and notebook to
``outputs/test_costs.json``; ``--record`` also writes them to ``tests/costs.json`` and docs/TESTING.md's cost table, and
the run's minutes to ``data/results/make_test.json`` (which README.md quotes).

``--runner xdist`` (`make test RUNNER=xdist`, issue #65) runs the same work as one pytest run over pytest-xdist's
workers instead of the two planned lanes: ``-n 2 --dist loadscope`` with the plan's scopes, unit tests and nbval together, a test file and a
chain of notebooks each one group (``tests/xdist_plan.py``), groups handed out longest first (by ``tests/costs.json``)
to whichever worker is free, so no lane waits on a plan that guessed wrong. Same threads (nbval's ``--nbval-threads``
is not separate there: both run at ``--threads``), the same slowest tests, the same CPU time and records; the lane
planner stays the default until the two are measured side by side on a clean clone (docs/TESTING.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


SLOWEST = 25  # each stage lists its slowest tests (pytest --durations)


ROOT_TESTS = "tests"
COSTS = ROOT / "tests" / "costs.json"  # seconds per test file / notebook in the recorded run (--record)
FAST_COSTS = ROOT / "tests" / "costs_fast.json"  # the same for `make test-fast` (--fast --record)
MARKS = {"test": "not extended", "fast": "not notebook and not slow and not extended", "extended": "extended"}
DEFAULT_COST = 10.0  # a file or notebook the recorded run does not know


def _items(extended: bool = False) -> dict[str, list[str]]:
    unit = sorted(p for p in (ROOT / ROOT_TESTS).glob("test_*.py") if not extended or "mark.extended" in p.read_text())
    return {"unit": [str(p.relative_to(ROOT)) for p in unit],
            "nbval": sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}


def recorded_costs(mode: str = "test") -> dict[str, float]:
    f = FAST_COSTS if mode == "fast" else COSTS
    return json.loads(f.read_text()) if f.exists() and mode != "extended" else {}


def command(py: str, kind: str, targets: list[str], extra: list[str], mode: str = "test") -> list[str]:
    slow = [f"--durations={SLOWEST}", "--durations-min=1", "-p", "tests.costs_plugin"]
    if kind == "unit":
        return [py, "-m", "pytest", "-q", "-m", MARKS[mode], *slow, *extra, *targets]
    return [py, "-m", "pytest", "--nbval-lax", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
            "-p", "no:randomly", "-p", "tests.nbval_digits", "-q", *slow, *extra, *targets]


XDIST_WORKERS = 2


def xdist_plan(mode: str = "test", only: str | None = None, costs: dict[str, float] | None = None
               ) -> tuple[dict[str, list[str]], dict[str, tuple[str, int]]]:
    """The work of one xdist run: ``({kind: [file, ...]}, {file: (group, rank)})``: every test file its own group,
    each :func:`nbval_groups` chain one group, ranked longest first by the recorded seconds (tests/xdist_plan.py)."""
    costs = recorded_costs(mode) if costs is None else costs
    items = _items(mode == "extended")
    only = "unit" if mode != "test" else only
    work, groups = {}, []
    if only in (None, "unit"):
        work["unit"] = items["unit"]
        groups += [(costs.get(t, DEFAULT_COST), t, [t]) for t in items["unit"]]
    if only in (None, "nbval"):
        work["nbval"] = items["nbval"]
        groups += [(sum(costs.get(t, DEFAULT_COST) for t in g), "nbval:" + Path(g[0]).stem, g)
                   for g in nbval_groups(items["nbval"])]
    plan = {}
    for rank, (_, name, members) in enumerate(sorted(groups, key=lambda g: (-g[0], g[1]))):
        for t in members:
            plan[t] = (name, rank)
    return work, plan


def xdist_command(py: str, work: dict[str, list[str]], extra: list[str], mode: str = "test",
                  workers: int = XDIST_WORKERS) -> list[str]:
    """One pytest run over ``workers`` xdist workers: the unit tests (``-m`` as :func:`command`) and, when ``work``
    has them, the committed notebooks under nbval, as :func:`command` runs them (cells in order: no random order)."""
    cmd = [py, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadscope", "-p", "tests.xdist_plan",
           "-m", MARKS[mode], f"--durations={SLOWEST}", "--durations-min=1", "-p", "tests.costs_plugin",
           "-p", "no:randomly"]
    if work.get("nbval"):
        cmd += ["--nbval-lax", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-p", "tests.nbval_digits"]
    return cmd + [*extra, *work.get("unit", []), *work.get("nbval", [])]


def nbval_groups(notebooks: list[str]) -> list[list[str]]:
    """Notebooks that must run in one process, in order: one whose parameters default to another's outputs (03 reads
    ``outputs/02_understanding_maps/stats``) runs after it, so nbval checks the run that finds that store."""
    parent = {nb: nb for nb in notebooks}

    def root(nb):
        while parent[nb] != nb:
            nb = parent[nb]
        return nb

    by_number = {Path(nb).name[:2]: nb for nb in notebooks}
    for nb in notebooks:
        src = ROOT / "notebooks" / "src" / (Path(nb).stem + ".py")
        text = src.read_text() if src.exists() else ""
        for n in set(re.findall(r'= "outputs/(\d\d)_', text)) - {Path(nb).name[:2]}:
            if n in by_number:
                parent[root(nb)] = root(by_number[n])
    groups: dict[str, list[str]] = {}
    for nb in sorted(notebooks):
        groups.setdefault(root(nb), []).append(nb)
    return list(groups.values())


def plan(lanes: int, only: str | None = None, costs: dict[str, float] | None = None,
         mode: str = "test") -> list[dict[str, list[str]]]:
    """``lanes`` lists of work, each ``{kind: [file, ...]}``: every test file and notebook in exactly one lane, dealt
    out longest first to the lane with the least recorded work (a notebook's cells stay together in one process, and so
    do the notebooks of one :func:`nbval_groups` group)."""
    costs = recorded_costs(mode) if costs is None else costs
    items = _items(mode == "extended")
    only = "unit" if mode != "test" else only
    work = []
    if only in (None, "unit"):
        work += [(costs.get(t, DEFAULT_COST), "unit", [t]) for t in items["unit"]]
    if only in (None, "nbval"):
        work += [(sum(costs.get(t, DEFAULT_COST) for t in g), "nbval", g) for g in nbval_groups(items["nbval"])]
    out: list[dict[str, list[str]]] = [{} for _ in range(lanes)]
    load = [0.0] * lanes
    for cost, kind, ts in sorted(work, key=lambda w: (-w[0], w[2])):
        i = load.index(min(load))
        load[i] += cost
        out[i].setdefault(kind, []).extend(ts)
    for lane in out:
        for ts in lane.values():
            ts.sort()
    return [lane for lane in out if lane]


def _wait(proc: subprocess.Popen, block: bool) -> tuple[int, float] | None:
    """``(exit status, CPU seconds)`` of a finished process (and every descendant it waited for), or None while it
    runs (``block=False``)."""
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def write_cost_table(costs: dict[str, float], doc: Path = ROOT / "docs" / "TESTING.md") -> None:
    """docs/TESTING.md's cost table (between its ``costs:begin`` / ``costs:end`` markers) from one run's seconds."""
    groups: dict[str, list[float]] = {}
    for t, s in costs.items():
        groups.setdefault(t, []).append(s)
    rows = sorted(((sum(v), t) for t, v in groups.items()), reverse=True)
    total = sum(s for s, _ in rows)
    lines = ["<!-- costs:begin (tools/run_tests.py --record writes this table) -->",
             f"Seconds per test file and notebook in the recorded run (one thread each; {total / 60:.1f} CPU-minutes of "
             "tests in all, the pytest start-up of each part not counted):", "",
             "| file | seconds | share |", "|---|---:|---:|"]
    lines += [f"| `{t}` | {s:.0f} | {100 * s / total:.1f}% |" for s, t in rows if s >= 1]
    small = [t for s, t in rows if s < 1]
    if small:
        lines.append(f"| {len(small)} other files | <1 each | |")
    lines.append("<!-- costs:end -->")
    text = doc.read_text()
    a, b = text.index("<!-- costs:begin"), text.index("<!-- costs:end -->") + len("<!-- costs:end -->")
    doc.write_text(text[:a] + "\n".join(lines) + text[b:])


def main(argv=None) -> int:
    os.environ.setdefault("UNICACHE_PROGRESS", "0")  # as make test exports it: committed outputs carry no bars
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serial", action="store_true", help="one lane: everything one after the other (default on a "
                    "1-core machine)")
    ap.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads of the unit tests (default 1)")
    ap.add_argument("--nbval-threads", type=int, default=1, help="threads of nbval (default 1; the committed "
                    "notebooks were executed with 2)")
    ap.add_argument("--setup-seconds", type=float, default=None, help="time `make setup` took (printed with the rest)")
    ap.add_argument("--only", choices=("unit", "nbval"), default=None, help="run one kind of work")
    ap.add_argument("--extended", action="store_true", help="only the tests marked extended (make test-extended; "
                    "make test leaves them out)")
    ap.add_argument("--fast", action="store_true", help="unit tests without notebook runs, slow or extended tests "
                    "(make test-fast), in two lanes like make test")
    ap.add_argument("--record", action="store_true", help="write this run's seconds to tests/costs.json and "
                    "docs/TESTING.md's cost table")
    ap.add_argument("--runner", choices=("lanes", "xdist"), default="lanes", help="lanes (default): two planned lanes "
                    "side by side; xdist: one pytest run over pytest-xdist's workers (-n 2, the plan's scopes)")
    ap.add_argument("pytest_args", nargs="*", help="passed to every pytest run (after --)")
    args = ap.parse_args(argv)
    if min(args.threads, args.nbval_threads) < 1:
        ap.error("--threads and --nbval-threads must be at least 1")
    serial = args.serial or (os.cpu_count() or 1) < 2
    mode = "extended" if args.extended else "fast" if args.fast else "test"
    lanes = plan(1 if serial else 2, args.only, None, mode)
    threads = {"unit": args.threads, "nbval": args.nbval_threads}
    tmp = Path(tempfile.mkdtemp(prefix="unicache-costs-"))
    results: list[tuple[str, int, float, float]] = []  # (part, exit status, wall seconds, CPU seconds)
    lock = threading.Lock()

    def run_lane(i: int, lane: dict[str, list[str]], log) -> None:
        for kind, targets in lane.items():
            n = str(threads[kind])
            env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n,
                   "UNICACHE_TEST_COSTS": str(tmp / f"lane{i}-{kind}.json")}
            cmd = command(sys.executable, kind, targets, args.pytest_args, mode)
            what = f"{kind} ({len(targets)} {'notebooks' if kind == 'nbval' else 'test files'})"
            with lock:
                print(f"== lane {i + 1}: {what}, {n} thread{'s' * (int(n) > 1)}"
                      f"{', output shown when the lane ends' if log else ''}: {' '.join(targets)}", flush=True)
            t = time.time()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
            rc, cpu = _wait(proc, block=True)
            with lock:
                results.append((f"lane {i + 1} {what}", rc, time.time() - t, cpu))

    def run_xdist() -> None:
        work, xplan = xdist_plan(mode, args.only)
        (tmp / "plan.json").write_text(json.dumps(xplan))
        n = str(args.threads)
        env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "UNICACHE_XDIST_PLAN": str(tmp / "plan.json"),
               "UNICACHE_TEST_COSTS": str(tmp / "xdist.json")}
        what = " and ".join(f"{len(v)} {'notebooks' if k == 'nbval' else 'test files'}" for k, v in work.items())
        print(f"== xdist: {what} in one run, {XDIST_WORKERS} workers, {n} thread{'s' * (int(n) > 1)} each", flush=True)
        t = time.time()
        proc = subprocess.Popen(xdist_command(sys.executable, work, args.pytest_args, mode), cwd=ROOT, env=env)
        rc, cpu = _wait(proc, block=True)
        results.append((f"xdist ({what})", rc, time.time() - t, cpu))

    logs = [None] + [tempfile.TemporaryFile(mode="w+") for _ in lanes[1:]] if args.runner == "lanes" else [None]
    workers = ([threading.Thread(target=run_lane, args=(i, lane, logs[i])) for i, lane in enumerate(lanes)]
               if args.runner == "lanes" else [threading.Thread(target=run_xdist)])
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.time() - t0
    for i, log in enumerate(logs):
        if log is not None:
            log.seek(0)
            print(f"\n== lane {i + 1} output", flush=True)
            sys.stdout.write(log.read())
            log.close()
    costs: dict[str, float] = {}
    for f in sorted(tmp.glob("*.json")):
        costs.update(json.loads(f.read_text()))
    shutil.rmtree(tmp, ignore_errors=True)
    if costs and mode != "extended":
        (ROOT / "outputs").mkdir(exist_ok=True)
        (ROOT / "outputs" / f"test_costs{'_fast' if mode == 'fast' else ''}.json").write_text(
            json.dumps(costs, indent=1, sort_keys=True))
        if args.record:
            (FAST_COSTS if mode == "fast" else COSTS).write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")
            if mode == "test":
                write_cost_table(costs)
                cpu_min = sum(c for *_, c in results) / 60
                (ROOT / "data" / "results" / "make_test.json").write_text(json.dumps({
                    "wall_minutes": round((wall + (args.setup_seconds or 0)) / 60, 1),
                    "setup_minutes": round((args.setup_seconds or 0) / 60, 1), "cpu_minutes": round(cpu_min, 1),
                    "lanes": len(lanes) if args.runner == "lanes" else 1, "runner": args.runner,
                    "cpu_count": os.cpu_count(),
                    "passed": all(rc == 0 for _, rc, _, _ in results)}, indent=1) + "\n")
    print(f"\n== times ({f'one run, {XDIST_WORKERS} xdist workers' if args.runner == 'xdist' else 'one lane' if len(lanes) == 1 else f'{len(lanes)} lanes side by side'})")
    if args.setup_seconds is not None:
        print(f"  setup   {_minutes(args.setup_seconds)}")
    for part, rc, secs, cpu in results:
        print(f"  {part}: {_minutes(secs).strip()} (CPU {_minutes(cpu).strip()})  "
              f"{'passed' if rc == 0 else f'FAILED (exit {rc})'}")
    print(f"  total   {_minutes(wall + (args.setup_seconds or 0))}  (CPU of the tests: "
          f"{sum(c for *_, c in results) / 60:.1f} CPU-minutes)")
    return next((rc for _, rc, _, _ in results if rc != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
