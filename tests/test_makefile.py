"""The Makefile's targets: each has a `##` help line and is documented in the README; `make lab` runs as
root and as a normal user."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()
TARGETS = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.M).group(1).split()


def test_every_target_has_a_help_line_and_a_readme_entry():
    readme = (ROOT / "README.md").read_text()
    assert len(TARGETS) >= 13
    for t in TARGETS:
        assert re.search(rf"^## {re.escape(t)}:", MAKEFILE, re.M), f"no '## {t}:' help line in the Makefile"
        assert f"make {t}`" in readme or f"`make {t} " in readme, f"`make {t}` is not documented in README.md"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("euid, flag", [("0", True), ("1000", False)])
def test_lab_adds_allow_root_only_for_root(euid, flag):
    out = subprocess.run(["make", "-n", "lab", f"EUID={euid}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lab = [line for line in out.splitlines() if "jupyter lab" in line]
    assert len(lab) == 1 and "--ServerApp.root_dir=." in lab[0] and "--LabApp.default_url=/lab/tree/notebooks" in lab[0]
    assert ("--allow-root" in lab[0]) is flag


def test_make_test_runs_both_stages_and_nbval_under_another_thread_count(monkeypatch, capsys):
    """`make test` goes through tools/run_tests.py; its nbval stage runs with 1 thread by default while the committed
    notebooks were executed with 2, so every run checks that the checked outputs survive another reduction order
    (docs/TESTING.md), and it applies the workbook's rule for checked outputs (tests/nbval_digits.py)."""
    import subprocess as sp
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import run_tests
    finally:
        sys.path.pop(0)
    assert re.search(r"^test: setup\n\t\$\(BIN\)/python tools/run_tests\.py", MAKEFILE, re.M)
    calls = []

    class Done:
        returncode = 0

        def __init__(self, cmd, cwd, env, **kw):
            calls.append((cmd, env))

        def poll(self):
            return 0

    monkeypatch.setattr(sp, "Popen", Done)
    monkeypatch.setattr(run_tests, "_wait", lambda proc, block: (0, 90.0))  # each stage: exit 0, 1.5 CPU-minutes
    assert run_tests.main(["--setup-seconds", "3"]) == 0
    printed = capsys.readouterr().out
    assert "(CPU 1.5 min)" in printed and "CPU of the stages: 3.0 CPU-minutes" in printed
    assert all(f"--durations={run_tests.SLOWEST}" in cmd for cmd, _ in calls)  # each stage names its slowest tests
    stages = {("nbval" if "--nbval-lax" in cmd else "unit"): env for cmd, env in calls}
    assert set(stages) == {"unit", "nbval"}
    assert stages["nbval"]["OMP_NUM_THREADS"] == "1" and stages["unit"]["OMP_NUM_THREADS"] == "1"
    nbval_cmd = next(cmd for cmd, _ in calls if "--nbval-lax" in cmd)
    assert "tests.nbval_digits" in nbval_cmd and sum(c.endswith(".ipynb") for c in nbval_cmd) >= 7
    with pytest.raises(SystemExit):
        run_tests.main(["--nbval-threads", "0"])
