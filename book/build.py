"""`make book`: the course as a static website, offline, built by Sphinx + sphinx-book-theme + myst-nb.

    .venv/bin/python book/build.py --out outputs/book [--ref HEAD] [--record data/results/book.json]

Pages: README.md is the landing page (index.html), the committed, executed notebooks/NN_*.ipynb the lessons in order
(shown as committed, never re-executed: ``nb_execution_mode = "off"``), docs/*.md the reference pages (in the order
README.md first links them), solutions/README.md and one page per solutions/*.py, titled by its lesson. The site's
look, search, in-page contents, dark mode and mobile menu are sphinx-book-theme's (book/conf.py); book/_ext/course.py
gives every figure an alt text. A repository file a page links to that is not a page (``../unicache_lib/claims.py``)
gets a page showing it; a folder, a page listing it. Relative links keep their #anchors (``myst_heading_anchors``: the
docs' headings get GitHub's anchors, so a lesson's ``../docs/GLOSSARY.md#anchors`` lands on its term).

This script only stages: it copies what the site shows into a temporary folder (links to README.md and to source
files pointed at their pages; a widget output that needs a kernel replaced by a note saying to open the lesson in
JupyterLab; the notebooks' saved widget state dropped, so no page carries a widget manager) and runs Sphinx on it
with book/ as its configuration folder.

What it reads and where it writes (issue #60): every file it stages is resolved first and must be a regular file
inside the repository (unicache_lib.core.untrusted.path_inside, judged lstat by lstat before anything opens it); a
committed symlink that leads outside it, a symlinked folder, a FIFO or a device fails the build with one line naming
it (exit status 2). A symlink that stays inside is published only when what it leads to is: a tracked file (in a git
checkout) outside dot folders and files and outputs/. A path inside a page's text (an ``{include}``,
``{literalinclude}``, image or download that climbs out of the staged course, a ``:file:``/``:url:`` option) is never
read: book/_ext/course.py records it and the build fails in one line naming the page and the path. The output folder is checked by unicache_lib.paths.output_folder
(refused when empty, the repository or a folder above it, a repository folder other than under outputs/, or a folder
holding files this builder did not write); the site is built in a temporary folder beside it and moved in only once
Sphinx succeeded (a failed build leaves the earlier site as it was); the builder records what it wrote in the folder's
``.unicache-output`` and a rebuild removes only those files. ``--record`` keeps the build's time and size in a JSON
file (data/results/book.json: docs/FORKING.md's numbers are generated from it)."""
from __future__ import annotations

import argparse
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
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
BOOK = Path(__file__).resolve().parent  # conf.py, _ext/, _static/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from unicache_lib.core.errors import InputError, MissingFileError  # noqa: E402
from unicache_lib.core.untrusted import path_inside, read_inside, stat_inside  # noqa: E402
from unicache_lib.paths import output_folder  # noqa: E402

TOOL = "make book"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg")
TEXT_SUFFIXES = {".py", ".txt", ".json", ".csv", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".j2", ".js", ".css"}
LANGS = {".py": "python", ".json": "json", ".toml": "toml", ".yml": "yaml", ".yaml": "yaml", ".sh": "bash",
         ".cfg": "ini", ".js": "javascript", ".css": "css"}
SOURCE_MAX_BYTES = 1_000_000
SECTIONS = ("Course", "Lessons", "Reference", "Solutions")
WIDGET_NOTE = ('<div class="course-widget-note"><b>Live explorer: open in JupyterLab</b> (<code>make lab</code>) to '
               "move its controls: it needs a kernel, which a static page does not have.</div>")


MARKUP_IN_NAME = re.compile(r"[<>\"'&`\x00-\x1f\x7f]")  # what a page's own name may not hold
CONTROL_IN_NAME = re.compile(r"[\x00-\x1f\x7f]")  # what no name the site shows may hold (a line break starts markup)
NOTEBOOK_METADATA = {"kernelspec", "language_info", "jupytext", "papermill", "unicache", "widgets", "colab", "vscode",
                     "toc", "celltoolbar", "interpreter"}  # what a lesson's notebook metadata may hold (editors' own)
DIRECTIVE_TRICKS = re.compile(  # options and forms that make docutils import a module or read outside the course
    r"^[\s>]*:?parser:|(?:include|literalinclude)(?:::|\})\s*<", re.M | re.I)  # \s: a next line, an NBSP too
PAGE_SETTINGS = {"orphan", "title"}
SPHINX_OWN = {"search.html", "genindex.html", "py-modindex.html", "objects.inv", "searchindex.js"}  # its own outputs  # what a page's front matter may set; MyST and myst-nb read the rest as build settings


def _no_directive_tricks(src: str, text: str) -> None:
    """An include's ``:parser:`` option makes docutils import the module it names (any module: a committed
    ``docs/x.py`` too) while it reads the options, before any check in a directive can run, and that parser may read
    the included text's front matter as settings; docutils' ``<name>`` form reads a file before Sphinx is asked (a
    FIFO hangs the build). Neither is used by the course: a page holding one is refused before Sphinx sees it."""
    m = DIRECTIVE_TRICKS.search(text)
    if m:
        line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()
        raise BookError(f"{src}: {line[:160]!r}: an include's :parser: option imports a module at build time and the "
                        f"<name> form reads outside the course: not published; remove it")


def _no_build_settings(src: str, text: str | None = None, metadata: dict | None = None) -> None:
    """A page may not change how the site is built: front matter (a markdown page) or notebook metadata that sets
    MyST or myst-nb options could enable Jinja2 substitutions (any Python at build time), execute the page
    (``execution_mode: force``) or read it as a text notebook; ``book/conf.py``'s settings are only defaults a page can
    override, so such a page is refused in one line before Sphinx sees it."""
    if metadata is not None:  # what MyST and myst-nb read from a notebook's metadata as settings is not a lesson's
        keys = sorted(k for k in metadata if str(k) not in NOTEBOOK_METADATA)
    else:
        from myst_parser.config.main import read_topmatter  # what MyST itself reads as a page's settings

        text = (text or "").lstrip("\ufeff")  # Sphinx reads sources as utf-8-sig
        if not text.startswith(("---", "+++")):
            return
        lines = text.splitlines()
        if len(lines) > 1 and lines[1].startswith(("---", "...")):  # an empty block: no settings
            return
        try:
            head = read_topmatter(text)
        except Exception:  # noqa: BLE001 - MyST's own error for a block it cannot read
            head = "unreadable"
        if head is None:  # +++ (MyST reads only ---): plain text, no settings
            return
        if not isinstance(head, dict):
            raise BookError(f"{src}: it opens with a {text[:3]} line that is not YAML front matter MyST can read: "
                            f"remove the block, or start the page with its title")
        keys = sorted(str(k) for k in head if str(k) not in PAGE_SETTINGS)
    if keys:
        raise BookError(f"{src}: its {'metadata' if metadata is not None else 'front matter'} sets {keys}, which would "
                        f"change how the site is built (MyST or myst-nb settings: templates, execution, file format): "
                        f"not published; remove {'them' if len(keys) > 1 else 'it'}"
                        + ("" if metadata is not None else f" (a page may set only {sorted(PAGE_SETTINGS)})"))


class BookError(Exception):
    """Something the builder must not publish (a symlink that leaves the repository, a FIFO, a device), a folder it
    must not write, or a Sphinx build that failed: `make book` prints it as one line and exits with status 2."""


# ----------------------------------------------------------------------------------------------- what may be published

UNPUBLISHED = ("outputs", "runs", "__pycache__")  # the tools' outputs and caches: never pages, never link targets


class UntrackedError(BookError):
    """A file the site would publish that git does not track (in a git checkout): the build fails naming it."""


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
        inside = top.returncode == 0 and Path(top.stdout.strip()).resolve() == Path(root).resolve()
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
    return _published(root, rel, kind, real)


def _published(root: Path, rel: str, kind: str, real: Path) -> tuple[str | None, Path | None]:
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
        if not linked and target in others:  # (#60 B6) a file of the working tree git does not track: perhaps yours
            raise UntrackedError(f"{rel}: not published: git does not track it (the site publishes only committed "
                                 f"files, never an untracked one of the working tree); commit it (git add {rel}) or "
                                 f"remove what names it")
        if not linked and target not in tracked:
            return None, None  # a file git ignores: not part of the course
    if listed is not None and kind == "dir" and target:
        tracked, others = listed
        if not any(f.startswith(target + "/") for f in tracked):
            if any(f.startswith(target + "/") for f in others):
                raise UntrackedError(f"{rel}/: not published: git tracks no file in it (the site publishes only "
                                     f"committed files); commit them or remove what names the folder")
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


# ----------------------------------------------------------------------------------------------- the pages


def md_title(text: str, default: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    m = re.search(r"^#{1,2} +(.+?)\s*#*\s*$", text, re.M)
    return re.sub(r"`|\*\*|<[^>]+>", "", m.group(1)).strip() if m else default


def notebook_title(nb: dict, default: str) -> str:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            return md_title(_source(cell), default)
    return default


def _source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def docs_order(root: Path) -> list[str]:
    """docs/*.md in the order README.md first links them, then the rest by name."""
    readme = repo_text(root, "README.md")
    linked = []
    for m in re.finditer(r"\]\((docs/[^)#\s]+\.md)", readme):
        if m.group(1) not in linked and entry(root, m.group(1))[0] == "file":
            linked.append(m.group(1))
    rest = sorted(p.relative_to(root).as_posix() for p in (Path(root) / "docs").glob("*.md"))
    return linked + [d for d in rest if d not in linked]


def staged_name(src: str, kind: str) -> str:
    """The file that stands for repository path ``src`` in Sphinx's source folder (its docname + suffix)."""
    if src == "README.md":
        return "index.md"
    if kind == "folder":
        return posixpath.join(src.rstrip("/"), "index.md")
    if kind == "source":
        return src + ".md"
    return src


def out_name(staged: str) -> str:
    """The page Sphinx writes for staged source ``staged`` (a dot in a folder's name is not a suffix)."""
    return posixpath.splitext(staged)[0] + ".html"


class Site:
    """The pages of the course at ``root``: the table of contents first, then pages of files its pages link to."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.pages: list[dict] = []
        self.by_src: dict[str, dict] = {}
        self.warnings: list[str] = []
        self.lesson_titles: dict[str, str] = {}
        self._add("README.md", "Course", "markdown", "Home")
        for nb in sorted((self.root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            src = nb.relative_to(self.root).as_posix()
            title = notebook_title(json.loads(repo_text(self.root, src)), nb.stem)
            self.lesson_titles[nb.stem[:2]] = title
            self._add(src, "Lessons", "notebook", title)
        for src in docs_order(self.root):
            self._add(src, "Reference", "markdown", md_title(repo_text(self.root, src), Path(src).stem))
        if entry(self.root, "solutions/README.md")[0] == "file":
            self._add("solutions/README.md", "Solutions", "markdown",
                      md_title(repo_text(self.root, "solutions/README.md"), "Solutions"))
        for py in sorted((self.root / "solutions").glob("*.py")):
            src = py.relative_to(self.root).as_posix()
            repo_file(self.root, src)  # a regular file inside the repository, or the build stops here
            lesson = self.lesson_titles.get(py.stem[:2])
            self._add(src, "Solutions", "source", f"Solutions: {lesson}" if lesson else f"Solutions: {py.name}")

    def _add(self, src: str, section: str, kind: str, title: str) -> dict:
        if MARKUP_IN_NAME.search(src):
            raise BookError(f"{src!r}: a file named with <, >, a quote, & or a backtick cannot be a page or file of the "
                            "site (the name reaches its HTML, its links and its search index): rename it")
        staged = staged_name(src, kind)
        # a picture or a download is copied, not made a page: it shares no page's name (a.png beside a.md)
        taken = next((p["src"] for p in self.pages if "file" not in (kind, p["kind"]) and p["out"] == out_name(staged)),
                     None)
        if taken is not None or (kind != "file" and out_name(staged).split("/")[0] in SPHINX_OWN) or staged.startswith("_"):
            raise BookError(f"{src!r} would be published as {out_name(staged)}, which "
                            + (f"{taken!r} already is" if taken is not None else "Sphinx writes itself")
                            + ": rename it (two files of one name would replace each other without a word)")
        page = {"src": src, "staged": staged, "out": out_name(staged), "title": title, "section": section,
                "kind": kind}
        self.pages.append(page)
        self.by_src[src.rstrip("/") + ("/" if kind == "folder" else "")] = page
        return page

    def target(self, rel: str) -> dict | None:
        """The page (or staged file: a picture, a download) that repository path ``rel`` links to; a new page for a
        linked file or folder that has none yet; None when the repository does not publish it."""
        rel = rel.rstrip("/")
        for key in (rel, rel + "/"):
            if key in self.by_src:
                return self.by_src[key]
        if not rel or rel == "." or rel.startswith("..") or unpublished_part(rel) is not None:
            return None
        kind, real = entry(self.root, rel)  # a symlink out of the repository or a special file stops the build
        if kind is None:
            return None
        if kind == "dir":
            return self._add(rel, "", "folder", rel + "/")
        suffix = Path(rel).suffix.lower()
        if suffix in (".md", ".ipynb"):
            return self._add(rel, "", "markdown" if suffix == ".md" else "notebook", Path(rel).name)
        if suffix in TEXT_SUFFIXES and real.stat().st_size <= SOURCE_MAX_BYTES:
            return self._add(rel, "", "source", Path(rel).name)
        return self._add(rel, "", "file", Path(rel).name)  # a picture, a download: copied as it is


# ----------------------------------------------------------------------------------------------- links

CODE = re.compile(r"(^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\2[ \t]*$|`+[^`\n]*?`+|<!--.*?-->)", re.M | re.S)
LINK = re.compile(r'(\]\(\s*<?|\b(?:href|src)\s*=\s*")([^)\s">]+)')


def _outside_code(text: str, fix) -> str:
    """``fix`` applied to the parts of markdown ``text`` outside code blocks, code spans and HTML comments (the
    generated numbers' markers)."""
    out, last = [], 0
    for m in CODE.finditer(text):
        out.append(fix(text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(fix(text[last:]))
    return "".join(out)


def rewrite_links(site: Site, page: dict, text: str) -> str:
    """Every relative link of markdown ``text`` (at ``page``) pointed at the staged page or file it names, its
    #anchor kept; a link to something the repository does not publish is reported and left as it is."""
    base = posixpath.dirname(page["src"].rstrip("/")) if page["kind"] != "folder" else page["src"].rstrip("/")
    here = posixpath.dirname(page["staged"])

    def fix_url(m):
        url = m.group(2)
        if url.startswith("#") or re.match(r"[a-zA-Z][\w+.-]*:", url) or url.startswith("//"):
            return m.group(0)
        path, hash_, frag = url.partition("#")
        path = path.split("?", 1)[0]
        if not path:
            return m.group(0)
        rel = posixpath.normpath(posixpath.join(base, path)) if not path.startswith("/") else path.lstrip("/")
        target = site.target(rel)
        if target is None:
            site.warnings.append(f"{page['src']}: link to {url!r}: not in the repository; left as it is")
            return m.group(0)
        new = posixpath.relpath(target["staged"], here or ".")
        return m.group(1) + new + hash_ + frag

    return _outside_code(text, lambda part: LINK.sub(fix_url, part))


# ----------------------------------------------------------------------------------------------- staging


def _notebook(site: Site, page: dict, raw: str) -> str:
    """The notebook as staged: markdown links rewritten, its saved widget state dropped, a widget output that has no
    HTML form of its own (it needs a kernel) replaced by a note to open the lesson in JupyterLab."""
    nb = json.loads(raw)
    _no_build_settings(page["src"], metadata=nb.get("metadata", {}))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            _no_directive_tricks(page["src"], _source(cell))
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            cell["source"] = rewrite_links(site, page, _source(cell))
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = out.get("data", {})
            if "text/markdown" in data:
                md = data["text/markdown"]
                data["text/markdown"] = rewrite_links(site, page, "".join(md) if isinstance(md, list) else md)
            if WIDGET_VIEW in data and "text/html" not in data:
                out["data"] = {"text/html": WIDGET_NOTE, "text/plain": "live explorer: open in JupyterLab"}
                site.pages_with_notes = getattr(site, "pages_with_notes", 0) + 1
    return json.dumps(nb)


def _fence(text: str, least: int) -> str:
    """A run of backticks longer than any in ``text`` (and at least ``least``): the fence no text can close."""
    return "`" * max(least, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))


def _code(name: str) -> str:
    """``name`` (a file name from the repository: untrusted) as an inline code span it cannot close, so no text of it
    reaches the page as markup or HTML."""
    fence = _fence(name, 1)
    pad = " " if name.startswith("`") or name.endswith("`") else ""
    return f"{fence}{pad}{name}{pad}{fence}"


def _text(name: str) -> str:
    """``name`` as plain text in MyST: every ASCII punctuation mark backslash-escaped (CommonMark), so a ``<`` is
    shown, never parsed as HTML."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", name)


def _source_page(page: dict, text: str, site: Site) -> str:
    lang = LANGS.get(Path(page["src"]).suffix, "text")
    fence = _fence(text, 4)
    intro = ""
    if page["section"] == "Solutions":
        nb = next((p for p in site.pages if p["kind"] == "notebook" and
                   Path(p["src"]).stem[:2] == Path(page["src"]).stem[:2]), None)
        if nb is not None:
            link = posixpath.relpath(nb["staged"], posixpath.dirname(page["staged"]))
            intro = (f"The expected answers to the exercises of [{nb['title']}]({link}), as tested by "
                     f"`tests/test_solutions.py`: `{page['src']}`.\n\n")
    return (f"# {_text(page['title'])}\n\n{intro}{fence}{lang}\n{text.rstrip()}\n{fence}\n")


def _folder_page(site: Site, page: dict) -> str:
    rel = page["src"].rstrip("/")
    lines = [f"# {_code(rel + '/')}", ""]
    for p in sorted((site.root / rel).iterdir()):
        child = p.relative_to(site.root).as_posix()
        if unpublished_part(child) is not None:
            continue
        try:
            kind, _ = entry(site.root, child)
        except UntrackedError:  # listed by no link of its own: an untracked file is left out of the listing
            continue
        if kind is None:
            continue
        if CONTROL_IN_NAME.search(p.name):
            raise BookError(f"{child!r}: a file named with a line break or another control character cannot be listed "
                            f"on the site (it would start markup in the folder's page): rename it")
        lines.append(f"- {_code(p.name + ('/' if kind == 'dir' else ''))}")
    return "---\norphan: true\n---\n\n" + "\n".join(lines) + "\n"


def _toctrees(site: Site) -> str:
    out = []
    for section in SECTIONS[1:]:
        docs = [p["staged"].rsplit(".", 1)[0] for p in site.pages if p["section"] == section]
        if docs:
            out.append("```{toctree}\n:hidden:\n:caption: " + section + "\n\n" + "\n".join(docs) + "\n```\n")
    return "\n\n" + "\n".join(out)


def stage(site: Site, where: Path) -> None:
    """Write every page's source into Sphinx's source folder ``where``; pages linked from pages are added (and
    staged) as they are found."""
    done = 0
    while done < len(site.pages):
        page = site.pages[done]
        done += 1
        dest = where / page["staged"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        kind, src = page["kind"], page["src"]
        if kind == "folder":
            if entry(site.root, src.rstrip("/"))[0] != "dir":
                raise BookError(f"{src}: not published: not a folder inside the repository")
            dest.write_text(_folder_page(site, page))
        elif kind == "file":
            shutil.copyfile(repo_file(site.root, src), dest)
        elif kind == "notebook":
            dest.write_text(_notebook(site, page, repo_text(site.root, src)))
        elif kind == "source":
            dest.write_text(("---\norphan: true\n---\n\n" if not page["section"] else "")
                            + _source_page(page, repo_file(site.root, src).read_text(errors="replace"), site))
        else:
            raw = repo_text(site.root, src)
            _no_build_settings(src, raw)
            _no_directive_tricks(src, raw)
            text = rewrite_links(site, page, raw)
            if src == "README.md":
                text += _toctrees(site)
            elif not page["section"]:
                text = "---\norphan: true\n---\n\n" + text
            dest.write_text(text)


# ----------------------------------------------------------------------------------------------- the build


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
    static = {"_static/jupyterlab.css", "_static/theme-light.css", "_static/pygments.css", "_static/book.css",
              "_static/pages.json"}
    return outs | static if all(isinstance(o, str) for o in outs) else None


def site_folder(out, root: Path = ROOT):
    """The output folder, checked (unicache_lib.paths.output_folder): not empty, not the repository, above it or one
    of its folders, and holding nothing this builder did not write; raises :class:`BookError` saying what to do."""
    try:
        return output_folder(out, TOOL, option="--out", roots=(root, ROOT), legacy=earlier_site)
    except InputError as e:
        raise BookError(str(e)) from e


def sphinx(src: Path, out: Path, doctrees: Path, log) -> list[str]:
    """Sphinx's html builder over ``src`` with book/ as its configuration; returns its warnings."""
    from sphinx.cmd.build import build_main

    warnings = doctrees / "warnings.txt"
    code = build_main(["-b", "html", "-Q", "-E", "--keep-going", "-c", str(BOOK), "-d", str(doctrees / "doctrees"),
                       "-w", str(warnings), str(src), str(out)])
    lines = [" ".join(w.replace(str(src) + os.sep, "").split()) for w in warnings.read_text().splitlines()
             if w.strip()] if warnings.exists() else []
    refused = _refused(src)
    if refused:
        raise BookError(refused)
    if code != 0:
        raise BookError(f"Sphinx failed (exit {code}): " + ("; ".join(lines[:3]) or "see the output above"))
    return lines


def _refused(src: Path) -> str | None:
    """The paths pages named outside the staged course (book/_ext/course.py records them and never reads them), as
    the build's one-line error, or None."""
    course = sys.modules.get("course")
    if course is None or not getattr(course, "REFUSED", None):
        return None
    said = []
    for page, path in course.REFUSED:
        page = str(page).replace(str(src) + os.sep, "")
        said.append(f"{page}: {path!r}")
    return (f"{said[0]} leads outside the course (an include, literalinclude, image, download or :file: option): not "
            f"published; name a file inside the repository instead"
            + (f" (and {len(said) - 1} more: {'; '.join(said[1:4])})" if len(said) > 1 else ""))


def build(out, root: Path = ROOT, log=print) -> dict:
    """Build the site of the repository at ``root`` into ``out``; returns the build's record (seconds, bytes, pages).
    ``out`` must be new, empty or a site this builder wrote (:func:`site_folder`). The site is built in a temporary
    folder beside ``out`` first; only once Sphinx succeeded does it replace the earlier site (the files it wrote last
    time that this build does not write are removed, nothing else), so a failed build leaves the earlier site as it
    was."""
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    folder = site_folder(out, root)
    out = folder.path
    site = Site(root)  # the table of contents read (and checked) before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="unicache-book-"))
    private = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.building-"))
    tmp = private / "html"  # (#60 B2) Sphinx's outdir one level down: myst-nb writes the notebooks' output images to
    # outdir.parent / "jupyter_execute", which is then this build's own temporary folder, removed below (it used to
    # be --out's parent: ~/jupyter_execute for --out ~/site); book/_ext/course.py lets pages read only that folder
    try:
        stage(site, work / "src")
        warnings = sphinx(work / "src", tmp, work, log)
        for extra in (".buildinfo", ".buildinfo.bak", ".doctrees"):
            p = tmp / extra
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        for p in [*(tmp / "_static").rglob("*.map"), *(tmp / "_static").glob("*macros.html")]:
            p.unlink()  # the theme's source maps (3.4 MB: only a debugger reads them) and its template macros
        manifest = [{k: p[k] for k in ("src", "out", "title", "section", "kind")} for p in site.pages]
        (tmp / "_static").mkdir(exist_ok=True)
        (tmp / "_static" / "pages.json").write_text(json.dumps(manifest, indent=1))
        new = sorted(Path(os.path.relpath(os.path.join(top, f), tmp)).as_posix()
                     for top, _, files in os.walk(tmp) for f in files)
        _move_in(folder, tmp, new)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    for w in site.warnings + warnings:
        log(f"warning: {w}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    seconds = time.perf_counter() - t0
    record = {"seconds": round(seconds, 1), "megabytes": round(size / 1e6, 1), "pages": len(site.pages),
              "files": len(new), "cpu_seconds": round(time.process_time() - cpu0, 1), "cpu_count": os.cpu_count(),
              "warnings": len(site.warnings) + len(warnings)}
    log(f"built {len(site.pages)} pages into {out} ({record['megabytes']:.1f} MB) in {seconds:.1f} s; "
        f"open {out / 'index.html'} or serve it: .venv/bin/python -m http.server -d {out}")
    return record


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/book", help="the site's folder: new, empty or a site this builder wrote "
                    "(what it wrote last time is removed first, nothing else); default outputs/book")
    ap.add_argument("--ref", help="build from this git revision (e.g. HEAD: the committed files, whatever the working "
                                  "tree holds now) instead of the working tree")
    ap.add_argument("--record", help="write the build's time and size to this JSON file (data/results/book.json: "
                                     "docs/FORKING.md's numbers come from it)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        for name in ("ref", "record"):
            if getattr(args, name) is not None and not getattr(args, name).strip():
                raise BookError(f"--{name} is empty: name a {'git revision (e.g. HEAD)' if name == 'ref' else 'file'}, "
                                f"or leave --{name} out")
        if args.ref and args.ref.startswith("-"):
            raise BookError(f"--ref {args.ref!r}: a revision does not start with '-' (git would read it as an option): "
                            f"name a commit, branch or tag, e.g. --ref HEAD")
        site_folder(args.out, ROOT)  # refused before anything is read or extracted
        if args.record:
            record_refusal(Path(args.record))
        if args.ref:
            with tempfile.TemporaryDirectory() as tmp:
                got = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", args.ref, "--"],
                                     capture_output=True)
                if got.returncode != 0:
                    why = " ".join(got.stderr.decode(errors="replace").split()) or f"exit {got.returncode}"
                    raise BookError(f"--ref {args.ref!r}: git cannot read that revision ({why}): name a commit, branch "
                                    f"or tag of this repository, e.g. --ref HEAD")
                archive = got.stdout
                try:
                    tarfile.open(fileobj=io.BytesIO(archive)).extractall(tmp, filter="data")
                except tarfile.FilterError as e:  # a committed symlink that leaves the repository, an absolute path
                    raise BookError(f"{args.ref} holds {e.tarinfo.name!r}, which leads outside the repository "
                                    f"({type(e).__name__}): not published; remove it from the commit") from e
                record = build(args.out, Path(tmp))
        else:
            record = build(args.out, ROOT)
    except BookError as e:
        print(f"make book: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:  # a name too long, a full disk: one line, the earlier site as it was
        print(f"make book: error: {' '.join(str(e).split())}: nothing was replaced", file=sys.stderr)
        return 2
    if args.record:  # the whole command's time (with --ref: unpacking the commit too)
        record["seconds"] = round(time.perf_counter() - t0, 1)
        tmp = Path(args.record).with_name(f".{Path(args.record).name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, args.record)  # a new file, never written through a link
    return 0


RECORD_KEYS = {"seconds", "megabytes", "pages", "files", "cpu_seconds", "cpu_count", "warnings"}


def record_refusal(path: Path) -> None:
    """``--record`` replaces only an earlier build record (or writes a new file): never a file it did not write."""
    if not os.path.lexists(path):
        if not path.parent.is_dir():
            raise BookError(f"--record {path}: its folder does not exist")
        return
    if path.is_symlink() or not path.is_file():
        raise BookError(f"--record {path}: not a plain file (a link, a folder or a device): name a new file")
    try:
        earlier = json.loads(path.read_text(encoding="utf-8")) if path.stat().st_size < 100_000 else None
    except (UnicodeDecodeError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and set(earlier) <= RECORD_KEYS and "seconds" in earlier):
        raise BookError(f"--record {path}: this file is not an earlier build record, so it is not replaced; name a "
                        f"new file (e.g. data/results/book.json)")


if __name__ == "__main__":
    sys.exit(main())
