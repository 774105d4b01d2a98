"""pytest plugin (``-p tests.xdist_plan``) for `make test RUNNER=xdist` (``tools/run_tests.py --runner xdist``: one
pytest run, ``-n 2 --dist loadgroup``). Every test goes into the xdist group of its file, and every notebook into the
group of its chain (``tools/run_tests.py:nbval_groups``: 03, 04 and 07 read 02's outputs, so they run after it, in one
worker), so a file's module fixtures are built once and a notebook's cells stay together and in order; the groups are
collected longest first by the recorded seconds (``tests/costs.json``), so a free worker takes the longest work left.
The plan comes from the runner, as JSON in the file ``UNICACHE_XDIST_PLAN`` names: ``{path: [group, rank]}``."""
from __future__ import annotations

import json
import os

import pytest


def _plan() -> dict:
    path = os.environ.get("UNICACHE_XDIST_PLAN")
    return json.load(open(path)) if path else {}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    plan = _plan()
    last = len(plan)
    for item in items:
        path = item.nodeid.split("::")[0]
        group, _ = plan.get(path, (path, last))
        item.add_marker(pytest.mark.xdist_group(group))
    # longest first; a file's (and a chain's) items keep their order (sorted() is stable)
    items[:] = sorted(items, key=lambda it: plan.get(it.nodeid.split("::")[0], (None, last))[1])
