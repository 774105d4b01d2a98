"""A clone that stays clean after the lab (issue #52): `make lab` on a fresh `git clone` of HEAD, a lesson run
end to end in headless Chromium, the lab shut down, and `git status --porcelain` in the clone is empty.

`make lab`'s design is "autosave off" (README.md, docs/SETUP.md): it installs `tools/lab_overrides.json` as a
JupyterLab settings default, so running a lesson never rewrites the committed notebook (nor, through jupytext's
pairing, its source in notebooks/src/); what a lesson writes goes to the ignored `outputs/`. One lesson is enough
to show that, and the test runs one: 00_primer, the shortest (about 15 s of compute). The other lessons differ in
what their cells compute, not in what the lab writes: every lesson's files go under its OUT_DIR in `outputs/` (the
parameters cell of each notebooks/src/NN_*.py), and the notebook itself is the lab's to write or not.

How it stays close to a reader's `make lab`:

- the clone is `git clone` of this repository's HEAD (the committed Makefile and lab settings, not the working
  tree's), and the lab is started by `make lab` itself in the clone, its real recipe (the settings file copied into
  the environment's JupyterLab app dir, then `jupyter lab` with LAB_FLAGS, `--allow-root` as root);
- the environment is a stand-in `.venv` passed as `VENV=` (make lab's own variable), outside the clone, so nothing
  in the clone or in this checkout's `.venv` is written by the test: a Python venv whose packages are this checkout's
  `.venv` (a .pth file), whose JupyterLab app dir holds links to the real one's static files and schemas, and whose
  setup stamp is newer than the clone's pyproject.toml (so `make setup` has nothing to do);
- JupyterLab's configuration and user settings live in a temporary JUPYTER_CONFIG_DIR: the server's port (a free
  one), token and no browser, and one user setting, `autosaveInterval` 5 s, so that a lab which did autosave
  would save during the test (JupyterLab's default interval is 120 s); the test reads back from the running
  lab's settings API that autosave is off and the interval is the short one;
- the kernel imports the clone's `unicache_lib` (PYTHONPATH), as the clone's own editable install would.

After "Run All Cells" the test waits until every code cell has run, then two autosave intervals more, then shuts
the lab down from its File menu (as a reader closing it; the server's shutdown API if the menu does not answer),
and asserts: `make lab` ended, the lesson wrote its figures under the clone's ignored `outputs/00_primer/`, the tab
is still unsaved, neither the notebook nor its paired source was written (same inode and mtime: 00_primer's
outputs are reproducible, so a lab that autosaves rewrites the committed bytes and `git status` alone would not see
it; with autosave forced on in the stand-in's settings defaults this check fails), and `git status --porcelain` in
the clone is empty.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_browser import _browser, _free_port, _need_browser

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00_primer"
AUTOSAVE_INTERVAL_S = 5  # the test's user setting: a lab that autosaves would save within the test
pytestmark = pytest.mark.extended


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def _stand_in_venv(venv: Path, clone: Path) -> None:
    """A `.venv` for `make lab VENV=...`: its own prefix (so JupyterLab's app dir, where make lab installs the
    settings defaults, is inside it), this checkout's .venv's packages, and links to the real app dir's files."""
    real = Path(sys.prefix)
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    (site / "workbench-venv.pth").write_text(str(next((real / "lib").glob("python3.*")) / "site-packages") + "\n")
    for tool, module in (("jupyter", "jupyter_core.command"), ("jupyter-lab", "jupyterlab.labapp")):
        script = venv / "bin" / tool
        script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    share = venv / "share" / "jupyter"
    (share / "lab").mkdir(parents=True)
    for name in ("static", "schemas", "themes"):  # the built lab; settings/ is make lab's to fill
        (share / "lab" / name).symlink_to(real / "share" / "jupyter" / "lab" / name)
    for name in ("labextensions", "kernels"):  # ipywidgets' extension, the python3 kernel of `make setup`
        (share / name).symlink_to(real / "share" / "jupyter" / name)
    stamp = venv / ".setup-stamp"
    stamp.touch()
    t = (clone / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamp, (t, t))


def _get(url: str, token: str):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, seconds: int = 120) -> None:
    import socket

    for _ in range(seconds):
        if proc.poll() is not None:
            pytest.fail(f"make lab exited ({proc.returncode}) before serving:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(1)
    pytest.fail(f"make lab did not serve on port {port} in {seconds} s:\n{log.read_text()[-3000:]}")


RUN_STATE = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
  .map(p => p.textContent.trim())"""


def _run_all_and_wait(page, seconds: int = 600) -> list[str]:
    """Run → Run All Cells, then wait until no cell is queued or running and every code cell has run (or one failed:
    Run All stops there). Returns the prompts."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    deadline, prompts = time.time() + seconds, []
    page.wait_for_function("() => [...document.querySelectorAll('.jp-InputArea-prompt')]"
                           ".some(p => p.textContent.includes('*'))", timeout=60_000)
    while time.time() < deadline:
        prompts = page.evaluate(RUN_STATE)
        if not any("*" in p for p in prompts):
            time.sleep(2)  # still nothing queued two seconds later: Run All has ended
            prompts = page.evaluate(RUN_STATE)
            if not any("*" in p for p in prompts):
                return prompts
        time.sleep(1)
    pytest.fail(f"the lesson did not finish in {seconds} s: prompts {prompts}")


def _shut_down(page, url: str, token: str, make: subprocess.Popen) -> None:
    """File → Shut Down, as a reader closing the lab; the server's shutdown API if the menu does not end it."""
    try:
        page.locator(".lm-MenuBar-itemLabel", has_text="File").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Shut Down").first.click(timeout=10_000)
        page.locator(".jp-Dialog button", has_text="Shut Down").click(timeout=10_000)
        make.wait(60)
        return
    except Exception:  # noqa: BLE001 - fall back to the API below
        pass
    try:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/shutdown", method="POST",
                                                      headers={"Authorization": f"token {token}"}), timeout=10)
    except OSError:
        pass
    make.wait(60)


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git")
def test_running_a_lesson_in_make_lab_leaves_the_clone_clean(tmp_path):
    pw = _need_browser()
    t0 = time.time()
    clone, venv, config = tmp_path / "clone", tmp_path / "venv", tmp_path / "jupyter-config"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert _git(clone, "status", "--porcelain") == ""
    _stand_in_venv(venv, clone)
    lesson_files = [clone / "notebooks" / f"{LESSON}.ipynb", clone / "notebooks" / "src" / f"{LESSON}.py"]
    before = {f: (f.stat().st_ino, f.stat().st_mtime_ns) for f in lesson_files}

    port, token = _free_port(), os.urandom(12).hex()
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"open_browser": False, "ip": "127.0.0.1", "port": port, "port_retries": 0},
        "IdentityProvider": {"token": token}}))
    user_settings = config / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    user_settings.mkdir(parents=True)
    (user_settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosaveInterval": AUTOSAVE_INTERVAL_S}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"), "PYTHONPATH": str(clone),
           "OMP_NUM_THREADS": "1", "MAKEFLAGS": ""}
    env.pop("JUPYTERLAB_DIR", None)
    env.pop("VIRTUAL_ENV", None)

    log = tmp_path / "make-lab.log"
    make = subprocess.Popen(["make", "lab", f"VENV={venv}"], cwd=clone, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, make, log)
        url = f"http://127.0.0.1:{port}"
        made = log.read_text()
        assert f"cp tools/lab_overrides.json {venv}/share/jupyter/lab/settings/overrides.d/" in made, made
        # what the lab's pages read: make lab's default (autosave off) and the test's short interval
        got = _get(f"{url}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
        docmanager = {k: got["settings"].get(k, got["schema"]["properties"][k]["default"])  # user's, else default
                      for k in ("autosave", "autosaveInterval")}
        assert docmanager["autosave"] is False and docmanager["autosaveInterval"] == AUTOSAVE_INTERVAL_S, docmanager

        with pw.sync_playwright() as p:
            browser = _browser(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/lab/tree/notebooks/{LESSON}.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            try:  # a kernel picker may come up first
                page.locator(".jp-Dialog button", has_text="Select").click(timeout=5_000)
            except Exception:  # noqa: BLE001
                pass
            page.wait_for_selector("text=Kernel status: Idle", state="attached", timeout=120_000)
            t_run = time.time()
            prompts = _run_all_and_wait(page)
            run_s = time.time() - t_run
            page.screenshot(path=str(tmp_path / "after-run.png"), full_page=True)
            assert prompts and all(p.strip("[]: ").isdigit() for p in prompts), \
                f"not every code cell of {LESSON} ran (prompts {prompts}; screenshot {tmp_path / 'after-run.png'})"
            assert page.locator(".jp-Notebook .jp-OutputArea-output[data-mime-type="
                                "'application/vnd.jupyter.stderr']:has-text('Traceback')").count() == 0
            time.sleep(2 * AUTOSAVE_INTERVAL_S + 2)  # past two autosave intervals: a lab that autosaves has saved
            assert page.locator(".jp-mod-dirty").count() >= 1, "the run left the notebook unmodified?"
            _shut_down(page, url, token, make)
            browser.close()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGTERM)
            make.wait(30)
    assert make.returncode == 0, log.read_text()[-3000:]

    figures = sorted(p.name for p in (clone / "outputs" / LESSON).glob("*.png") if p.stat().st_mtime >= t_run)
    assert figures, f"{LESSON} wrote no figure under the clone's outputs/{LESSON}/"
    # the lesson's outputs are reproducible (a save in the lab rewrites the committed bytes: git status stays clean
    # even then), so the sharper check: neither the notebook nor its paired source was written at all
    rewritten = [f.relative_to(clone).as_posix() for f in lesson_files
                 if (f.stat().st_ino, f.stat().st_mtime_ns) != before[f]]
    assert not rewritten, f"the lab wrote {rewritten} (autosave on?)"
    status = _git(clone, "status", "--porcelain")
    assert status == "", f"`git status` in the clone after make lab and {LESSON}:\n{status}" + \
        _git(clone, "diff", "--stat")
    print(f"\n{LESSON} ran in {run_s:.0f} s in the lab ({len(prompts)} code cells, figures {figures}); "
          f"{time.time() - t0:.0f} s in all; ignored files the run left: "
          f"{_git(clone, 'status', '--porcelain', '--ignored').split()}")
