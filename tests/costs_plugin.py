"""pytest plugin (``-p tests.costs_plugin``): seconds spent per test file or notebook, written as JSON to the path in
``UNICACHE_TEST_COSTS`` when the session ends. ``tools/run_tests.py`` sums them into ``outputs/test_costs.json``, uses
the recorded ones (``tests/costs.json``) to split the work evenly over the cores, and ``--record`` turns them into
docs/TESTING.md's cost table."""
from __future__ import annotations

import json
import os
from collections import defaultdict

_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration  # setup, call and teardown of every item


def pytest_sessionfinish(session):
    path = os.environ.get("UNICACHE_TEST_COSTS")
    if path and not hasattr(session.config, "workerinput"):  # under xdist the controller, which gets every report
        with open(path, "w") as f:
            json.dump({k: round(v, 2) for k, v in sorted(_seconds.items())}, f, indent=1)
