"""`make book` (book/build.py, book/conf.py: Sphinx + sphinx-book-theme + myst-nb; issues #51, #65): the course as a
static website, built once per module from the committed notebooks (never re-executed), README.md, docs/*.md and
solutions/ into a temporary folder, then read as files and driven in headless Chromium (tests/test_browser.py's
launcher) over Python's http.server:

- the sidebar runs Home, the lessons 00..08 in order, the docs, the solutions (titled by lesson); the build takes at
  most 60 s, warns about nothing and records its time and size;
- every internal link and #anchor of every page resolves (a lesson's ../docs/GLOSSARY.md#anchors lands on the term's
  heading), and no page names a script, style, font or picture from outside the folder (no CDN: no require.js, no
  ipywidgets html-manager); the font stack names a CJK fallback;
- the page is the lesson: no input prompts, no test markers, every figure of every notebook on its page with an alt
  text (from the cell's metadata, else the prose before it); the notebooks' markdown holds no raw HTML-like text
  outside code (``<image>`` would be a broken picture);
- the explorers' widget outputs show their kernel-free HTML form (unicache_lib/explorer), never the widget view;
  one without a form says to open the lesson in JupyterLab;
- in Chromium: search finds a glossary term's page and anchor, a lesson shows its in-page contents, dark mode
  toggles, at 390 px the menu collapses (and opens) and no page is wider than the screen, every page loads with no
  console error, every request stays on the site, every notebook figure is drawn and every explorer's slider redraws;
- the kernel-free explorers (an explorer's HTML form, ``Explorer.static()``): self-contained HTML within its size budget, text
  escaped.

The build's safety (what it publishes, where it writes) is tested in tests/test_outputs_safe.py."""
from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tests.test_browser import _browser, _need_browser
from tests.test_docs_links import anchors as docs_anchors

ROOT = Path(__file__).resolve().parents[1]
def _listed(folder: str, pattern: str) -> list[Path]:
    """The files the site is built from (committed: the build reads HEAD) in ``folder`` matching ``pattern``."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        names = subprocess.run(["git", "ls-tree", "--name-only", "HEAD", f"{folder}/"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split()
        return sorted(ROOT / n for n in names if Path(n).match(pattern))
    return sorted((ROOT / folder).glob(pattern))


NOTEBOOKS = _listed("notebooks", "[0-9][0-9]_*.ipynb")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
BUILD_SECONDS = 60  # issue #65's budget for `make book` on 2 cores
GIT = (ROOT / ".git").exists() and shutil.which("git") is not None


def _book():
    """book/build.py as a module (tests/test_outputs_safe.py drives its checks on tiny trees)."""
    spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("book_build", mod)
    spec.loader.exec_module(mod)
    return mod


def _committed(rel: str) -> str:
    """A file as the site is built from it: as committed (the build reads HEAD, so people editing the working tree
    meanwhile change nothing here), or as it is when this is no git checkout."""
    if GIT:
        return subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    return (ROOT / rel).read_text()


class _Parsed(HTMLParser):
    """The ids, links (tag, attribute, url), images (their attributes) and text of a page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links, self.text, self.images = set(), [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append((tag, key, a[key], a.get("rel")))
        if tag == "img":
            self.images.append(a)

    def handle_data(self, data):
        self.text.append(data)


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Parsed:
    p = _Parsed()
    p.feed(path.read_text())
    return p


def _main(page: Path) -> str:
    """The article of a page (what the reader reads), without the theme's header, sidebars and footer."""
    text = page.read_text()
    m = re.search(r'<article class="bd-article">(.*?)</article>', text, re.S)
    return m.group(1) if m else text


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site, built once for the module as `make book` builds it (book/build.py), from the committed files
    (--ref HEAD) where this is a git checkout; returns (folder, the build's record)."""
    out = tmp_path_factory.mktemp("book") / "site"
    record = out.parent / "book.json"
    p = subprocess.run([sys.executable, "book/build.py", "--out", str(out), "--record", str(record),
                        *(["--ref", "HEAD"] if GIT else [])], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return out, json.loads(record.read_text()), p.stdout + p.stderr


@pytest.fixture(scope="module")
def site(built):
    return built[0]


@pytest.fixture(scope="module")
def pages(site):
    return json.loads((site / "_static" / "pages.json").read_text())


@pytest.fixture(scope="module")
def server(site):
    """http.server over the site on a free loopback port, in a thread; yields (base url, [(path, status)])."""
    seen = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(site), **kw)

        def log_request(self, code="-", size="-"):
            seen.append((self.path, int(code) if str(code).isdigit() else 0))

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):  # a browser that leaves a page mid-download: not an error
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                super().handle_error(request, client_address)

    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}/", seen
    srv.shutdown()
    srv.server_close()


# ------------------------------------------------------------------------------------------ the build


def test_the_build_is_quick_quiet_and_recorded(built):
    site, record, log = built
    assert "warning" not in log.lower(), log
    assert record["seconds"] <= BUILD_SECONDS, f"the build took {record['seconds']:.0f} s (budget {BUILD_SECONDS} s)"
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    assert abs(record["megabytes"] - size / 1e6) < 0.2 and record["megabytes"] < 60, record
    assert record["pages"] >= len(NOTEBOOKS) + 1 + len(_listed("solutions", "*.py")) and record["warnings"] == 0
    # nothing of Sphinx's machinery is published: no doctrees, no build info, no source maps
    assert not list(site.rglob("*.doctree")) and not (site / ".buildinfo").exists() and not list(site.rglob("*.map"))


def test_table_of_contents_in_lesson_order(site, pages):
    toc = [p for p in pages if p["section"]]
    assert [p["section"] for p in toc] == sorted((p["section"] for p in toc),
                                                 key=["Course", "Lessons", "Reference", "Solutions"].index)
    assert toc[0]["src"] == "README.md" and toc[0]["out"] == "index.html"
    assert [p["src"] for p in toc if p["section"] == "Lessons"] == [nb.relative_to(ROOT).as_posix() for nb in NOTEBOOKS]
    assert {p["src"] for p in toc if p["section"] == "Reference"} == {
        d.relative_to(ROOT).as_posix() for d in _listed("docs", "*.md")}
    solutions = [p for p in toc if p["section"] == "Solutions" and p["kind"] == "source"]
    assert {f"solutions/{p.name}" for p in _listed("solutions", "*.py")} == {p["src"] for p in solutions}
    # the sidebar of every page lists them in that order, in their groups, the solutions by their lesson's title
    sidebar = re.search(r'<nav class="bd-links bd-docs-nav".*?</nav>', (site / "index.html").read_text(), re.S).group(0)
    captions = re.findall(r'<p aria-level="2" class="caption"[^>]*><span class="caption-text">([^<]+)</span>', sidebar)
    assert captions == ["Lessons", "Reference", "Solutions"], captions
    hrefs = [h.split("#")[0] or "index.html" for h in re.findall(r'<a class="reference internal" href="([^"]+)"', sidebar)]
    assert hrefs == [p["out"] for p in toc], (hrefs, [p["out"] for p in toc])
    lessons = {p["src"][10:12]: p["title"] for p in toc if p["section"] == "Lessons"}
    for p in [p for p in solutions if Path(p["src"]).stem[:2].isdigit()]:  # (solutions/_common.py: by its name)
        assert p["title"] == f"Solutions: {lessons[Path(p['src']).stem[:2]]}", p
        assert lessons[Path(p["src"]).stem[:2]] in sidebar
    # a solution is shown as a page: its code, highlighted, with a link to its lesson
    sol = _main(site / "solutions" / "05_kv_eviction.py.html")
    assert "def exercise_1" in re.sub(r"<[^>]+>", "", sol) and 'class="highlight-python' in sol
    assert 'href="../notebooks/05_kv_eviction.html"' in sol


def test_every_internal_link_and_anchor_resolves_and_nothing_comes_from_outside(site):
    broken, outside, checked = [], [], 0
    for page in sorted(site.rglob("*.html")):
        rel = page.relative_to(site).as_posix()
        for tag, attr, url, _ in _parse(page).links:
            if re.match(r"[a-z][\w+.-]*:", url, re.I) or url.startswith("//"):
                if not url.startswith(("data:", "mailto:")) and not (tag == "a" and attr == "href"):
                    outside.append(f"{rel}: <{tag} {attr}={url[:80]}>")  # loaded at view time: must be local
                continue
            path, _, frag = url.partition("#")
            path = path.split("?", 1)[0]
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.is_file():
                broken.append(f"{rel}: {url} -> no file")
            elif frag and dest.suffix == ".html" and frag not in _parse(dest).ids:
                broken.append(f"{rel}: {url} -> no id {frag!r} in {dest.relative_to(site)}")
    assert checked > 2000 and not broken, broken[:20]
    assert not outside, outside[:20]
    # no CDN script in any page or script file (myst-nb's ipywidgets scripts are off: nb_ipywidgets_js = {})
    for f in [*site.rglob("*.html"), *site.rglob("*.js"), *site.rglob("*.css")]:
        text = f.read_text(errors="replace")
        assert not re.search(r"require(\.min)?\.js|html-manager|cdn\.jsdelivr|unpkg\.com|fonts\.googleapis", text), f


def test_links_between_pages_keep_their_anchors(site, tmp_path):
    nb = _main(site / "notebooks" / "01_capture.html")
    assert 'href="../docs/GLOSSARY.html#anchors"' in nb and ".md#" not in re.sub(r"<pre.*?</pre>", "", nb, flags=re.S)
    index = _main(site / "index.html")
    assert 'href="docs/GLOSSARY.html"' in index and 'href="notebooks/00_primer.html"' in index  # README -> docs, lessons
    assert 'href="../index.html"' in _main(site / "docs" / "CAPTURE.html")  # docs -> README, the landing page
    # the docs' headings carry the anchors tests/test_docs_links.py checks the docs' links against (GitHub's)
    glossary = _parse(site / "docs" / "GLOSSARY.html").ids
    (tmp_path / "GLOSSARY.md").write_text(_committed("docs/GLOSSARY.md"))
    want = docs_anchors(tmp_path / "GLOSSARY.md")
    assert len(want) > 50 and want <= glossary, sorted(want - glossary)[:10]


def _image_outputs(nb_path: Path) -> int:
    nb = json.loads(_committed(nb_path.relative_to(ROOT).as_posix()))
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
               if any(m in o.get("data", {}) for m in ("image/png", "image/jpeg")))


def test_the_page_is_the_lesson_figures_with_alt_text_no_prompts_no_markers(site):
    for nb in NOTEBOOKS:
        page = site / "notebooks" / f"{nb.stem}.html"
        body = _main(page)
        shown = re.findall(r'<div class="cell_output docutils container">.*?(?=<div class="cell |</section>|$)', body,
                           re.S)
        figures = sum(len(re.findall(r'<img [^>]*src="\.\./_images/', s)) for s in shown)  # image outputs, not HTML
        want = _image_outputs(nb)
        assert want >= 1 and figures == want, f"{nb.name}: {figures} of {want} figures on the page"
        for img in [i for i in _parse(page).images if i.get("src", "").startswith("../_images/")]:
            alt = img.get("alt") or ""
            assert len(alt) > 10 and "No description" not in alt and not alt.endswith(".png"), (nb.name, img)
        text = re.sub(r"<[^>]+>", "", body)
        assert not re.search(r"In\s*\[\d*\]:", text) and "NBVAL" not in text, nb.name  # no prompts, no test markers
    css = (site / "_static" / "course.css").read_text()
    assert re.search(r"--pst-font-family-base:[^;]*Noto Sans CJK SC", css)  # the title's Chinese text has a font


HTML_TAGS = {"a", "abbr", "b", "br", "code", "details", "div", "em", "hr", "i", "img", "kbd", "li", "ol", "p", "pre",
             "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul",
             "figure", "figcaption", "blockquote", "dl", "dt", "dd", "caption", "mark", "del", "ins", "q", "cite",
             "h1", "h2", "h3", "h4", "h5", "h6"}
_CODE = re.compile(r"(^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\2[ \t]*$|`+[^`\n]*?`+|<!--.*?-->|\$\$.*?\$\$|\$[^$\n]+\$)",
                   re.M | re.S)
_TAG = re.compile(r"</?([A-Za-z][\w-]*)(?:\s[^<>]*)?/?>")


def html_like(markdown: str) -> list[str]:
    """Text of ``markdown`` outside code that a browser would take for an HTML tag it does not know as one a lesson
    uses (``user : <image>`` becomes a broken picture; ``<s>`` strikes the rest of the paragraph through)."""
    return [m.group(0) for m in _TAG.finditer(_CODE.sub("", markdown)) if m.group(1).lower() not in HTML_TAGS]


def test_html_like_text_is_caught():
    assert html_like("user : <image> what colour") == ["<image>"]
    assert html_like("the token `<image>` and <s> here") == ["<s>"]
    assert html_like("a <b>bold</b> word<br>, a <!-- <image> --> comment, $a<b$, <kbd>Tab</kbd>") == []
    assert html_like("```text\nuser : <image>\n```\n") == []


def test_the_notebooks_markdown_holds_no_raw_html_like_text_outside_code():
    hits = []
    for nb in NOTEBOOKS:
        cells = json.loads(_committed(nb.relative_to(ROOT).as_posix()))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                tags = html_like("".join(cell["source"]))
                if tags:
                    hits.append(f"{nb.name} cell {i} (id {cell.get('id')}): {', '.join(tags)}: put it in backticks")
    assert not hits, hits


def test_explorers_show_their_html_form_never_the_widget_view(site):
    with_forms = []
    for nb in NOTEBOOKS:
        cells = json.loads(_committed(nb.relative_to(ROOT).as_posix()))["cells"]
        widgets = [o for c in cells for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
        forms = sum("".join(o["data"].get("text/html", "")).startswith('<div class="ucx"') for o in widgets)
        body = _main(site / "notebooks" / f"{nb.stem}.html")
        text = re.sub(r"<[^>]+>", "", body)
        assert "VBox(" not in text and "HBox(" not in text and "model_id" not in body, nb.name
        assert 'type="application/vnd.jupyter.widget' not in body, nb.name  # no widget view or state for a manager
        if forms:
            with_forms.append(nb.stem[:2])
            assert body.count('class="ucx-data"') >= forms, nb.name
        assert text.count("Live explorer: open in JupyterLab") == len(widgets) - forms, nb.name
    assert {"02", "03"} <= set(with_forms)


# ------------------------------------------------------------------------------------------ static explorers


def _records():
    """Full-mode records of two samples at layers 0, 2, 5 and of one prompt at steps 0, 4, 9 (tests/test_plots.py's)."""
    from tests.test_plots import _full
    from unicache_lib.capture.record import CaptureResult

    res = CaptureResult.from_records([_full(s, layer) for s in ("s0", "s1") for layer in (0, 2, 5)])
    toks = {s: [f"t{i}" for i in range(19)] + ["circle", "?", ":"] for s in ("s0", "s1")}
    imgs = {s: np.zeros((32, 32, 3), np.uint8) for s in ("s0", "s1")}
    meta = {"n_image": 16, "n_text": 4, "n_text_real": 4, "prompt": "a red cube <script>alert(1)</script>"}
    steps = CaptureResult.from_records([_full("p0", layer, n=20, step=step, part="joint", meta=meta)
                                        for layer in (0, 3) for step in (0, 4, 9)])
    return (res, imgs, toks), (steps, {"p0": np.zeros((32, 32, 3), np.uint8)}, {"p0": ["a", "red", "cube", "."]})


EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def explorers():
    """The HTML forms of an attention explorer (layers 0, 2, 5; a hostile question) and of a step explorer (steps 0,
    4, 9; opened on its last captured layer)."""
    from unicache_lib import widgets as W

    (res, imgs, toks), steps = _records()
    return (W.attention_explorer(res, imgs, toks, questions={"s0": EVIL}).static(),
            W.step_explorer(*steps).select(layer=3).static())


def test_static_explorers_are_self_contained_escaped_and_within_budget(explorers):
    from unicache_lib import widgets as W
    from unicache_lib.core.errors import InputError
    from unicache_lib.explorer import BUDGET_BYTES

    (res, imgs, toks), steps = _records()
    evil = EVIL
    ex, st = explorers
    assert ex.stops == ["0", "2", "5"] and ex.nbytes <= BUDGET_BYTES
    assert ex._repr_html_() == ex.html and "3 stops" in repr(ex)
    page = _Parsed()
    page.feed(ex.html)
    assert not page.links  # nothing is loaded: the module and the maps are inline
    assert ex.html.count('<script type="module">') == 1 and ex.html.startswith('<div class="ucx"')
    assert evil not in ex.html and "\\u003cimg src=x onerror=alert(1)\\u003e" in ex.html  # the question, escaped
    assert ex.data.settings(ex.selection)["word"] == "19 'circle'"  # the widget's opening query
    assert st.stops == ["0", "4", "9"] and "<script>alert" not in st.html
    assert st.data.settings(st.selection)["layer"] == 3  # the HTML form opens on the view selected
    # one budget for a model explorer; over it, refused before the maps are quantised, the parameter named
    both = W.model_explorer({"LLaVA": (res, imgs, toks), "ViLT <b>": (res, imgs, toks)}, budget_bytes=300_000).static()
    assert both.html.count('class="ucx"') == 1 and "ViLT <b>" not in both.html and "ViLT \\u003cb\\u003e" in both.html
    assert both.nbytes <= 300_000
    with pytest.raises(InputError, match="over the budget of 0.030 MB"):
        W.attention_explorer(res, imgs, toks, budget_bytes=30_000)
    with pytest.raises(InputError, match="no sample"):
        W.attention_explorer(res, imgs, toks).select(sample="s9")
    with pytest.raises(InputError, match="layer 7 was not captured"):
        W.step_explorer(*steps).select(layer=7)


def _png(seed: int) -> str:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.imshow(np.random.default_rng(seed).random((4, 4)))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=30)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def mini_site(site, explorers):
    """A one-lesson course built by book/build.py into the site's _test/mini/ (so the browser test visits it): its
    notebook displays an ipywidgets widget without an HTML form (saved state), the explorer's widget (unicache_lib/
    explorer: a widget view and its HTML form), a static explorer and two figures, one with its alt text in the cell's
    metadata (myst-nb's ``mystnb.image.alt``), one read out by the prose before it."""
    from nbformat import write
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from tests.test_explorer import lesson_02
    from unicache_lib.explorer import attention_explorer

    root = site.parent / "mini-root"
    (root / "notebooks").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "README.md").write_text("# Mini course\n\nStart with [the demo](notebooks/00_demo.ipynb); terms: "
                                    "[glossary](docs/GLOSSARY.md).\n")
    (root / "docs" / "GLOSSARY.md").write_text("# Glossary\n\n[README](../README.md)\n\n## the term\n\nWhat it is.\n")
    widget = attention_explorer(*lesson_02(n_samples=2, layers=3, heads=2, seed=5))._repr_mimebundle_()
    widget = widget[0] if isinstance(widget, tuple) else widget
    state = {"v": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s"]}},
             "s": {"model_name": "IntSliderModel", "state": {"description": "layer", "value": 0, "min": 0, "max": 5}}}
    figure = new_code_cell("plots.map_panel(...)", outputs=[new_output("display_data", data={"image/png": _png(2)})])
    figure.metadata["mystnb"] = {"image": {"alt": "a four by four map, from the cell's metadata"}}
    nb = new_notebook(cells=[
        new_markdown_cell("# 00 · Demo\n\nSee [the term](../docs/GLOSSARY.md#the-term)."),
        new_code_cell("explorer", outputs=[new_output("display_data", data={
            WIDGET_VIEW: {"model_id": "v", "version_major": 2, "version_minor": 0},
            "text/plain": "VBox(children=(IntSlider(value=0, description='layer'),))"})]),
        new_code_cell("attention_explorer(...)", outputs=[new_output("display_data", data=widget)]),
        new_code_cell("static_attention_explorer(...)", execution_count=2, outputs=[new_output(
            "execute_result", data={"text/html": explorers[0].html, "text/plain": repr(explorers[0])}, execution_count=2)]),
        new_markdown_cell("## Maps\n\nThe map of one head: bright where the word reads the patch."),
        new_code_cell("plots.head_map(...)", outputs=[new_output("display_data", data={"image/png": _png(1)})]),
        figure,
    ])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2,
                                                                            "version_minor": 0}}
    write(nb, root / "notebooks" / "00_demo.ipynb")
    out = site / "_test" / "mini"
    _book().build(out, root, log=lambda *a: None)
    return out


def test_a_lesson_shows_the_explorers_form_a_note_for_a_widget_without_one_and_alt_texts(mini_site):
    page = mini_site / "notebooks" / "00_demo.html"
    body, parsed = _main(page), _parse(page)
    text = re.sub(r"<[^>]+>", "", body)
    assert "VBox(" not in text and text.count("Live explorer: open in JupyterLab") == 1  # the widget without a form
    assert body.count('class="ucx-data"') == 2  # both explorers (the widget's HTML form, the static one), as they are
    assert "model_id" not in body and "widget-state" not in page.read_text()  # no widget view, no saved state
    alts = [i["alt"] for i in parsed.images if "_images/" in i.get("src", "")]
    assert alts == ["Figure: The map of one head: bright where the word reads the patch.",
                    "a four by four map, from the cell's metadata"], alts
    assert 'href="../docs/GLOSSARY.html#the-term"' in body and "the-term" in _parse(mini_site / "docs" / "GLOSSARY.html").ids


# ------------------------------------------------------------------------------------------ in the browser


@pytest.mark.slow
def test_the_site_in_a_browser(site, pages, server, explorers, mini_site):
    """Every page loads with no console error, no failed request and no request leaving the site, is no wider than a
    390 px screen there, and draws every notebook figure; search finds a glossary term's page and anchor; a lesson
    shows its in-page contents; dark mode toggles; at 390 px the menu collapses and opens; the glossary link of lesson
    01 lands on its term; every kernel-free explorer's slider redraws (the site's, and the mini course's)."""
    pw = _need_browser()
    url, seen = server
    demo = site / "_test" / "explorers.html"
    demo.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'></head><body>"
                    + explorers[0].html + explorers[1].html + "</body></html>")
    html_pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    errors, failed, outside, too_wide = [], [], [], []
    with pw.sync_playwright() as p:
        browser = _browser(p)
        ctx = browser.new_context(viewport={"width": 1300, "height": 900}, accept_downloads=True)

        def route(r):
            if r.request.url.startswith((url, "data:", "blob:")):
                return r.continue_()
            outside.append(r.request.url)  # recorded, and never let out
            return r.abort()

        ctx.route("**/*", route)
        page = ctx.new_page()
        page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
        page.on("requestfailed", lambda r: failed.append(f"{r.failure} {r.url}") if "ERR_ABORTED" not in (r.failure or "")
                else None)  # (aborted: a page left before its icon came, or a request stopped by route() above)
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        with_sliders = []
        for rel in html_pages:
            page.goto(url + rel, wait_until="load")
            if rel.startswith("notebooks/"):
                n = page.locator(".cell_output img").count()
                drawn = page.evaluate("() => [...document.querySelectorAll('.cell_output img')]"
                                      ".filter(i => i.complete && i.naturalWidth > 0).length")
                assert n >= 1 and drawn == n, f"{rel}: {drawn} of {n} figures drawn"
            if page.locator(".ucx-range").count():
                with_sliders.append(rel)
        # search: a glossary term finds its page and its heading's anchor
        page.goto(url + "search.html?q=anchors")
        hit = page.locator("#search-results a[href$='docs/GLOSSARY.html#anchors']").first
        hit.wait_for(timeout=30_000)
        hit.click()
        page.wait_for_url(re.compile(r"/docs/GLOSSARY\.html#anchors$"))
        pw.expect(page.locator("#anchors")).to_be_in_viewport()
        # a lesson's glossary link lands on its term
        page.goto(url + "notebooks/01_capture.html")
        page.locator("article a[href$='GLOSSARY.html#anchors']").first.click()
        page.wait_for_url(re.compile(r"/docs/GLOSSARY\.html#anchors$"))
        term = page.locator("#anchors")
        pw.expect(term).to_be_in_viewport()
        assert term.locator("h2, h3, h4").first.inner_text().strip().lower().startswith("anchors")
        # a lesson shows its in-page contents, each entry a heading of the page
        page.goto(url + "notebooks/02_understanding_maps.html")
        toc = page.locator(".bd-sidebar-secondary nav.page-toc a")
        pw.expect(page.locator(".bd-sidebar-secondary")).to_be_visible()
        targets = toc.evaluate_all("as => as.map(a => a.getAttribute('href'))")
        assert len(targets) >= 4 and all(
            t.startswith("#") and page.locator(f'[id="{t[1:]}"]').count() == 1 for t in targets), targets
        # dark mode toggles: the page's colours change
        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.locator(".theme-switch-button").first.click()
        page.locator(".theme-change-button[data-mode='dark']").first.click()
        pw.expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") != light
        page.locator(".theme-switch-button").first.click()
        page.locator(".theme-change-button[data-mode='light']").first.click()
        pw.expect(page.locator("html")).to_have_attribute("data-theme", "light")
        # kernel-free explorers: one step right redraws the explorer's canvas (unicache_lib/explorer)
        moved = 0
        for rel in with_sliders:
            page.goto(url + rel)
            for k in range(page.locator(".ucx").count()):
                box = page.locator(".ucx").nth(k)
                if box.locator(".ucx-mount").count():
                    box.locator(".ucx-mount canvas").wait_for()
                    page.wait_for_function("m => m.ucxExplorer && [...m.ucxExplorer.images.values()].every("
                                           "v => v !== 'pending')", arg=box.locator(".ucx-mount").element_handle())
                    before = box.locator("canvas").evaluate("c => c.toDataURL()")
                    slider = box.locator("input.ucx-range").first
                    slider.focus()  # one step towards the other end (a view may open on the last layer)
                    page.keyboard.press("ArrowLeft" if slider.evaluate("e => e.value === e.max") else "ArrowRight")
                    assert box.locator("canvas").evaluate("c => c.toDataURL()") != before, (rel, k)
                    moved += 1
                    continue
                if box.locator(".ucx").count():  # an outer box of a model explorer: its inner ones are moved
                    continue
                labels = box.locator(".ucx-frame").evaluate_all("fs => fs.map(f => f.getAttribute('data-label'))")
                if len(labels) < 2:
                    continue
                before = box.locator(".ucx-frame:not([hidden])").get_attribute("src")
                box.locator(".ucx-range").focus()
                page.keyboard.press("ArrowRight")
                pw.expect(box.locator(".ucx-readout")).to_have_text(labels[1])
                assert box.locator(".ucx-frame:not([hidden])").get_attribute("src") != before
                moved += 1
        # on the lessons' pages: a slider move redraws within MAX_REDRAW_MS, measured in the page; the view exports
        from tests.test_explorer import _MOVE, MAX_REDRAW_MS

        timed = []
        for name in ("02_understanding_maps", "03_diffusion_steps", "07_diagnostics", "08_architectures"):
            page.goto(url + f"notebooks/{name}.html")
            mount = page.locator(".ucx-mount").first
            mount.locator("canvas").wait_for()
            page.wait_for_function("m => m.ucxExplorer && [...m.ucxExplorer.images.values()].every("
                                   "v => v !== 'pending')", arg=mount.element_handle())
            slider = mount.locator("input.ucx-range").first.get_attribute("data-name")
            runs = [page.evaluate(_MOVE, [0, "range", slider, v]) for v in (1, 0, 1)]
            assert runs[1]["diff"] > 0 and runs[2]["diff"] > 0, (name, runs)  # the first may find it there already
            timed.append((sorted(r["ms"] for r in runs)[1], name))  # the median of three: a busy machine's pause
            with page.expect_download() as d:
                mount.locator("button.ucx-save-png").click()
            assert Path(d.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        print("redraw on the site, median of 3 moves (ms):", ", ".join(f"{n[:2]} {ms:.1f}" for ms, n in timed))
        assert all(ms <= MAX_REDRAW_MS for ms, _ in timed), timed
        # at 390 px: no page wider than the screen; the menu is collapsed behind a button that opens it
        page.set_viewport_size({"width": 390, "height": 844})
        for rel in html_pages:
            page.goto(url + rel, wait_until="load")
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > 390:
                too_wide.append(f"{rel}: {width} px")
        page.goto(url + "index.html")
        menu = page.locator(".bd-sidebar-primary")
        pw.expect(menu).to_be_hidden()
        page.locator("button.primary-toggle:visible").first.click()  # the theme opens the menu as a dialog
        drawer = page.locator("dialog#pst-primary-sidebar-modal")
        pw.expect(drawer).to_be_visible()
        pw.expect(drawer.locator("a[href='notebooks/00_primer.html']")).to_be_visible()
        browser.close()
    assert {"_test/explorers.html", "_test/mini/notebooks/00_demo.html"} <= set(with_sliders) and moved >= 4
    # every lesson's explorer redraws in the page (02: layers, 03: steps, 07: the right and wrong answers, 08: models)
    lessons_with = ("02_understanding_maps", "03_diffusion_steps", "07_diagnostics", "08_architectures")
    assert {f"notebooks/{n}.html" for n in lessons_with} <= set(with_sliders), \
        with_sliders
    assert not too_wide, too_wide[:10]
    assert not outside, outside[:10]
    assert not errors, errors[:10]
    assert not failed, failed[:10]
    bad = [(path, code) for path, code in seen if code >= 400]
    assert not bad, bad[:10]
