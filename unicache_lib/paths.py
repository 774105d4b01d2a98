"""Where a notebook's relative paths point: the repository root, wherever the kernel was started; files read from
inside a root (:func:`inside_regular_file`), and the one check of every output folder (:func:`output_folder`,
:func:`check_output_path`): never empty, never the repository's own folders, never a folder holding files the tool
did not write (its :data:`OUTPUT_MARKER` lists what it wrote)."""
import json
import os
import stat
import sys
import tempfile
import tomllib
from pathlib import Path

from .core.errors import InputError, InputTypeError, MissingFileError, UnicacheError

PROJECT_NAME = "unicache-workbench"  # [project] name in this repository's pyproject.toml


def project_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: the current directory) holding this
    project's ``pyproject.toml`` (its ``[project] name`` is ``unicache-workbench``; another
    project's pyproject is walked past), or ``None`` when there is none, e.g. the library installed
    and used from an unrelated folder."""
    here = Path.cwd() if start is None else Path(start).resolve()
    for folder in (here, *here.parents):
        toml = folder / "pyproject.toml"
        if not toml.is_file():
            continue
        try:
            name = tomllib.loads(toml.read_text()).get("project", {}).get("name")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if name == PROJECT_NAME:
            return folder
    return None


def project_path(path: str | Path) -> Path:
    """``path`` as the notebooks mean it: an absolute path unchanged; a relative one (``OUT_DIR =
    "outputs/02_understanding_maps"``, a store written by an earlier notebook) taken from the
    repository root, so ``make run`` (kernel in the root) and ``make lab`` (kernel in
    ``notebooks/``) read and write the same ``outputs/``. Outside the repository (no
    ``unicache-workbench`` pyproject.toml at or above the current directory) it is taken from the
    current directory, as ``Path(path)`` would be."""
    if path is None:
        raise InputTypeError("project_path needs a path (str or Path), got None: pass a folder such as 'outputs/x'")
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    root = project_root()
    return p if root is None else root / p


# ----------------------------------------------------------------------------------------------- reading inside a root


def _real_inside(root: str | Path, path: str | Path) -> tuple[Path, os.stat_result]:
    """``(real path, stat)`` of ``path`` (a relative one taken from ``root``) once every symlink is resolved, refused
    when that leaves ``root``; :class:`MissingFileError` when nothing is there (a dangling link included)."""
    root, p = Path(root), Path(path)
    p = p if p.is_absolute() else root / p
    try:
        real = p.resolve(strict=True)
        st = os.stat(real)  # stat, never open: a FIFO or a device is judged without blocking on it
    except FileNotFoundError as e:
        raise MissingFileError(f"{p}: nothing there (a missing file or a symlink to nothing)") from e
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python 3.11's resolve)
        raise InputError(f"{p} cannot be resolved ({e}): a symlink loop or an unreadable folder; remove it") from e
    if not real.is_relative_to(root.resolve()):
        raise InputError(f"{p} leads outside {root} (a symlink to {real}): only files inside it are read; remove the "
                         f"link or put the file itself there")
    return real, st


def inside_regular_file(root: str | Path, path: str | Path) -> Path:
    """The real path of ``path`` (absolute, or relative to ``root``) when it is a regular file inside ``root`` after
    every symlink is resolved, judged by ``stat`` before anything opens it. Raises :class:`InputError` for a symlink
    that leaves ``root``, a FIFO, device, socket or folder, and :class:`MissingFileError` when nothing is there."""
    real, st = _real_inside(root, path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path} is not a regular file ({_kind(st)}): only regular files are read; remove it")
    return real


def inside_folder(root: str | Path, path: str | Path) -> Path:
    """:func:`inside_regular_file` for a folder: its real path, refused when it (or a symlink on the way) leaves
    ``root`` or is not a folder."""
    real, st = _real_inside(root, path)
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path} is not a folder ({_kind(st)})")
    return real


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    return ("a folder" if stat.S_ISDIR(m) else "a FIFO" if stat.S_ISFIFO(m) else "a socket" if stat.S_ISSOCK(m)
            else "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m) else "a regular file" if stat.S_ISREG(m)
            else "a special file")


# ----------------------------------------------------------------------------------------------- output folders

OUTPUT_MARKER = ".unicache-output"  # in a folder a tool writes: which tool, and the files it wrote there
PACKAGE_REPO = Path(__file__).resolve().parents[1]  # the checkout this package runs from (when it is one)


def repository_roots(*extra: str | Path) -> list[Path]:
    """The repositories an output folder must stay clear of: ``extra`` (a tool's own root, a tree it builds from), the
    project around the current directory and the checkout this package was imported from."""
    roots = [Path(r) for r in extra] + [r for r in (project_root(), project_root(PACKAGE_REPO)) if r is not None]
    out = []
    for r in roots:
        r = r.resolve()
        if r not in out:
            out.append(r)
    return out


def _eg(option: str) -> str:
    return f"e.g. {option} outputs/mine" if option.startswith("-") else f"e.g. {option}='outputs/mine'"


def output_path_refusal(path, option: str = "--out", tool: str = "this tool", roots=()) -> tuple[Path | None, str]:
    """``(resolved folder, "")`` for an output folder ``path`` may name (relative: from the current directory), or
    ``(None, why and what to do)`` when it is empty, a file, the repository itself or a folder above it, one of the
    repository's own top-level folders (``docs/``, ``notebooks/``, ``data/``, ``unicache_lib/``, ``tests/`` ...;
    ``outputs/`` is the tools' own), or a folder another tool's :data:`OUTPUT_MARKER` claims. Reads no file but
    that marker; creates nothing."""
    eg = _eg(option)
    if path is None or not str(path).strip():
        return None, f"is empty: name the folder {tool} writes to, {eg} (an empty value writes into the current folder)"
    p = Path(os.path.abspath(Path(str(path)).expanduser())).resolve()
    for r in repository_roots(*roots):
        if p == r or p in r.parents:
            what = f"the repository {r} itself" if p == r else f"a folder above the repository {r}"
            return None, f"is {what}: {tool} writes only to a folder of its own, {eg}"
        if p.parent == r and p.name != "outputs" and (p.exists() or p.name.startswith(".")):
            return None, f"is the repository's own folder {p.name}/: {tool} writes only to a folder of its own, {eg}"
    if p.exists() and not p.is_dir():
        return None, f"is a file ({p}), not a folder: choose a folder, {eg}"
    if os.path.lexists(p / OUTPUT_MARKER):
        try:
            by = json.loads(Path(inside_regular_file(p, OUTPUT_MARKER)).read_text())["written_by"]
        except (UnicacheError, OSError, ValueError, KeyError, TypeError):
            by = None
        if by != tool:
            return None, (f"holds the output of {by}, not of {tool}: choose another folder, {eg}" if isinstance(by, str)
                          else f"has a damaged {OUTPUT_MARKER}: delete the folder yourself if nothing in it is yours, "
                               f"or choose another, {eg}")
    return p, ""


def check_output_path(path, option: str = "--out", tool: str = "this tool", roots=()) -> Path:
    """The resolved folder ``path`` names, or :class:`InputError` in one line saying why not and what to do
    (:func:`output_path_refusal`). For a tool that writes into a folder without listing what it wrote."""
    p, why = output_path_refusal(path, option, tool, roots)
    if p is None:
        raise InputError(f"{option} {str(path)!r} {why}")
    return p


def cli_output_path(path, tool: str, option: str = "--out", roots=()) -> Path:
    """:func:`check_output_path` for a command line: a refusal is one line on stderr and exit status 2."""
    try:
        return check_output_path(path, option, tool, roots)
    except InputError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e


class OutputFolder:
    """A folder ``tool`` writes to, and what it wrote there (its :data:`OUTPUT_MARKER`); see :func:`output_folder`."""

    def __init__(self, path: Path, tool: str, files: set[str]):
        self.path, self.tool, self.files = path, tool, set(files)

    def _listed(self):
        """The listed files that are safely inside the folder (lexically, and their parent folder after symlinks)."""
        for rel in sorted(self.files):
            r = Path(rel)
            if not rel or r.is_absolute() or ".." in r.parts or rel == OUTPUT_MARKER:
                continue
            p = self.path / r
            try:
                p.parent.resolve().relative_to(self.path)
            except (ValueError, OSError, RuntimeError):
                continue
            yield rel, p

    def clean(self, keep=()) -> None:
        """Remove every file the marker lists but ``keep`` (a link itself, never what it points to) and the folders
        that leaves empty, then list only what was kept; nothing the marker does not list is touched."""
        keep = {str(k) for k in keep}
        folders = set()
        for rel, p in self._listed():
            if rel in keep:
                continue
            if p.is_symlink() or p.is_file():
                p.unlink()
                folders.update(q for q in p.parents if q != self.path and q.is_relative_to(self.path))
        for d in sorted(folders, key=lambda q: len(q.parts), reverse=True):
            if d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
                d.rmdir()
        self.record(self.files & keep)

    def record(self, files) -> None:
        """Write the marker: this tool wrote ``files`` (paths relative to the folder) here."""
        self.files = {str(f) for f in files} - {OUTPUT_MARKER}
        self.path.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"written_by": self.tool, "files": sorted(self.files),
                           "note": f"{self.tool} cleans and overwrites only the files listed here"}, indent=1)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f"{OUTPUT_MARKER}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data + "\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path / OUTPUT_MARKER)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def present(self) -> set[str]:
        """Every file (or link) under the folder now, the marker aside, relative to it."""
        return set(_entries(self.path)) - {OUTPUT_MARKER}


def _entries(folder: Path):
    """Relative paths of the files and links under ``folder`` (links to folders not followed), one at a time."""
    for top, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            yield Path(os.path.relpath(os.path.join(top, name), folder)).as_posix()


def output_folder(path, tool: str, option: str = "--out", roots=(), legacy=None) -> OutputFolder:
    """The folder ``path`` names, for ``tool`` to write to: :func:`check_output_path`'s refusals, then, where the
    folder exists and holds anything, it must be ``tool``'s own: its :data:`OUTPUT_MARKER` names ``tool`` and every
    file in it is one the marker lists. ``legacy(folder)``: for a folder without a marker, the set of files an
    earlier version of ``tool`` wrote there, or None when it is not such a folder. Refused in one line that says what
    to do: a folder another tool wrote, one holding files ``tool`` did not write. Creates nothing; the caller
    :meth:`~OutputFolder.clean`\\ s what it wrote before and :meth:`~OutputFolder.record`\\ s what it writes."""
    p = check_output_path(path, option, tool, roots)
    if not p.exists():
        return OutputFolder(p, tool, set())
    marker = p / OUTPUT_MARKER
    if os.path.lexists(marker):
        try:
            info = json.loads(Path(inside_regular_file(p, OUTPUT_MARKER)).read_text())
            by, files = info["written_by"], info["files"]
            if not isinstance(by, str) or not isinstance(files, list) or not all(isinstance(f, str) for f in files):
                raise InputError("wrong types")
        except (UnicacheError, OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{option} {str(path)!r} has a damaged {OUTPUT_MARKER} ({type(e).__name__}): delete the "
                             f"folder yourself if nothing in it is yours, or choose another") from e
        owned = set(files)
    else:
        first = next(_entries(p), None)
        if first is None:
            return OutputFolder(p, tool, set())
        owned = legacy(p) if legacy is not None else None
        if owned is None:
            raise InputError(f"{option} {str(path)!r} holds files {tool} did not write (e.g. {first}; no "
                             f"{OUTPUT_MARKER}): choose an empty or new folder, {_eg(option)}")
    foreign = []
    for rel in _entries(p):
        if rel != OUTPUT_MARKER and rel not in owned:
            foreign.append(rel)
            if len(foreign) == 3:
                break
    if foreign:
        raise InputError(f"{option} {str(path)!r} holds files {tool} did not write ({', '.join(foreign)}): move them "
                         f"out or choose another folder")
    return OutputFolder(p, tool, owned)
