"""`make book`: the course as a static website, offline.

    .venv/bin/python tools/book.py --out outputs/book

Pages: README.md is the landing page (index.html), the committed, executed notebooks/NN_*.ipynb are the lessons
(rendered as they are, never re-executed: nbconvert's HTML exporter, JupyterLab's look), docs/*.md the reference
pages and solutions/ (its README and every *.py) the solutions; a repository file or folder a page links to (say
``../unicache_lib/scoreboard.py``) gets a page of its own. The layout mirrors the repository (docs/GLOSSARY.md ->
docs/GLOSSARY.html, a .py file -> <name>.py.html), and every relative link between pages is rewritten to the built
page with its #anchor kept; markdown headings get GitHub's anchors (the rule tests/test_docs_links.py checks the docs'
links with), so a notebook's ``../docs/GLOSSARY.md#anchors`` lands on the term. A link to nothing in the repository
is reported and left without a target.

ipywidgets explorers cannot run without a kernel: each widget output is shown as its opening view, read from the
widget state saved in the notebook, with a note to open the lesson in JupyterLab and a link to the static figure the
notebook shows beside it (and to a kernel-free explorer when the notebook displays one). The attention explorer
(unicache_lib/explorer) is the exception: its widget output carries its own kernel-free HTML form, shown as it is, so
it runs on the page.

Everything the pages need is in the output folder (_static/: JupyterLab's notebook CSS from nbconvert, Pygments' CSS,
the layout's CSS); images are data: URIs; nothing is fetched at build or view time. ``--ref HEAD`` builds from the
committed files (git archive) instead of the working tree. Why not Jupyter Book 2 (MyST):
docs/FORKING.md, "Publishing the course as a website".

What it reads and where it writes (issue #60): every file it reads or publishes is resolved first and must be a regular
file inside the repository (unicache_lib.core.untrusted.path_inside, judged lstat by lstat before anything opens it); a
committed symlink that leads outside it (``docs/env.txt -> /proc/self/environ``), a symlinked folder outside, a FIFO
or a device fails the build with one line naming it (exit status 2), so nothing outside the repository is ever
published. A symlink that stays inside is published only when what it leads to is: a tracked file (in a git checkout)
outside dot folders and files and outputs/ (``docs/gitconfig.txt -> ../.git/config``, ``-> ../.env``,
``-> ../outputs/private.json`` each fail the build in one line); a symlink to a folder is never followed (``docs/loop
-> ..`` would nest the site without end). The output folder is checked by unicache_lib.paths.output_folder: refused
when empty, the repository or a folder above it, a folder inside it but under outputs/, or a folder holding files this
builder did not write; the pages are built in a temporary folder beside it and moved in only once every page is built
(a failed build leaves the earlier site as it was), the builder records what it wrote in the folder's
``.unicache-output`` and a rebuild removes only those files."""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from unicache_lib.core.errors import InputError, MissingFileError
from unicache_lib.core.untrusted import html_text, path_inside, read_inside, stat_inside
from unicache_lib.paths import output_folder

ROOT = Path(__file__).resolve().parents[1]

TOOL = "make book"
SITE_TITLE = "UniCache Workbench"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
IMAGE_TYPES = ("image/png", "image/jpeg")
TEXT_SUFFIXES = {".py", ".md", ".txt", ".json", ".csv", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".j2"}
SOURCE_MAX_BYTES = 1_000_000
STATIC_FILES = {"_static/jupyterlab.css", "_static/theme-light.css", "_static/pygments.css", "_static/book.css",
                "_static/pages.json"}


class BookError(Exception):
    """Something the builder must not publish (a symlink that leaves the repository, a FIFO, a device) or a folder it
    must not write: `make book` prints it as one line and exits with status 2."""


UNPUBLISHED = ("outputs", "runs", "__pycache__")  # the tools' outputs and caches: never pages, never link targets


def unpublished_part(rel: str) -> str | None:
    """The first part of repository path ``rel`` that keeps it off the site: a dot folder or file (``.git``,
    ``.env``), ``outputs/``, ``runs/`` or ``__pycache__``; None when there is none."""
    return next((part for part in rel.split("/") if part.startswith(".") or part in UNPUBLISHED), None)


_GIT_LISTS: dict = {}


def git_files(root: Path) -> tuple[set[str], set[str]] | None:
    """``(tracked, untracked but not ignored)`` files of ``root`` when it is the top of a git work tree (``git
    ls-files``), None otherwise (a tree ``--ref`` unpacked, a test's folder): read once per root."""
    key = str(root)
    if key not in _GIT_LISTS:
        def ls(*extra):
            r = subprocess.run(["git", "-C", key, "ls-files", "-z", *extra], capture_output=True)
            return set(r.stdout.decode("utf-8", "surrogateescape").split("\0")) - {""} if r.returncode == 0 else None

        top = subprocess.run(["git", "-C", key, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        inside = top.returncode == 0 and Path(top.stdout.strip()).resolve() == root
        tracked = ls("--cached") if inside else None
        others = ls("--others", "--exclude-standard") if inside else None
        _GIT_LISTS[key] = None if tracked is None or others is None else (tracked, others)
    return _GIT_LISTS[key]


def entry(root: Path, rel: str) -> tuple[str | None, Path | None]:
    """``(kind, real path)`` of repository path ``rel``: ("file", ...) for a regular file, ("dir", ...) for a folder,
    (None, None) when nothing is there (a dangling link included) or nothing the site publishes is (a file git
    ignores, in a git checkout). Every symlink is resolved first and judged by stat before anything opens it: one that
    leaves ``root``, a FIFO, a socket or a device raises :class:`BookError`; so does a symlink to a folder (or a folder
    reached through one: ``docs/loop -> ..`` would nest the site without end), and a symlink whose target is not
    itself published: in a dot folder or dot file (``.git/config``, ``.env``), under ``outputs/``, or, in a git
    checkout, not a tracked file."""
    try:
        kind, real = "dir", path_inside(root, rel, folder=True, what="folder")
    except MissingFileError:
        return None, None
    except InputError:
        try:
            kind, real = "file", path_inside(root, rel)
        except MissingFileError:
            return None, None
        except InputError as e:
            raise BookError(f"{rel}: not published: {e}") from e
    return published(root, rel, kind, real)


def published(root: Path, rel: str, kind: str, real: Path) -> tuple[str | None, Path | None]:
    """:func:`entry`'s judgement of ``rel`` once it resolved (inside ``root``) to ``real``, a ``kind``."""
    base = Path(root).resolve()
    parts = [q for q in Path(rel).parts if q not in ("", ".")]
    for i in range(1, len(parts) + 1):  # every folder on the way, and the entry itself when it is a folder
        q = base.joinpath(*parts[:i])
        if q.is_symlink() and (i < len(parts) or kind == "dir"):
            raise BookError(f"{rel}: not published: {'/'.join(parts[:i])} is a symbolic link to a folder "
                            f"({os.readlink(q)}): the site publishes folders only as themselves (a link to a folder "
                            f"can loop, e.g. docs/loop -> ..); link the files themselves or remove the link")
    target = real.relative_to(base).as_posix()
    linked = target != "/".join(parts)
    bad = unpublished_part(target)
    if bad is not None:
        if not linked:
            return None, None
        where = f"in {bad}/" if target != bad and not target.endswith("/" + bad) else "a dot file"
        raise BookError(f"{rel}: not published: it is a symbolic link to {target} ({where}), which the site never "
                        f"publishes: only tracked files outside dot folders (.git/, .env ...) and outputs/ are; remove "
                        f"the link")
    listed = git_files(base)
    if listed is not None and kind == "file":
        tracked, others = listed
        if linked and target not in tracked:
            raise BookError(f"{rel}: not published: it is a symbolic link to {target}, which git does not track: "
                            f"a link is published only when it leads to a committed file; remove the link")
        if not linked and target not in tracked | others:
            return None, None  # a file git ignores: not part of the course
    if listed is not None and kind == "dir" and target:
        tracked, others = listed
        if not any(f.startswith(target + "/") for f in tracked | others):
            return None, None  # a folder of ignored files only (an egg-info, a build folder)
    return kind, real


def repo_file(root: Path, rel: str) -> Path:
    """The real path of repository file ``rel``, which the site must have: a regular file inside ``root``."""
    kind, real = entry(root, rel)
    if kind != "file":
        raise BookError(f"{rel}: not published: {'nothing there' if kind is None else 'a folder, not a file'}")
    return real


def repo_text(root: Path, rel: str) -> str:
    return repo_file(root, rel).read_text()


# ----------------------------------------------------------------------------------------------- pages


@dataclass
class Page:
    src: str  # repository path (posix), "" for none
    out: str  # site path (posix)
    title: str
    section: str  # "Course", "Lessons", "Reference", "Solutions" (in the table of contents), "" for linked files
    kind: str  # "markdown", "notebook", "source", "folder"
    body: str = ""
    figures: int = 0  # image outputs of a notebook
    widgets: int = 0
    warnings: list = field(default_factory=list)


def out_path(src: str, kind: str) -> str:
    """Where the page of repository path ``src`` goes in the site."""
    if src == "README.md":
        return "index.html"
    if kind == "folder":
        return posixpath.join(src.rstrip("/"), "index.html")
    p = Path(src)
    if p.suffix in (".md", ".ipynb"):
        return p.with_suffix(".html").as_posix()
    return src + ".html"


def md_title(text: str, default: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    m = re.search(r"^#{1,2} +(.+?)\s*#*\s*$", text, re.M)
    return re.sub(r"`|\*\*|<[^>]+>", "", m.group(1)).strip() if m else default


def notebook_title(nb, default: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            return md_title(cell.source, default)
    return default


def docs_order(root: Path) -> list[str]:
    """docs/*.md in the order README.md first links them, then the rest by name."""
    readme = repo_text(root, "README.md")
    linked = []
    for m in re.finditer(r"\]\((docs/[^)#\s]+\.md)", readme):
        if m.group(1) not in linked and entry(root, m.group(1))[0] == "file":
            linked.append(m.group(1))
    rest = sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md"))
    return linked + [d for d in rest if d not in linked]


def table_of_contents(root: Path) -> list[Page]:
    import nbformat

    pages = [Page("README.md", "index.html", SITE_TITLE, "Course", "markdown")]
    for nb in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        src = nb.relative_to(root).as_posix()
        title = notebook_title(nbformat.read(repo_file(root, src), as_version=4), nb.stem)
        pages.append(Page(src, out_path(src, "notebook"), title, "Lessons", "notebook"))
    for src in docs_order(root):
        pages.append(Page(src, out_path(src, "markdown"), md_title(repo_text(root, src), Path(src).stem),
                          "Reference", "markdown"))
    if entry(root, "solutions/README.md")[0] == "file":
        pages.append(Page("solutions/README.md", out_path("solutions/README.md", "markdown"),
                          md_title(repo_text(root, "solutions/README.md"), "Solutions"), "Solutions", "markdown"))
    for py in sorted((root / "solutions").glob("*.py")):
        src = py.relative_to(root).as_posix()
        repo_file(root, src)  # a regular file inside the repository, or the build stops here
        pages.append(Page(src, out_path(src, "source"), py.name, "Solutions", "source"))
    return pages


# ----------------------------------------------------------------------------------------------- markdown


def anchor(heading: str) -> str:
    """GitHub's heading anchor, as tests/test_docs_links.py computes it: markdown marks dropped, lower case,
    punctuation other than hyphens and underscores dropped, spaces -> '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def highlight(code: str, lang: str) -> str:
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import TextLexer, get_lexer_by_name

    try:
        lexer = get_lexer_by_name(lang or "text")
    except Exception:
        lexer = TextLexer()
    return pyg(code, lexer, HtmlFormatter(cssclass="highlight"))


def markdown_html(text: str) -> str:
    """CommonMark with tables and raw HTML; headings carry GitHub's anchors (repeats numbered -1, -2 ...)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True, "highlight": lambda code, lang, _attrs: highlight(code, lang)})
    md.enable(["table", "strikethrough"])
    seen: dict[str, int] = {}

    def heading_ids(state):
        toks = state.tokens
        for i, tok in enumerate(toks):
            if tok.type == "heading_open" and i + 1 < len(toks):
                a = anchor(toks[i + 1].content)
                n = seen.get(a, 0)
                seen[a] = n + 1
                tok.attrSet("id", a if n == 0 else f"{a}-{n}")

    md.core.ruler.push("heading_ids", heading_ids)
    return md.render(text)


# ----------------------------------------------------------------------------------------------- notebooks


def _control(model: dict) -> str:
    """A widget control as words: its description and the value it opens on (with what it offers)."""
    s, name = model["state"], model["model_name"]
    desc = html_text(s.get("description") or name.replace("Model", ""))
    if name in ("DropdownModel", "SelectionSliderModel", "SelectionRangeSliderModel", "RadioButtonsModel",
                "ToggleButtonsModel", "SelectModel"):
        labels = [str(x) for x in s.get("_options_labels", [])]
        i = s.get("index")
        value = labels[i] if isinstance(i, int) and 0 <= i < len(labels) else ""
        offer = (", ".join(labels) if len(labels) <= 12 else f"{len(labels)} choices")
        return f'<span class="book-control">{desc}: <b>{html_text(value)}</b> <small>({html_text(offer)})</small></span>'
    if name in ("IntSliderModel", "FloatSliderModel"):
        return (f'<span class="book-control">{desc}: <b>{html_text(str(s.get("value")))}</b> '
                f'<small>({html_text(str(s.get("min")))}–{html_text(str(s.get("max")))})</small></span>')
    return ""


def widget_snapshot(model_id: str, state: dict, depth: int = 0) -> str:
    """The widget ``model_id`` as saved in the notebook's widget state, drawn as static HTML: boxes as blocks,
    controls as words, HTML widgets as their markup, Output widgets' images and text."""
    model = state.get(model_id)
    if model is None or depth > 20:
        return ""
    name, s = model["model_name"], model["state"]
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel"):
        kids = [widget_snapshot(c.removeprefix("IPY_MODEL_"), state, depth + 1) for c in s.get("children", [])]
        cls = "book-hbox" if name == "HBoxModel" else "book-vbox"
        return f'<div class="{cls}">' + "".join(k for k in kids if k) + "</div>"
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'<div class="book-widget-html">{s.get("value", "")}</div>'
    if name == "LabelModel":
        return f'<div>{html_text(str(s.get("value", "")))}</div>'
    if name == "OutputModel":
        parts = []
        for out in s.get("outputs", []):
            data = out.get("data", {})
            for mime in IMAGE_TYPES:
                if mime in data:
                    parts.append(f'<img class="book-widget-snapshot" alt="the explorer\'s opening view" '
                                 f'src="data:{mime};base64,{"".join(data[mime]).strip()}">')
                    break
            else:
                if "text/html" in data:
                    parts.append("".join(data["text/html"]))
                elif "text/plain" in data or out.get("output_type") == "stream":
                    text = "".join(data.get("text/plain", out.get("text", "")))
                    parts.append(f"<pre>{html_text(text)}</pre>")
        return "".join(parts)
    return _control(model)


def _image_count(outputs) -> int:
    return sum(1 for o in outputs if any(m in o.get("data", {}) for m in IMAGE_TYPES))


def prepare_notebook(nb) -> tuple[int, int, list[str]]:
    """Replace each widget output by static HTML (in place) and drop the saved widget state; returns the number of
    image outputs, of widget outputs and warnings."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    fig_of_cell, n = {}, 0  # cell index -> its figures' numbers
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            k = _image_count(cell.outputs)
            fig_of_cell[i] = list(range(n + 1, n + k + 1))
            n += k
    ucx_cells = {i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and any(
        'class="ucx' in "".join(o.get("data", {}).get("text/html", "")) for o in cell.outputs)}
    widgets, warnings = 0, []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for j, out in enumerate(cell.outputs):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                continue
            widgets += 1
            own = "".join(out.get("data", {}).get("text/html", ""))
            if own.startswith('<div class="ucx"'):  # the explorer's widget carries its kernel-free form: shown as is
                cell.outputs[j] = {"output_type": "display_data", "metadata": {}, "data": {
                    "text/html": own, "text/plain": "attention explorer (runs in the page)"}}
                continue
            model_id = view.get("model_id", "")
            snapshot = widget_snapshot(model_id, state)
            figs = sorted({f for c in range(i - 3, i + 4) for f in fig_of_cell.get(c, [])})
            note = ('<b>Live explorer: open in JupyterLab</b> (<code>make lab</code>) to move its controls; '
                    "a static page has no kernel to redraw it.")
            if any(c in ucx_cells for c in range(i - 3, i + 4)):
                note += ' Without a kernel: the <a href="#ucx-explorer">slider explorer</a> beside it redraws.'
            if figs:
                note += " The static figure" + ("s" if len(figs) > 1 else "") + " beside it: " + ", ".join(
                    f'<a href="#figure-{f}">figure {f}</a>' for f in figs) + "."
            if snapshot:
                note += " Below, its opening view as saved with the notebook."
            else:
                warnings.append(f"cell {i}: widget {model_id} has no saved state; shown as a note only")
            cell.outputs[j] = {"output_type": "display_data", "metadata": {}, "data": {
                "text/html": f'<div class="book-widget"><div class="book-widget-note">{note}</div>{snapshot}</div>',
                "text/plain": "live explorer: open in JupyterLab"}}
    nb.metadata.pop("widgets", None)
    return n, widgets, warnings


def notebook_html(path: Path) -> tuple[str, int, int, list[str]]:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    figures, widgets, warnings = prepare_notebook(nb)
    exporter = HTMLExporter(template_name="lab")
    full, _ = exporter.from_notebook_node(nb)
    body = full[full.index("<main>") + len("<main>"):full.rindex("</main>")]
    counter = iter(range(1, 10**6))
    body = re.sub(r'<div class="jp-RenderedImage jp-OutputArea-output',
                  lambda m: f'<div id="figure-{next(counter)}" class="jp-RenderedImage jp-OutputArea-output', body)
    shown = next(counter) - 1
    if shown != figures:
        raise RuntimeError(f"{path}: {figures} image outputs but {shown} rendered")
    first_ucx = body.find('<div class="ucx"')
    if first_ucx >= 0:
        body = body[:first_ucx] + '<span id="ucx-explorer"></span>' + body[first_ucx:]
    return body, figures, widgets, warnings


# ----------------------------------------------------------------------------------------------- other pages


def source_html(path: Path, rel: str) -> str:
    lang = {".py": "python", ".md": "markdown", ".json": "json", ".toml": "toml", ".yml": "yaml", ".yaml": "yaml",
            ".sh": "bash", ".cfg": "ini"}.get(path.suffix, "text")
    return f'<h1><code>{html_text(rel)}</code></h1>\n' + highlight(path.read_text(errors="replace"), lang)


def folder_html(site, rel: str) -> str:
    """The listing of repository folder ``rel``: every entry by name, a link where the entry is a file with a page;
    every entry is resolved first (:func:`entry`), so one that leaves the repository stops the build."""
    items = []
    for p in sorted((site.root / rel).iterdir()):
        if p.name.startswith((".", "__pycache__")) or not site.tracked(p):
            continue
        child = p.relative_to(site.root).as_posix()
        kind, _ = entry(site.root, child)
        if kind is None:
            continue
        name = p.name + ("/" if kind == "dir" else "")
        target = site.page_for(child, False) if kind == "file" else None
        items.append(f'<li><a href="{html_text(p.name)}">{html_text(name)}</a></li>' if target
                     else f"<li><code>{html_text(name)}</code></li>")
    return f"<h1><code>{html_text(rel)}</code></h1>\n<ul>\n" + "\n".join(items) + "\n</ul>"


# ----------------------------------------------------------------------------------------------- links

ATTR = re.compile(r'(<(?:a|img|link|script|iframe)\b[^>]*?\s(?:href|src)=")([^"]*)(")', re.I)


class Site:
    def __init__(self, root: Path):
        self.root = root
        self.pages = table_of_contents(root)
        self.by_src = {p.src: p for p in self.pages}
        self.queue: list[Page] = []

    def tracked(self, p: Path) -> bool:
        rel = p.relative_to(self.root).as_posix()
        return not any(part.startswith(".") or part in ("outputs", "__pycache__", "runs") for part in rel.split("/"))

    def page_for(self, rel: str, is_dir: bool) -> Page | None:
        """The page of repository path ``rel``: a known one, or a new source / folder page (queued)."""
        key = rel.rstrip("/") + ("/" if is_dir else "")
        if key in self.by_src:
            return self.by_src[key]
        p = self.root / rel
        if not self.tracked(p):
            return None
        kind, real = entry(self.root, rel)  # a symlink out of the repository or a special file stops the build
        if kind is None:
            return None
        if kind == "dir":
            page = Page(key, out_path(key, "folder"), rel.rstrip("/") + "/", "", "folder")
        elif p.suffix == ".ipynb" or (p.suffix in TEXT_SUFFIXES and real.stat().st_size <= SOURCE_MAX_BYTES):
            kind = "markdown" if p.suffix == ".md" else "source"
            page = Page(key, out_path(key, kind), p.name, "", kind)
        else:
            return None
        self.by_src[key] = page
        self.queue.append(page)
        return page

    def rewrite(self, page: Page, body: str) -> str:
        """Every relative href/src of ``body`` (written at ``page.src``) pointed at the built page, #anchor kept."""
        base = posixpath.dirname(page.src.rstrip("/")) if page.kind != "folder" else page.src.rstrip("/")

        def fix(m):
            url = html.unescape(m.group(2))
            if not url or url.startswith("#") or re.match(r"[a-zA-Z][\w+.-]*:", url) or url.startswith("//"):
                return m.group(0)
            path, _, frag = url.partition("#")
            path = path.split("?", 1)[0]
            rel = posixpath.normpath(posixpath.join(base, path)) if not path.startswith("/") else path.lstrip("/")
            if m.group(1).lower().startswith("<img") and rel.lower().endswith((".png", ".jpg", ".jpeg")) \
                    and not rel.startswith("..") and self.tracked(self.root / rel) and entry(self.root, rel)[0] == "file":
                mime = "image/png" if rel.lower().endswith(".png") else "image/jpeg"  # a picture: inlined, like the outputs
                data = base64.b64encode(repo_file(self.root, rel).read_bytes()).decode()
                return m.group(1) + f"data:{mime};base64,{data}" + m.group(3)
            if rel == "." or rel.startswith(".."):
                target = None
            else:
                target = self.page_for(rel, entry(self.root, rel)[0] == "dir")
            if target is None:
                page.warnings.append(f"link to {url!r}: not in the repository; left without a target")
                return m.group(1).rsplit(" ", 1)[0] + ' data-missing="' + html_text(url) + m.group(3)
            href = posixpath.relpath(target.out, posixpath.dirname(page.out))
            return m.group(1) + html_text(href + (f"#{frag}" if frag else "")) + m.group(3)

        return ATTR.sub(fix, body)


# ----------------------------------------------------------------------------------------------- the page


CSS = """
:root { --book-sidebar: 17rem; }
body { margin: 0; font-family: var(--jp-content-font-family, system-ui, sans-serif); background: #fff; }
.book-sidebar { position: fixed; top: 0; bottom: 0; left: 0; width: var(--book-sidebar); overflow-y: auto;
  border-right: 1px solid #ddd; background: #f7f7f8; padding: 1rem 0.8rem; box-sizing: border-box; font-size: 14px; }
.book-sidebar .book-site { font-weight: bold; font-size: 16px; display: block; margin-bottom: 0.8rem; color: #222;
  text-decoration: none; }
.book-sidebar h2 { font-size: 12px; text-transform: uppercase; letter-spacing: 0.05em; color: #666; margin: 1rem 0 0.3rem; }
.book-sidebar ol, .book-sidebar ul { list-style: none; margin: 0; padding: 0; }
.book-sidebar li a { display: block; padding: 0.15rem 0.4rem; border-radius: 4px; color: #1a4d8f; text-decoration: none; }
.book-sidebar li a:hover { background: #e6ecf5; }
.book-sidebar li a[aria-current="page"] { background: #1a4d8f; color: #fff; }
.book-main { margin-left: var(--book-sidebar); padding: 1.5rem 2rem 3rem; max-width: 72rem; box-sizing: border-box; }
.book-doc { font-size: 15px; line-height: 1.55; }
.book-doc table { border-collapse: collapse; margin: 0.8rem 0; font-size: 14px; }
.book-doc th, .book-doc td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; vertical-align: top; }
.book-doc code { background: #f2f2f4; padding: 0 0.2em; border-radius: 3px; font-size: 90%; }
.book-doc pre code, .highlight pre { background: none; }
.highlight { background: #f6f8fa; border-radius: 4px; padding: 0.1rem 0.8rem; overflow-x: auto; margin: 0.8rem 0; }
.book-pager { display: flex; justify-content: space-between; border-top: 1px solid #ddd; margin-top: 2rem;
  padding-top: 1rem; }
.book-widget { border: 1px dashed #b58900; border-radius: 4px; padding: 0.5rem; margin: 0.3rem 0; }
.book-widget-note { background: #fdf6e3; padding: 0.4rem 0.6rem; margin-bottom: 0.4rem; }
.book-hbox { display: flex; flex-wrap: wrap; gap: 1.2rem; }
.book-control { font-size: 13px; }
.book-widget-snapshot { max-width: 100%; }
.jp-Notebook { padding: 0; }
/* from nbconvert's lab template (its page head is not used) */
a.anchor-link { visibility: hidden; margin-left: 0.3em; text-decoration: none; }
:is(h1, h2, h3, h4, h5, h6):hover > a.anchor-link { visibility: visible; }
.jp-InputArea, .jp-InputArea-editor { overflow: hidden; }
.cm-editor.cm-s-jupyter .highlight pre { padding: var(--jp-code-padding) 4px; margin: 0; font-family: inherit;
  font-size: inherit; line-height: inherit; color: inherit; }
.jp-OutputArea-output pre { line-height: inherit; font-family: inherit; }
.jp-RenderedText pre { color: var(--jp-content-font-color1); font-size: var(--jp-code-font-size); }
.jp-Collapser { display: none; }
@media (max-width: 800px) {
  .book-sidebar { position: static; width: auto; border-right: none; border-bottom: 1px solid #ddd; }
  .book-main { margin-left: 0; padding: 1rem; }
}
"""


def nav_html(site: Site, current: Page) -> str:
    rel = posixpath.dirname(current.out)
    out = [f'<a class="book-site" href="{posixpath.relpath("index.html", rel)}">{html_text(SITE_TITLE)}</a>']
    for section in ("Course", "Lessons", "Reference", "Solutions"):
        items = [p for p in site.pages if p.section == section]
        if not items:
            continue
        out.append(f"<h2>{section}</h2>\n<ol>")
        for p in items:
            label = "Home" if p.src == "README.md" else p.title
            cur = ' aria-current="page"' if p is current else ""
            out.append(f'<li><a href="{html_text(posixpath.relpath(p.out, rel))}"{cur}>{html_text(label)}</a></li>')
        out.append("</ol>")
    return "\n".join(out)


def page_html(site: Site, page: Page) -> str:
    rel = posixpath.dirname(page.out)
    static = posixpath.relpath("_static", rel)
    toc = [p for p in site.pages if p.section]
    pager = ""
    if page in toc:
        i = toc.index(page)
        prev = f'<a rel="prev" href="{html_text(posixpath.relpath(toc[i - 1].out, rel))}">← {html_text(toc[i - 1].title)}</a>' if i else "<span></span>"
        nxt = (f'<a rel="next" href="{html_text(posixpath.relpath(toc[i + 1].out, rel))}">{html_text(toc[i + 1].title)} →</a>'
               if i + 1 < len(toc) else "<span></span>")
        pager = f'<nav class="book-pager">{prev}{nxt}</nav>'
    wrap = "jp-Notebook" if page.kind == "notebook" else "book-doc jp-RenderedHTMLCommon"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html_text(page.title)} · {html_text(SITE_TITLE)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{static}/jupyterlab.css">
<link rel="stylesheet" href="{static}/theme-light.css">
<link rel="stylesheet" href="{static}/pygments.css">
<link rel="stylesheet" href="{static}/book.css">
</head>
<body data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<nav class="book-sidebar" aria-label="table of contents">
{nav_html(site, page)}
</nav>
<main class="book-main">
<div class="{wrap}" data-source="{html_text(page.src)}">
{page.body}
</div>
{pager}
</main>
</body>
</html>
"""


def write_static(out: Path) -> None:
    import nbconvert
    from pygments.formatters import HtmlFormatter

    static = out / "_static"
    static.mkdir(parents=True, exist_ok=True)
    lab = None
    for base in [Path(sys.prefix) / "share/jupyter/nbconvert/templates/lab/static",
                 Path(nbconvert.__file__).parent / "../share/jupyter/nbconvert/templates/lab/static"]:
        if (base / "index.css").is_file():
            lab = base
            break
    if lab is None:
        from jupyter_core.paths import jupyter_path

        lab = next(Path(p) / "lab/static" for p in jupyter_path("nbconvert", "templates")
                   if (Path(p) / "lab/static/index.css").is_file())
    shutil.copyfile(lab / "index.css", static / "jupyterlab.css")
    shutil.copyfile(lab / "theme-light.css", static / "theme-light.css")
    (static / "pygments.css").write_text(HtmlFormatter(style="default").get_style_defs(".highlight")
                                         + "\n" + HtmlFormatter(style="default").get_style_defs(".jp-RenderedHTMLCommon .highlight"))
    (static / "book.css").write_text(CSS)


def earlier_site(folder: Path) -> set[str] | None:
    """The files a build from before ``.unicache-output`` existed wrote into ``folder`` (the pages its
    _static/pages.json lists and _static/), or None when ``folder`` is no such site."""
    try:
        pages = json.loads(read_inside(folder, "_static/pages.json"))
        outs = {p["out"] for p in pages}
        if stat_inside(folder, "_static/book.css") is None:
            return None
    except (InputError, OSError, ValueError, TypeError, KeyError):
        return None
    return outs | STATIC_FILES if all(isinstance(o, str) for o in outs) else None


def site_folder(out, root: Path = ROOT):
    """The output folder, checked (unicache_lib.paths.output_folder): not empty, not the repository, above it or one
    of its folders, and holding nothing this builder did not write; raises :class:`BookError` saying what to do."""
    try:
        return output_folder(out, TOOL, option="--out", roots=(root, ROOT), legacy=earlier_site)
    except InputError as e:
        raise BookError(str(e)) from e


def build(out, root: Path = ROOT, log=print) -> Site:
    """Build the site of the repository at ``root`` into ``out``. ``out`` must be new, empty or a site this builder
    wrote (:func:`site_folder`). The pages are written into a temporary folder beside ``out`` first; only once every
    page is built do they replace the earlier site (the files it wrote last time that this build does not write are
    removed, nothing else), so a build that fails leaves the earlier site as it was."""
    t0 = time.perf_counter()
    folder = site_folder(out, root)
    out = folder.path
    site = Site(root)  # the table of contents read (and checked) before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.building-"))
    try:
        done = _write_pages(site, tmp, root)
        new = sorted(Path(os.path.relpath(os.path.join(top, f), tmp)).as_posix()
                     for top, _, files in os.walk(tmp) for f in files)
        _move_in(folder, tmp, new)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in site.by_src.values():
        for w in p.warnings:
            log(f"warning: {p.src}: {w}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    log(f"built {done} pages into {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s; "
        f"open {out / 'index.html'} or serve it: .venv/bin/python -m http.server -d {out}")
    return site


def _move_in(folder, tmp: Path, new: list[str]) -> None:
    """Put the built files ``new`` (paths relative to ``tmp``) in place of the earlier site in ``folder``: listed in
    its marker first (a crash leaves nothing unlisted), a link the marker lists removed (never followed), each file
    renamed over its earlier version, then the earlier site's files this build does not write removed."""
    out = folder.path
    folder.record(folder.files | set(new))
    for rel, p in folder._listed():
        if p.is_symlink():
            p.unlink()
    for rel in new:
        dest = out / rel
        there = dest.parent
        while not os.path.lexists(there):
            there = there.parent
        if there.resolve() != there:  # a folder of the site swapped for a link: never written through
            raise BookError(f"{there} is a symbolic link in the site folder: not written through; remove it (make "
                            f"book did not make it)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, dest)
    folder.clean(keep=new)


def _write_pages(site: Site, out: Path, root: Path) -> int:
    write_static(out)
    todo = list(site.pages)
    done = 0
    while todo or site.queue:
        if not todo:
            todo, site.queue = site.queue, []
        page = todo.pop(0)
        if page.kind == "notebook":
            body, page.figures, page.widgets, page.warnings = notebook_html(repo_file(root, page.src))
        elif page.kind == "markdown":
            body = markdown_html(repo_text(root, page.src))
        elif page.kind == "folder":
            if entry(root, page.src.rstrip("/"))[0] != "dir":
                raise BookError(f"{page.src}: not published: not a folder inside the repository")
            body = folder_html(site, page.src.rstrip("/"))
        else:
            body = source_html(repo_file(root, page.src), page.src)
        page.body = site.rewrite(page, body)
        dest = out / page.out
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page_html(site, page))
        done += 1
    manifest = [{"src": p.src, "out": p.out, "title": p.title, "section": p.section, "kind": p.kind,
                 "figures": p.figures, "widgets": p.widgets} for p in site.by_src.values()]
    (out / "_static" / "pages.json").write_text(json.dumps(manifest, indent=1))
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/book", help="the site's folder: new, empty or a site this builder wrote "
                    "(what it wrote last time is removed first, nothing else); default outputs/book")
    ap.add_argument("--ref", help="build from this git revision (e.g. HEAD: the committed files, whatever the working "
                                  "tree holds now) instead of the working tree")
    args = ap.parse_args(argv)
    try:
        site_folder(args.out, ROOT)  # refused before anything is read or extracted
        if args.ref:
            with tempfile.TemporaryDirectory() as tmp:
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", args.ref], check=True,
                                         capture_output=True).stdout
                try:
                    tarfile.open(fileobj=io.BytesIO(archive)).extractall(tmp, filter="data")
                except tarfile.FilterError as e:  # a committed symlink that leaves the repository, an absolute path
                    raise BookError(f"{args.ref} holds {e.tarinfo.name!r}, which leads outside the repository "
                                    f"({type(e).__name__}): not published; remove it from the commit") from e
                build(args.out, Path(tmp))
        else:
            build(args.out, ROOT)
    except BookError as e:
        print(f"make book: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:  # a name too long, a full disk: one line, the earlier site as it was
        print(f"make book: error: {' '.join(str(e).split())}: nothing was replaced", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
