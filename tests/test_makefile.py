"""The Makefile's targets: each has a `##` help line and is documented in the README; `make lab` runs as
root and as a normal user, with autosave and the news question off (settings defaults it installs in .venv); the
`##` help lines are the one source of `make help` and of docs/SETUP.md's table of targets (tools/doc_numbers.py),
and the times they give come from recorded runs through markers, none typed."""
import json
import os
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


def _tool(name: str):
    """The module ``tools/<name>.py`` (tools/ is no package: imported by path, sys.path put back)."""
    import importlib

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_make_test_runs_every_file_and_notebook_once_and_nbval_under_another_thread_count(monkeypatch, capsys):
    """`make test` goes through tools/run_tests.py: every test file and every notebook in exactly one pytest process;
    nbval runs with 1 thread by default while the committed notebooks were executed with 2, so every run checks that
    the checked outputs survive another reduction order (docs/TESTING.md), by the workbook's rule (tests/nbval_digits.py);
    notebooks that read another's outputs run after it in one process."""
    import subprocess as sp

    run_tests = _tool("run_tests")
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
    run_tests = _tool("run_tests")
    items = run_tests._items()
    costs = {t: float(10 + 37 * i % 300) for i, t in enumerate(items["unit"] + items["nbval"])}
    lanes = run_tests.plan(2, costs=costs)
    loads = [sum(costs[t] for ts in lane.values() for t in ts) for lane in lanes]
    groups = [sum(costs[t] for t in g) for g in run_tests.nbval_groups(items["nbval"])]
    assert abs(loads[0] - loads[1]) <= max(groups + [costs[t] for t in items["unit"]])
    assert sum(loads) == pytest.approx(sum(costs.values()))
    assert run_tests.plan(1, only="nbval", costs=costs) == [{"nbval": sorted(items["nbval"])}]


def test_make_test_runner_xdist_runs_the_same_work_in_one_run(monkeypatch, capsys):
    """`make test RUNNER=xdist` (issue #65): one pytest run, `-n 2 --dist loadscope` (scopes from the plan), every test file and notebook
    once, nbval as the lanes run it, the slowest tests and the CPU time printed; tests/xdist_plan.py gets a plan where
    each file is its own group and 02's readers share 02's group, groups ranked longest first."""
    import subprocess as sp

    run_tests = _tool("run_tests")
    assert re.search(r"^test: setup\n\t.*tools/run_tests\.py.*\$\(if \$\(RUNNER\),--runner \$\(RUNNER\)\)", MAKEFILE, re.M)
    calls = []

    class Done:
        returncode = 0

        def __init__(self, cmd, cwd, env, **kw):
            calls.append((cmd, env, json.loads(Path(env["UNICACHE_XDIST_PLAN"]).read_text())))

    monkeypatch.setattr(sp, "Popen", Done)
    monkeypatch.setattr(run_tests, "_wait", lambda proc, block: (0, 600.0))
    assert run_tests.main(["--runner", "xdist"]) == 0
    printed = capsys.readouterr().out
    assert len(calls) == 1 and "CPU of the tests: 10.0 CPU-minutes" in printed and "2 xdist workers" in printed
    cmd, env, plan = calls[0]
    assert cmd[cmd.index("-n") + 1] == "2" and cmd[cmd.index("--dist") + 1] == "loadscope"
    assert {"tests.xdist_plan", "tests.costs_plugin", "tests.nbval_digits", "--nbval-lax", "no:randomly",
            f"--durations={run_tests.SLOWEST}"} <= set(cmd) and env["OMP_NUM_THREADS"] == "1"
    items = run_tests._items()
    targets = [c for c in cmd if c.startswith(("tests/test_", "notebooks/"))]
    assert sorted(targets) == sorted(items["unit"] + items["nbval"]) == sorted(plan)
    assert len({plan[t][0] for t in items["unit"]}) == len(items["unit"])
    assert len({plan[f"notebooks/{n}"][0] for n in ("02_understanding_maps.ipynb", "03_diffusion_steps.ipynb",
                                                     "04_head_pruning.ipynb", "07_diagnostics.ipynb")}) == 1
    costs = run_tests.recorded_costs()
    by_group = {}
    for t, (g, rank) in plan.items():
        by_group.setdefault((rank, g), 0.0)
        by_group[(rank, g)] += costs.get(t, run_tests.DEFAULT_COST)
    ranked = [c for _, c in sorted(by_group.items())]
    assert ranked == sorted(ranked, reverse=True)  # longest first


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


# ------------------------------------------------------------------ make help and docs/SETUP.md: one source, no typed time


SETUP = ROOT / "docs" / "SETUP.md"


def _setup_rows(text: str) -> dict[str, str]:
    """docs/SETUP.md's table of targets as a reader sees it, in plain text: target -> what it does (markers shown by
    their values, each link to a docs page written back as ``docs/PAGE.md[#anchor]``, as the `##` line has it)."""
    rows = {}
    for line in text[text.index("<!-- targets:begin -->"):text.index("<!-- targets:end -->")].splitlines():
        m = re.fullmatch(r"\| `make ([\w-]+)` \| (.*) \|", line)
        if m:
            plain = re.sub(r"<!--.*?-->", "", m.group(2))
            plain = re.sub(r"\[(\w[\w-]*\.md)\]\(\1(#[\w-]+)?\)", r"docs/\1\2", plain)
            rows[m.group(1)] = " ".join(plain.split())
    return rows


def _make_help() -> dict[str, str]:
    """What `make help` prints: target -> its text, the wrapped lines joined."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "MAKEFLAGS": ""}).stdout
    help_, target = {}, None
    for line in out.splitlines():
        m = re.match(r"make ([\w-]+)\s+(.*)$", line)
        if m:
            target = m.group(1)
            help_[target] = m.group(2)
        elif target and line.startswith(" "):
            help_[target] += " " + line.strip()
    return {t: " ".join(text.split()) for t, text in help_.items()}


def test_the_setup_table_is_what_the_tool_generates_from_the_makefile():
    """docs/SETUP.md's table between its targets:begin/end comments is exactly the one tools/doc_numbers.py writes
    from the Makefile's `##` lines (`make docs`), one row per target in the Makefile's order."""
    dn = _tool("doc_numbers")
    assert dn.check_targets_table(SETUP) == [], "docs/SETUP.md's table of targets was edited by hand or the Makefile's " \
                                                 "## lines changed since: `make docs` regenerates it"
    assert list(_setup_rows(SETUP.read_text())) == [t for t, _ in dn.make_help(MAKEFILE)]
    assert sorted(_setup_rows(SETUP.read_text())) == sorted(TARGETS)


def test_a_hand_edited_setup_table_fails_and_make_docs_restores_it(tmp_path):
    dn = _tool("doc_numbers")
    page = tmp_path / "SETUP.md"
    text = SETUP.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `make evaluate` |"))
    page.write_text(text.replace(row, row.replace("the decisive runs", "the runs")))
    problems = dn.check_targets_table(page)
    assert len(problems) == 1 and "make evaluate" in problems[0] and "make docs" in problems[0]
    assert any("targets" in p for p in dn.check([page]))  # the check `make docs` and test_doc_numbers run
    dn.write([page])  # `make docs`: the table as the Makefile's lines give it again, markers refreshed from their sources
    specs_only = lambda t: dn.MARKER.sub(lambda m: m.group("spec"), t)  # noqa: E731 - values aside, they may be newer
    assert specs_only(page.read_text()) == specs_only(dn.with_targets_table(text))
    page.write_text(text.replace("<!-- targets:end -->", ""))
    assert "no <!-- targets:begin -->" in dn.check_targets_table(page)[0]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_prints_what_setup_shows():
    """`make help` (the Makefile's awk over its own `##` lines, markers left out) and docs/SETUP.md's table give every
    target the same text, times included, in the same order."""
    printed, rows = _make_help(), _setup_rows(SETUP.read_text())
    assert list(printed) == list(rows), "make help and docs/SETUP.md list other targets or another order"
    for target, text in rows.items():
        assert printed[target] == text, f"make {target}:\n  make help:     {printed[target]}\n  docs/SETUP.md: {text}"


def test_the_help_lines_type_no_time_by_hand():
    """Every time a `##` line gives comes from a recorded run through a marker (`make docs` refreshes it,
    test_doc_numbers checks it); `make run` and `make test` quote theirs (the notebooks' data/results/NN_*.run.json,
    data/results/make_test.json), and a target without a recorded run says so instead of an estimate."""
    dn = _tool("doc_numbers")
    help_ = dict(dn.make_help(MAKEFILE))
    typed = {t: dn.unmarked_measurements(text) for t, text in help_.items() if dn.unmarked_measurements(text)}
    assert not typed, f"times typed by hand in the Makefile's ## lines (make them markers over a recorded run): {typed}"
    assert dn.unmarked_measurements("## x: takes about 45 minutes on 2 CPU cores")  # what the rule catches
    sources = {t: {dn.parse_spec(mk.spec)[0] for mk in dn.find_markers(text)} for t, text in help_.items()}
    assert "@run_minutes" in sources["run"]
    assert {"data/results/make_test.json#wall_minutes", "data/results/make_test.json#cpu_minutes"} <= sources["test"]
    assert ROOT / "Makefile" in dn.doc_files()  # its markers: checked by test_doc_numbers, refreshed by `make docs`


def test_the_xdist_plan_keeps_a_file_and_a_chain_on_one_worker(tmp_path):
    """`--dist loadgroup` silently stopped grouping on pytest 9.2 (pytest-dev/pytest-xdist#1386): a notebook's cells
    ran on both workers and every cell after the first failed with a NameError. tests/xdist_plan.py's scheduler reads
    the scopes from the plan instead: each file's tests on one worker, and the two files of one chain on one worker,
    in the plan's order."""
    for name in ("test_a.py", "test_b.py", "test_c.py", "test_d.py"):
        (tmp_path / name).write_text(
            "import os, pytest\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            "def test_where(i):\n"
            f"    open({str(tmp_path / 'log.txt')!r}, 'a').write(f'{name} {{os.environ[\"PYTEST_XDIST_WORKER\"]}}\\n')\n")
    plan = {"test_a.py": ["chain", 0], "test_b.py": ["chain", 0], "test_c.py": ["test_c.py", 1],
            "test_d.py": ["test_d.py", 2]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "UNICACHE_XDIST_PLAN": str(tmp_path / "plan.json"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "-p", "tests.xdist_plan",
                          "-p", "no:randomly", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = (tmp_path / "log.txt").read_text().split()
    where = {}
    for name, worker in zip(lines[::2], lines[1::2]):
        where.setdefault(name, set()).add(worker)
    assert sorted(where) == ["test_a.py", "test_b.py", "test_c.py", "test_d.py"]
    assert all(len(w) == 1 for w in where.values()), where  # a file never split
    assert where["test_a.py"] == where["test_b.py"], where  # a chain never split
    order = [n for n in lines[::2] if n in ("test_a.py", "test_b.py")]
    assert order == sorted(order), order  # and run in its order: a before b
