"""The Makefile's targets: each has a `##` help line and is documented in the README; `make lab` runs as
root and as a normal user, with autosave and the news question off (settings defaults it installs in .venv); the
Makefile's help and docs/SETUP.md give each target the same time."""
import json
import re
import shutil
import subprocess
import sys
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


def _run_tests():
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import run_tests
    finally:
        sys.path.pop(0)
    return run_tests


def test_make_test_runs_every_file_and_notebook_once_and_nbval_under_another_thread_count(monkeypatch, capsys):
    """`make test` goes through tools/run_tests.py: every test file and every notebook in exactly one pytest process;
    nbval runs with 1 thread by default while the committed notebooks were executed with 2, so every run checks that
    the checked outputs survive another reduction order (docs/TESTING.md), by the workbook's rule (tests/nbval_digits.py);
    notebooks that read another's outputs run after it in one process."""
    import subprocess as sp

    run_tests = _run_tests()
    assert re.search(r"^test: setup\n\t\$\(BIN\)/python tools/run_tests\.py", MAKEFILE, re.M)
    calls = []

    class Done:
        returncode = 0

        def __init__(self, cmd, cwd, env, **kw):
            calls.append((cmd, env))

    monkeypatch.setattr(sp, "Popen", Done)
    monkeypatch.setattr(run_tests, "_wait", lambda proc, block: (0, 90.0))  # each process: exit 0, 1.5 CPU-minutes
    monkeypatch.setattr(run_tests.os, "cpu_count", lambda: 2)
    assert run_tests.main(["--setup-seconds", "3"]) == 0
    printed = capsys.readouterr().out
    assert "(CPU 1.5 min)" in printed and f"CPU of the tests: {1.5 * len(calls):.1f} CPU-minutes" in printed
    assert 2 <= len(calls) <= 4 and "2 lanes side by side" in printed
    assert all(f"--durations={run_tests.SLOWEST}" in cmd and "tests.costs_plugin" in cmd for cmd, _ in calls)
    nbval = [(cmd, env) for cmd, env in calls if "--nbval-lax" in cmd]
    unit = [cmd for cmd, _ in calls if "--nbval-lax" not in cmd]
    assert all(env["OMP_NUM_THREADS"] == "1" and "tests.nbval_digits" in cmd for cmd, env in nbval)
    run_nbs = [c for cmd, _ in nbval for c in cmd if c.endswith(".ipynb")]
    assert sorted(run_nbs) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    chain = next(cmd for cmd, _ in nbval if "notebooks/03_diffusion_steps.ipynb" in cmd)
    order = [c[10:12] for c in chain if c.endswith(".ipynb")]
    assert {"02", "03", "04", "07"} <= set(order) and order == sorted(order)  # 02's store before its readers
    files = [c for cmd in unit for c in cmd if c.startswith("tests/test_")]
    assert sorted(files) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    with pytest.raises(SystemExit):
        run_tests.main(["--nbval-threads", "0"])


def test_the_lanes_are_dealt_longest_first():
    """Two lanes, recorded costs: no lane carries more than the other plus its largest item (the longest-first rule)."""
    run_tests = _run_tests()
    items = run_tests._items()
    costs = {t: float(10 + 37 * i % 300) for i, t in enumerate(items["unit"] + items["nbval"])}
    lanes = run_tests.plan(2, costs=costs)
    loads = [sum(costs[t] for ts in lane.values() for t in ts) for lane in lanes]
    groups = [sum(costs[t] for t in g) for g in run_tests.nbval_groups(items["nbval"])]
    assert abs(loads[0] - loads[1]) <= max(groups + [costs[t] for t in items["unit"]])
    assert sum(loads) == pytest.approx(sum(costs.values()))
    assert run_tests.plan(1, only="nbval", costs=costs) == [{"nbval": sorted(items["nbval"])}]


# ------------------------------------------------------------------------------ make lab: a clone that stays clean

LAB_SETTINGS = {  # what make lab installs (tools/lab_overrides.json): plugin -> setting -> value
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},  # running a lesson never rewrites the notebook
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},  # no "Jupyter news?" question
}


def _make_var(name: str) -> str:
    return subprocess.run(["make", "-s", "--no-print-directory", "--eval", f"print-var: ; @echo $({name})", "print-var"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_lab_installs_settings_defaults_where_this_jupyterlab_reads_them():
    """`make lab` copies tools/lab_overrides.json to <JupyterLab's app dir>/settings/overrides.d/ of .venv (the README
    says: autosave off, news question off) and turns the news feed off on the command line."""
    jupyterlab = pytest.importorskip("jupyterlab.commands")
    dest = _make_var("LAB_OVERRIDES")
    assert Path(dest).parent.as_posix() == ".venv/share/jupyter/lab/settings/overrides.d" and dest.endswith(".json")
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():  # the tests run in the project's .venv
        assert (ROOT / dest).parent.parent.resolve() == Path(jupyterlab.get_app_dir()).resolve() / "settings"
    out = subprocess.run(["make", "-n", "-W", "tools/lab_overrides.json", "lab", "EUID=1000"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert f"cp tools/lab_overrides.json {dest}" in out
    lab = next(line for line in out.splitlines() if "jupyter lab" in line)
    assert "--LabApp.news_url=None" in lab


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_lab_settings_are_valid_for_the_installed_jupyterlab(tmp_path):
    """The override file's plugins and keys exist in this JupyterLab's schemas with valid values, and JupyterLab's own
    settings reader (what the lab's settings API serves) gives autosave false and fetchNews "false" from it."""
    settings_utils = pytest.importorskip("jupyterlab_server.settings_utils")
    jsonschema = pytest.importorskip("jsonschema")
    from jupyterlab.commands import get_app_dir

    schemas = Path(get_app_dir()) / "schemas"
    overrides = json.loads((ROOT / "tools" / "lab_overrides.json").read_text())
    assert {k: {s: overrides[k][s] for s in v} for k, v in LAB_SETTINGS.items() if k in overrides} == LAB_SETTINGS
    for plugin, values in overrides.items():
        package, name = plugin.split(":")
        schema_file = schemas / package / f"{name}.json"
        assert schema_file.is_file(), f"{plugin}: no schema {schema_file} in this JupyterLab"
        props = json.loads(schema_file.read_text())["properties"]
        for key, value in values.items():
            assert key in props, f"{plugin} has no setting {key!r} (it has {sorted(props)})"
            jsonschema.validate(value, {k: v for k, v in props[key].items() if k != "default"})
    # the real recipe, into a stand-in .venv: the file lands where the settings reader looks
    venv = tmp_path / "venv"
    subprocess.run(["make", "-s", f"VENV={venv}", f"{venv}/share/jupyter/lab/settings/overrides.d/unicache-workbench.json"],
                   cwd=ROOT, check=True, capture_output=True)
    for plugin, values in LAB_SETTINGS.items():
        got = settings_utils.get_settings(str(venv / "share/jupyter/lab/settings"), str(schemas),
                                          str(tmp_path / "user-settings"), schema_name=plugin)[0]
        assert {k: got["settings"].get(k, got["schema"]["properties"][k]["default"]) for k in values} == values


# ------------------------------------------------------------------------------ durations: the Makefile and SETUP agree

DURATION = re.compile(r"(?:about\s+)?(\d[\d,]*(?:\.\d+)?)\s+(?:CPU\s+)?(minutes?|min|hours?)\b|\b(hours)\b")


def _minutes(text: str) -> list[float | None]:
    """Each duration in ``text`` in minutes, in order; a bare "hours" is None (an hour or more)."""
    out = []
    for m in DURATION.finditer(text):
        if m.group(3):
            out.append(None)
        else:
            n = float(m.group(1).replace(",", ""))
            out.append(n * 60 if m.group(2).startswith("hour") else n)
    return out


def _help(target: str) -> str:
    m = re.search(rf"^## {re.escape(target)}:(.*?)(?=^[^#])", MAKEFILE, re.M | re.S)
    return re.sub(r"\s*\n##\s*", " ", m.group(1)) if m else ""


def _setup_row(target: str) -> str:
    text = re.sub(r"<!--num .*?-->(.*?)<!--/num-->", r"\1", (ROOT / "docs" / "SETUP.md").read_text())  # as shown
    m = re.search(rf"^\| `make {re.escape(target)}` \|(.*)$", text, re.M)
    return m.group(1) if m else ""


def test_duration_parsing():
    assert _minutes("(about 15 minutes on 2 idle CPU cores, 30 on a busy machine)") == [15]
    assert _minutes("513 CPU minutes, about 9 hours") == [513, 540]
    assert _minutes("hours on a CPU") == [None]


@pytest.mark.parametrize("target", TARGETS)
def test_the_makefile_help_and_setup_give_the_same_time(target):
    """Where both the `##` help and docs/SETUP.md's row say how long a target takes, they agree within a quarter
    (`make evaluate` once said 15 minutes in one and 35 in the other, `make replicate` hours and 45 minutes)."""
    made, setup = _minutes(_help(target)), _minutes(_setup_row(target))
    if not made or not setup:
        return
    a, b = made[0], setup[0]
    said = f"make {target}: the Makefile says {_help(target).strip()!r}, docs/SETUP.md {_setup_row(target).strip()!r}"
    if a is None or b is None:  # "hours" on one side: the other must say an hour or more
        assert (a or 60) >= 60 and (b or 60) >= 60, said
    else:
        assert abs(a - b) <= 0.25 * max(a, b), said
