"""What configuration cannot do for the course site (book/conf.py): every picture gets an alt text.

A notebook figure takes its alt text from its cell's metadata where the cell has it (myst-nb reads
``mystnb: {image: {alt: ...}}`` and ``mystnb: {figure: {caption: ...}}`` itself); otherwise from the prose just before
it: the lessons put the sentence that says what the picture shows right before the picture's cell. A picture in a
page's markdown without one gets its file name. A screen reader then reads the lesson's words, never the image's
address or "No description has been provided for this image".

Nothing outside the staged course is read into a page (issue #60): every path a page names that Sphinx resolves
(``{include}``, ``{literalinclude}``, an image, a download) must resolve inside the staging folder, and ``{raw}`` /
``{csv-table}`` may not read a ``:file:`` or ``:url:`` at all. A path that climbs out is refused: recorded in
:data:`REFUSED` (page, path), never read; book/build.py fails the build in one line naming both."""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst.directives.misc import Raw
from sphinx.directives.patches import CSVTable

REFUSED: list[tuple[str, str]] = []  # (page, path) a page named outside the staged course; book/build.py reads it
OUTPUTS: list[Path] = []  # myst-nb's folder of the notebooks' own outputs (images it writes from the committed cells)

ALT_CHARS = 300


def _plain(text: str) -> str:
    return " ".join(text.split())


def _short(text: str) -> str:
    text = _plain(text)
    if len(text) <= ALT_CHARS:
        return text
    cut = text[:ALT_CHARS].rsplit(" ", 1)[0]
    return cut + " …"


def _in_cell(node) -> bool:
    while node is not None:
        if isinstance(node, nodes.container) and node.get("nb_element", "").startswith("cell_code"):
            return True
        node = node.parent
    return False


def give_alt_text(app, doctree) -> None:
    """Every image node without an alt text gets one: the last paragraph before it outside code cells, or its
    file name."""
    last = ""
    for node in doctree.findall(lambda n: isinstance(n, (nodes.paragraph, nodes.image))):
        if isinstance(node, nodes.paragraph):
            if not _in_cell(node):
                last = node.astext()
            continue
        if node.get("alt"):
            continue
        if _in_cell(node) and last:
            node["alt"] = "Figure: " + _short(last)
        else:
            name = re.sub(r"[_-]+", " ", node.get("uri", "").rsplit("/", 1)[-1].rsplit(".", 1)[0])
            node["alt"] = _short(name) or "figure"


def _refuse(page: str, path: str) -> None:
    if (page, path) not in REFUSED:
        REFUSED.append((page, path))


def _inside(root: Path, path: str) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except (ValueError, OSError):
        return False


def private_outputs(outdir: Path) -> list[Path]:
    """The folder pages may read besides the staged course: myst-nb's ``outdir.parent / "jupyter_execute"``
    (myst_nb.sphinx_ext.OUTPUT_FOLDER: the images it writes from the committed cells), only where ``outdir`` is
    book/build.py's ``<private>/html`` and that parent its own temporary folder (``.<name>.building-XXXX``); none
    otherwise, so no folder a user keeps beside a site is ever read into a page."""
    parent = Path(outdir).resolve().parent
    if Path(outdir).name == "html" and re.fullmatch(r"\..+\.building-\w+", parent.name):
        return [parent / "jupyter_execute"]
    return []


def _guard_paths(app) -> None:
    """Wrap the environment's ``relfn2path`` (what include, literalinclude, images and downloads resolve their paths
    with), on its class (the environment is pickled): a path that resolves outside the staging folder is recorded and
    replaced by one that does not exist."""
    from sphinx.environment import BuildEnvironment

    REFUSED.clear()
    OUTPUTS[:] = private_outputs(Path(app.outdir))
    if not getattr(BuildEnvironment.relfn2path, "course_guard", False):
        BuildEnvironment.relfn2path = _guarded(BuildEnvironment.relfn2path)


def _guarded(plain):
    def relfn2path(env, filename, docname=None):
        rel, full = plain(env, filename, docname)
        if not _inside(env.srcdir, full) and not any(_inside(root, full) for root in OUTPUTS):
            _refuse(os.fspath(env.doc2path(docname or env.docname, False)), os.fspath(filename))
            return "_refused_path_outside_the_course", os.fspath(Path(env.srcdir) / "_refused_path_outside_the_course")
        return rel, full

    relfn2path.course_guard = True
    return relfn2path


def _read_inside(app, doctree) -> None:
    """Every file a page read while it was parsed (docutils records each include: ``{include}``, ``.. include::``,
    ``{literalinclude}``, ``:file:``) lies inside the staging folder or myst-nb's private outputs. Docutils' own form
    ``<name>`` joins the name to its standard include folder without asking ``relfn2path``, so it is checked here, on
    what was read, not on how it was named."""
    deps = getattr(doctree.settings, "record_dependencies", None)
    for dep in getattr(deps, "list", None) or []:
        full = os.path.join(os.getcwd(), dep)
        if not _inside(app.srcdir, full) and not any(_inside(root, full) for root in OUTPUTS):
            _refuse(os.fspath(app.env.doc2path(app.env.docname, False)), os.fspath(dep))


def escape_theme_titles(app, pagename, templatename, context, doctree) -> None:
    """sphinx-book-theme puts a page's title and the site's as plain text (``astext()``) into its context and writes
    them unescaped (``<h1>{{ pagetitle }}</h1>`` in its print header, ``{{ root_title }}`` in its sidebar): a title
    holding ``<`` (a file name, a heading about ``<tag>``) would become markup. Escaped here, after the theme."""
    for key in ("pagetitle", "root_title"):
        if isinstance(context.get(key), str):
            context[key] = html.escape(context[key])


def _no_file_option(cls):
    """``cls`` (raw, csv-table) with its ``:file:`` and ``:url:`` options refused (they read any file or URL)."""
    class Guarded(cls):
        def run(self):
            for opt in ("file", "url"):
                if opt in self.options:
                    _refuse(self.state.document.get("source", "?"), f":{opt}: {self.options[opt]}")
                    return []
            return super().run()

    Guarded.__name__ = f"Guarded{cls.__name__}"
    return Guarded


MD_LINK = re.compile(r'(href=")((?![a-z][a-z0-9+.-]*:|/|#)[^"#?]+)\.(?:md|ipynb)((?:#[^"]*)?")')


def html_output_links(app, doctree, docname) -> None:
    """A notebook's HTML output linking a page as the repository names it (``../docs/GLOSSARY.md#sink``, as JupyterLab
    and GitHub open it) links the site's page (``../docs/GLOSSARY.html#sink``): myst-nb rewrites the links of
    markdown, not of raw HTML. Relative links only; the site keeps the repository's layout."""
    for node in list(doctree.findall(nodes.raw)):
        if "html" in node.get("format", "").split():
            text = node.astext()
            new = MD_LINK.sub(lambda m: f"{m.group(1)}{m.group(2)}.html{m.group(3)}", text)
            if new != text:
                node.replace_self(nodes.raw(new, new, format=node["format"]))


def setup(app):
    from docutils.parsers.rst.directives.misc import Include  # Sphinx's and MyST's include read its options

    # docutils imports the module an include's :parser: names while it reads the options (book/build.py refuses such
    # a page before Sphinx sees it; here the option does not exist either)
    Include.option_spec = {k: v for k, v in Include.option_spec.items() if k != "parser"}
    app.connect("doctree-read", give_alt_text)
    app.connect("doctree-read", _read_inside)
    app.connect("doctree-resolved", html_output_links)
    app.connect("builder-inited", _guard_paths)
    app.connect("html-page-context", escape_theme_titles, priority=900)
    app.add_directive("raw", _no_file_option(Raw), override=True)
    app.add_directive("csv-table", _no_file_option(CSVTable), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
