"""Shared plumbing of the solution scripts: the repository root on ``sys.path`` (so a fork's own
``unicache_lib`` is the one imported), one CPU thread, and the ``--quick`` flag."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def setup_threads() -> None:
    import torch

    torch.set_num_threads(1)


def parse(doc: str, argv=None) -> argparse.Namespace:
    """``--quick``: small sample counts (what tests/test_solutions.py runs); ``--only K``: one exercise."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sample counts (a minute or less on one core)")
    ap.add_argument("--only", type=int, default=None, help="run only exercise K")
    return ap.parse_args(argv)


def run_all(module, args) -> dict:
    """Run ``module.exercise_K(quick=...)`` for every K (or ``--only``), printing each docstring's first line
    and the findings it returns."""
    import inspect

    setup_threads()
    found = {}
    names = sorted(n for n in dir(module) if n.startswith("exercise_"))
    for n in names:
        k = int(n.split("_")[1])
        if args.only is not None and k != args.only:
            continue
        fn = getattr(module, n)
        print(f"\n=== {n}: {inspect.getdoc(fn).splitlines()[0]}")
        res = fn(quick=args.quick)
        for key, v in res.items():
            if key.startswith("_"):
                continue
            print(f"  {key}: {v}")
        found[k] = res
    return found
