"""After `make notebooks` executes a notebook: keep its scoreboard and its run time as committed results.

    python tools/record_results.py notebooks/05_kv_eviction.ipynb [...]

For each executed notebook ``notebooks/NN_topic.ipynb`` (run by papermill with its default ``OUT_DIR``,
``outputs/NN_topic``), writes atomically

- ``data/results/NN_topic.json``: a copy of ``outputs/NN_topic/scoreboard.json``, the claims the notebook measured;
- ``data/results/NN_topic.run.json`` (also for a lesson that rules on no claim, the primer): papermill's run time of the notebook (``duration_s``), when it ran, the
  machine's core count, and ``starter_cells_seconds``: exercise number -> papermill's seconds for that exercise's
  starter cell (``# Exercise K starter``), as committed, its gap unfilled (tests/test_notebook_sources.py bounds them).

It must run before tools/clean_nb.py, which drops papermill's timings from the committed notebook. It refuses a
scoreboard older than the run (the notebook did not write one this time) and a notebook papermill did not finish.
README.md and docs/ quote these files through number markers (tools/doc_numbers.py); `make docs` refreshes them.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import sys
from pathlib import Path

from unicache_lib.store import _atomic_write_bytes  # the store's write: a unique temp file, fsync, replace

ROOT = Path(__file__).resolve().parents[1]
STARTER = re.compile(r"^# Exercise (\d+) starter", re.M)


def starter_seconds(cells: list) -> dict[str, float]:
    """Exercise number -> papermill's recorded duration of its starter cell, in seconds."""
    out = {}
    for c in cells:
        src = "".join(c.get("source", ""))
        m = STARTER.match(src) if c.get("cell_type") == "code" else None
        if m:
            d = c.get("metadata", {}).get("papermill", {}).get("duration")
            if d is None:
                raise SystemExit(f"exercise {m.group(1)}'s starter cell has no papermill duration (not executed?)")
            out[m.group(1)] = round(float(d), 2)
    return out


def record(notebook: Path, root: Path = ROOT) -> tuple[Path, ...]:
    """Write ``data/results/<nb>.json`` and ``<nb>.run.json`` for one executed notebook (only the latter for a notebook
    without a scoreboard); returns the paths written."""
    notebook = Path(notebook)
    name = notebook.stem
    nb = json.loads(notebook.read_text())
    pm = nb.get("metadata", {}).get("papermill", {})
    if pm.get("duration") is None or pm.get("start_time") is None or pm.get("exception"):
        raise SystemExit(f"{notebook}: papermill recorded no finished run (record before tools/clean_nb.py strips it)")
    board = root / "outputs" / name / "scoreboard.json"
    out = root / "data" / "results" / f"{name}.json"
    rules_claims = "Scoreboard(" in json.dumps(json.loads(notebook.read_text()).get("cells", []))
    if not board.is_file() and not rules_claims:  # a lesson without claims (the primer): its run time only
        out = None
    elif not board.is_file():
        raise SystemExit(f"{notebook}: no {board.relative_to(root)} (the notebook writes it to its OUT_DIR)")
    else:
        started = dt.datetime.fromisoformat(pm["start_time"]).timestamp()
        if board.stat().st_mtime < started:
            raise SystemExit(f"{board.relative_to(root)} is older than this run of {notebook}: not copied")
        json.loads(board.read_text())  # a scoreboard that does not parse is not copied
        _atomic_write_bytes(out, board.read_bytes())
    run = {"notebook": name, "duration_s": round(float(pm["duration"]), 1), "end_time": pm.get("end_time"),
           "cpu_count": os.cpu_count(), "machine": platform.machine(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "starter_cells_seconds": starter_seconds(nb.get("cells", []))}
    run_file = root / "data" / "results" / f"{name}.run.json"
    _atomic_write_bytes(run_file, (json.dumps(run, indent=1) + "\n").encode())
    return tuple(p for p in (out, run_file) if p is not None)


if __name__ == "__main__":
    for nb in sys.argv[1:]:
        for p in record(Path(nb)):
            print(f"wrote {p.relative_to(ROOT)}")
