"""A real reader: JupyterLab on loopback, a notebook built from its source opened in headless Chromium,
run, a slider of its explorer widget (unicache_lib/explorer, drawn on a canvas in the page) moved with the keyboard,
and the picture must change (notebook 02:
the layer slider of the attention explorer, over all layers and over a LAYERS subset, where the next
stop is the next captured layer; notebook 03: the step slider of the step explorer; notebook 08: the layer slider
of the model explorer). And a glossary link clicked in a notebook served as `make lab` serves it opens the
glossary scrolled to its term."""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.notebook


@pytest.fixture(autouse=True)
def _no_progress_bars(monkeypatch):
    """Kernels started here inherit it: no bar output in the executed notebooks (unicache_lib/progress.py)."""
    monkeypatch.setenv("UNICACHE_PROGRESS", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


Q02 = {"PER_TYPE": 1, "MAP_PER_TYPE": 1, "N_CAPTIONS": 1}
CASES = {  # case -> (notebook, parameters, slider, its readouts from first stop to last)
    # the explorers open on their lesson's chosen view, not on stop 0: the test walks the slider from Home to End
    "02_understanding_maps": ("02_understanding_maps", Q02, "layer", ("0", "1", "2", "3")),
    # tiny-llava has 4 language layers (bands: shallow 0, middle 1-2, deep 3; the notebook needs a layer of each);
    # with LAYERS=[0, 2, 3] the slider's stops are the captured layers only, not the uncaptured 1
    "02_layer_subset": ("02_understanding_maps", {**Q02, "LAYERS": [0, 2, 3]}, "layer", ("0", "2", "3")),
    "03_diffusion_steps": ("03_diffusion_steps", {"N_SINGLE": 2, "N_PAIRS": 2, "STEPS": 5, "MAP_PROMPTS": 1,
                                                  "UNDERSTANDING_STORE": "no-such-store"}, "step",
                           ("0", "1", "2", "3", "4")),
    # the model explorer opens on LLaVA (4 language layers, all captured)
    "08_architectures": ("08_architectures", {"PER_TYPE": 1, "N_QUESTIONS": 20, "N_CAPTIONS": 2, "DRIFT_CAPTIONS": 2,
                                              "N_GEN_PROMPTS": 2, "GEN_STEPS": 2, "N_DRAWINGS": 1}, "layer",
                         ("0", "1", "2", "3")),
}


def _need_browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: `make setup` installs it (apt-get install chromium)")
        pytest.skip("chromium not installed (make setup installs it)")
    return pytest.importorskip("playwright.sync_api")


@contextmanager
def _lab(root: Path, log: Path, extra=()):
    """JupyterLab on a free loopback port serving ``root``; yields its base URL; stopped on exit, even on error."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    lab = subprocess.Popen(  # the kernel imports this checkout's unicache_lib
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--allow-root",
         "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}", "--LabApp.news_url=", *extra],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(90):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        lab.terminate()
        lab.wait(30)


def _browser(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"])


def test_glossary_link_opens_its_term_in_make_lab(tmp_path):
    """`make lab` serves the repository root (its LAB_FLAGS, read from the Makefile), so a notebook's
    `../docs/GLOSSARY.md#anchors` resolves; clicking it opens the glossary with the term's heading in view."""
    pw = _need_browser()
    flags = re.search(r"^LAB_FLAGS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    root = next(f.split("=", 1)[1] for f in flags if f.startswith("--ServerApp.root_dir="))
    assert (ROOT / root).resolve() == ROOT, "make lab must serve the repository root for docs/ links to open"
    with _lab(ROOT, tmp_path / "lab.log", [f for f in flags if not f.startswith("--ServerApp.root_dir=")]) as url, \
            pw.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/notebooks/01_capture.ipynb")
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        link = page.locator(".jp-RenderedMarkdown a[href$='GLOSSARY.md#anchors'], "
                            ".jp-RenderedMarkdown a[href*='GLOSSARY.md?'][href$='#anchors']").first
        link.click(timeout=60_000)
        heading = page.locator(".jp-MarkdownViewer [data-jupyter-id='anchors']")
        heading.wait_for(timeout=60_000)
        pw.expect(heading).to_be_in_viewport(timeout=30_000)
        page.screenshot(path=str(tmp_path / "glossary.png"))
        assert "Anchors" in page.locator(".jp-MarkdownViewer").inner_text()
        browser.close()


@pytest.mark.extended
@pytest.mark.parametrize("case", sorted(CASES))
def test_slider_redraws_in_jupyterlab(tmp_path, case):
    name, params, slider, readouts = CASES[case]
    pw = _need_browser()
    sync_playwright, expect = pw.sync_playwright, pw.expect
    import papermill as pm

    nb = tmp_path / "nb.ipynb"
    import nbformat

    src = tmp_path / "src.ipynb"  # the current source, not the committed (maybe older) notebook
    subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--to", "ipynb", "--set-kernel", "python3", "--output",
                    str(src), str(ROOT / "notebooks" / "src" / f"{name}.py")], check=True)
    pm.execute_notebook(str(src), str(nb), prepare_only=True,
                        parameters={**params, "OUT_DIR": str(tmp_path / "out")})
    # open it as a reader who cleared the committed outputs: no saved widget state to restore, so
    # every widget on the page comes from this run's kernel
    book = nbformat.read(nb, as_version=4)
    book.metadata.pop("widgets", None)
    for cell in book.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(book, nb)
    with _lab(tmp_path, tmp_path / "lab.log") as url, sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/nb.ipynb")
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        try:  # a kernel picker may come up first
            page.locator(".jp-Dialog button", has_text="Select").click(timeout=5_000)
        except Exception:
            pass
        page.wait_for_selector("text=Kernel status: Idle", state="attached", timeout=90_000)
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        # the explorer (unicache_lib/explorer) draws on a canvas in the page: wait for it and its picture
        mount = page.locator(".ucx-mount").first
        mount.locator("canvas").wait_for(timeout=300_000)
        page.wait_for_function("m => m.ucxExplorer && m.ucxExplorer.images.size > 0 && "
                               "[...m.ucxExplorer.images.values()].every(v => v !== 'pending')",
                               arg=mount.element_handle(), timeout=60_000)
        layer = mount.locator(f"input.ucx-range[data-name='{slider}']")
        readout = layer.locator("xpath=following-sibling::output")
        layer.focus()
        page.keyboard.press("Home")  # the first stop, wherever the lesson opened the explorer
        expect(readout).to_have_text(readouts[0], timeout=10_000)
        first = mount.locator("canvas").evaluate("c => c.toDataURL()")
        for want in readouts[1:]:  # one step right at a time: every stop, and only the captured ones
            page.keyboard.press("ArrowRight")
            expect(readout).to_have_text(want, timeout=10_000)
        page.keyboard.press("ArrowRight")  # past the last stop: the slider stays
        expect(readout).to_have_text(readouts[-1], timeout=10_000)
        assert mount.locator("canvas").evaluate("c => c.toDataURL()") != first  # redrawn in the page
        page.screenshot(path=str(tmp_path / "after.png"))
        browser.close()
    assert (tmp_path / "out" / "scoreboard.json").exists()  # the whole notebook ran in the browser
