"""pytest plugin (``-p tests.xdist_plan``) for `make test RUNNER=xdist` (``tools/run_tests.py --runner xdist``: one
pytest run, ``-n 2 --dist loadscope`` with this plan's scopes). Every test goes into the group of its file, and every
notebook into the group of its chain (``tools/run_tests.py:nbval_groups``: 03, 04 and 07 read 02's outputs, so they run
after it, in one worker), so a file's module fixtures are built once and a notebook's cells stay together and in
order; the groups are collected longest first by the recorded seconds (``tests/costs.json``), so a free worker takes
the longest work left.
The plan comes from the runner, as JSON in the file ``UNICACHE_XDIST_PLAN`` names: ``{path: [group, rank]}``."""
from __future__ import annotations

import json
import os

import pytest


def _plan() -> dict:
    path = os.environ.get("UNICACHE_XDIST_PLAN")
    return json.load(open(path)) if path else {}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's ``loadscope`` scheduler with each test's scope read from the plan (its file's group), not from its node
    id: ``--dist loadgroup`` writes the group into the node id, which pytest 9.2 no longer lets a plugin change, so it
    silently stopped grouping (pytest-dev/pytest-xdist#1386) and a notebook's cells ran on both workers."""
    from xdist.scheduler import LoadScopeScheduling

    plan = _plan()

    class PlannedScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return plan.get(path, (path, None))[0]

    return PlannedScopes(config, log)


def pytest_collection_modifyitems(config, items):
    """Longest first; a file's (and a chain's) items keep their order (sorted() is stable), so the scheduler, which
    hands out scopes in the order it first meets them, gives a free worker the longest work left."""
    plan = _plan()
    last = len(plan)
    items[:] = sorted(items, key=lambda it: plan.get(it.nodeid.split("::")[0], (None, last))[1])
