"""`make test`: the unit tests and nbval on the committed notebooks, side by side, with the time of each stage.

    python tools/run_tests.py [--serial] [--threads N] [--nbval-threads N] [--setup-seconds S] [-- PYTEST ARGS]

Two stages, each one pytest process:

- **unit**: ``pytest tests`` (unit and property tests, the quick papermill runs, the browser test);
- **nbval**: ``pytest --nbval-lax`` on ``notebooks/NN_*.ipynb`` as committed, compared by the workbook's rule for
  checked outputs (``tests/nbval_digits.py``, docs/TESTING.md).

On a machine with two or more cores the stages run at the same time, one torch thread each (``--threads``), so
`make test` takes about as long as the longer stage. nbval runs at ``--nbval-threads`` (default 1) while the committed
notebooks were executed with 2 threads (`make notebooks` on 2 cores): another reduction order than the one that
wrote the outputs, so every `make test` also checks that the checked outputs are portable across thread counts.
The unit stage prints as it goes; the nbval stage's output is printed when it ends. The exit status is non-zero
when either stage fails; the last lines give each stage's wall-clock time, its CPU time (the stage's process and
everything it waited for: papermill kernels, the browser, torchrun ranks) and result, and the sum of the CPU times;
each stage's pytest lists its 25 slowest tests (``--durations``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


SLOWEST = 25  # each stage lists its slowest tests (pytest --durations)


def stage_commands(py: str, extra: list[str]) -> dict[str, list[str]]:
    notebooks = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    slow = [f"--durations={SLOWEST}", "--durations-min=1"]
    return {
        "unit": [py, "-m", "pytest", "tests", "-q", *slow, *extra],
        "nbval": [py, "-m", "pytest", "--nbval-lax", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
                  "-p", "no:randomly", "-p", "tests.nbval_digits", "-q", *slow, *extra, *notebooks],
    }


def _wait(proc: subprocess.Popen, block: bool) -> tuple[int, float] | None:
    """``(exit status, CPU seconds)`` of a finished stage (its process and every descendant it waited for), or None
    while it runs (``block=False``)."""
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    os.environ.setdefault("UNICACHE_PROGRESS", "0")  # as make test exports it: committed outputs carry no bars
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serial", action="store_true", help="one stage after the other (default on a 1-core machine)")
    ap.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads of the unit stage (default 1)")
    ap.add_argument("--nbval-threads", type=int, default=1, help="threads of the nbval stage (default 1; the "
                    "committed notebooks were executed with 2)")
    ap.add_argument("--setup-seconds", type=float, default=None, help="time `make setup` took (printed with the rest)")
    ap.add_argument("--only", choices=("unit", "nbval"), default=None, help="run one stage")
    ap.add_argument("pytest_args", nargs="*", help="passed to both pytest runs (after --)")
    args = ap.parse_args(argv)
    if min(args.threads, args.nbval_threads) < 1:
        ap.error("--threads and --nbval-threads must be at least 1")
    serial = args.serial or (os.cpu_count() or 1) < 2
    commands = stage_commands(sys.executable, args.pytest_args)
    if args.only:
        commands = {args.only: commands[args.only]}
    threads = {"unit": args.threads, "nbval": args.nbval_threads}

    def env_for(stage):
        n = str(threads[stage])
        return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}

    results: dict[str, tuple[int, float]] = {}
    cpu: dict[str, float] = {}
    if serial:
        for stage, cmd in commands.items():
            print(f"== {stage} ({threads[stage]} thread{'s' * (threads[stage] > 1)}): {' '.join(cmd[1:])}", flush=True)
            t = time.time()
            rc, cpu[stage] = _wait(subprocess.Popen(cmd, cwd=ROOT, env=env_for(stage)), block=True)
            results[stage] = (rc, time.time() - t)
    else:
        logs, procs, started = {}, {}, {}
        for stage, cmd in commands.items():
            live = stage == "unit" or len(commands) == 1
            print(f"== {stage} ({threads[stage]} thread{'s' * (threads[stage] > 1)}"
                  f"{'' if live else ', output shown when it ends'}): {' '.join(cmd[1:])}", flush=True)
            logs[stage] = None if live else tempfile.TemporaryFile(mode="w+")
            started[stage] = time.time()
            procs[stage] = subprocess.Popen(cmd, cwd=ROOT, env=env_for(stage), stdout=logs[stage],
                                            stderr=subprocess.STDOUT if logs[stage] else None)
        pending = dict(procs)
        while pending:
            for stage, p in list(pending.items()):
                done = _wait(p, block=False)
                if done is not None:
                    results[stage], cpu[stage] = (done[0], time.time() - started[stage]), done[1]
                    del pending[stage]
            time.sleep(0.5)
        for stage, log in logs.items():
            if log is not None:
                log.seek(0)
                print(f"\n== {stage} output", flush=True)
                sys.stdout.write(log.read())
                log.close()
    print("\n== stage times" + ("" if serial else " (the stages ran side by side)"))
    if args.setup_seconds is not None:
        print(f"  setup   {_minutes(args.setup_seconds)}")
    for stage, (rc, secs) in results.items():
        print(f"  {stage:<7} {_minutes(secs)}  (CPU {_minutes(cpu[stage]).strip()})  "
              f"{'passed' if rc == 0 else f'FAILED (exit {rc})'}")
    wall = (max(s for _, s in results.values()) if not serial else sum(s for _, s in results.values()))
    print(f"  total   {_minutes(wall + (args.setup_seconds or 0))}  (CPU of the stages: {sum(cpu.values()) / 60:.1f} "
          f"CPU-minutes)")
    return next((rc for rc, _ in results.values() if rc != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
