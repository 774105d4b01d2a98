"""Where a notebook's relative paths point: the repository root, wherever the kernel was started; and the one check
of every output folder (:func:`output_folder`, :func:`check_output_path`): never empty, never the repository or a
folder inside it but under its git-ignored ``outputs/`` (and ``runs/``), never a folder holding files the tool did not
write (its :data:`OUTPUT_MARKER` lists what it wrote, each file with its SHA-256 and size, and a file is removed or
replaced only while its content is what was recorded: a forged or older marker's word is not enough), never a file it
did not write (``files=``, :func:`record_output_files`). A notebook's ``OUT_DIR`` (:func:`notebook_output`) is new, empty or marked by a
notebook, since a notebook replaces and removes files there. Files inside a root are read through
:mod:`unicache_lib.core.untrusted` (the marker with :func:`~unicache_lib.core.untrusted.read_inside`)."""
import hashlib
import json
import os
import shlex
import stat
import sys
import tomllib
import warnings
from pathlib import Path

from .core.errors import InputError, InputTypeError, UnicacheError
from .core.untrusted import file_kind, name_problem, open_inside, read_inside, unlink_inside, write_inside

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
    p = Path(os.path.expanduser(path))
    if p.is_absolute():
        return p
    root = project_root()
    return p if root is None else root / p


# ----------------------------------------------------------------------------------------------- output folders

OUTPUT_MARKER = ".unicache-output"  # in a folder a tool writes: which tool, and the files it wrote there
NOTEBOOK = "a notebook"  # the tool a notebook's OUT_DIR marker names (notebook_output)
PACKAGE_REPO = Path(__file__).resolve().parents[1]  # the checkout this package runs from (when it is one)


def repository_roots(*extra: str | Path) -> list[Path]:
    """The repositories an output folder must stay clear of: ``extra`` (a tool's own root, a tree it builds from), the
    project around the current directory and the checkout this package was imported from."""
    return list(dict.fromkeys(r.resolve() for r in [Path(r) for r in extra] +
                              [r for r in (project_root(), project_root(PACKAGE_REPO)) if r is not None]))


def _eg(option: str) -> str:
    return f"e.g. {option} outputs/mine" if option.startswith("-") else f"e.g. {option}='outputs/mine'"


OUTPUT_AREAS = ("outputs", "runs")  # a repository's git-ignored folders the tools write into (.gitignore)


def _inside_repository(p: Path, r: Path, within=()) -> str:
    """Why output folder ``p`` (resolved) inside repository ``r`` is refused ("" when it is under one of
    :data:`OUTPUT_AREAS` or a folder of ``within``, repository-relative folders a tool rewrites on purpose)."""
    rel = p.relative_to(r)
    if rel.parts[0] in OUTPUT_AREAS or any(p.is_relative_to((r / w).resolve()) for w in within):
        return ""
    top = rel.parts[0]
    return (f"is the repository's own folder {top}/" if len(rel.parts) == 1 and (p.exists() or top.startswith("."))
            else f"is inside the repository {r} ({rel.as_posix()}/, in its {top}/)")


def output_path_refusal(path, option: str = "--out", tool: str = "this tool", roots=(),
                        within=()) -> tuple[Path | None, str]:
    """``(resolved folder, "")`` for an output folder ``path`` may name (relative: from the current directory), or
    ``(None, why and what to do)`` when it is empty, a file, the repository itself or a folder above it, any folder
    inside the repository but under its git-ignored :data:`OUTPUT_AREAS` (``outputs/``, ``runs/``) or a folder of
    ``within`` (repository-relative folders the tool rewrites on purpose, such as the shipped models), or a folder
    another tool's :data:`OUTPUT_MARKER` claims (a notebook's output folder, :data:`NOTEBOOK`, is shared: tools may add
    files there). Reads no file but that marker; creates nothing."""
    eg = _eg(option)
    if path is None or not str(path).strip():
        return None, f"is empty: name the folder {tool} writes to, {eg} (an empty value writes into the current folder)"
    p = Path(os.path.abspath(os.path.expanduser(str(path)))).resolve()  # (~nosuchuser stays as written, as in a shell)
    for r in repository_roots(*roots):
        if p == r or p in r.parents:
            what = f"the repository {r} itself" if p == r else f"a folder above the repository {r}"
            return None, f"is {what}: {tool} writes only to a folder of its own, {eg}"
        if p.is_relative_to(r):
            if (why := _inside_repository(p, r, within)):
                return None, (f"{why}: {tool} writes inside the repository only under outputs/ (or anywhere outside "
                              f"it), never over the repository's own files, {eg}")
    if p.exists() and not p.is_dir():
        return None, f"is a file ({p}), not a folder: choose a folder, {eg}"
    if os.path.lexists(p / OUTPUT_MARKER):
        by = (_marker(p) or {}).get("written_by")  # None: a damaged marker
        if by != tool and by != NOTEBOOK:
            return None, (f"holds the output of {by}, not of {tool}: choose another folder, {eg}" if isinstance(by, str)
                          else f"has a damaged {OUTPUT_MARKER}: delete the folder yourself if nothing in it is yours, "
                               f"or choose another, {eg}")
    return p, ""


def _marker(folder: Path) -> dict | None:
    """The folder's :data:`OUTPUT_MARKER` as read (a regular file inside it holding a JSON object with a text
    ``written_by`` and a list of texts ``files``), None when it is absent or damaged."""
    try:
        info = json.loads(read_inside(folder, OUTPUT_MARKER, links=False, limit=MARKER_LIMIT))
    except (UnicacheError, OSError, ValueError, RecursionError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("written_by"), str) \
        and isinstance(info.get("files"), list) and all(isinstance(f, str) for f in info["files"]) else None


MARKER_LIMIT = 64 << 20  # bytes of a marker read (a site lists a few thousand files)


def digest(data: bytes) -> dict:
    """What a marker records of a file a tool wrote: ``{"sha256": hex digest, "size": bytes}``."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _fd_digest(fd: int, sizes=None) -> dict | None:
    """:func:`digest` of the file open at ``fd``, read block by block; None at once when its size is not one of
    ``sizes`` (it cannot match)."""
    if sizes is not None and os.fstat(fd).st_size not in sizes:
        return None
    h, n = hashlib.sha256(), 0
    while block := os.read(fd, 1 << 20):
        h.update(block)
        n += len(block)
    return {"sha256": h.hexdigest(), "size": n}


def file_digest(folder, rel: str) -> dict | None:
    """:func:`digest` of the regular file ``folder/rel``, opened with no symbolic link on the way or at the end
    (:func:`~unicache_lib.core.untrusted.open_inside`, ``links=False``); None when it is missing, a link, a special
    file, outside the folder or unreadable."""
    try:
        fd = open_inside(folder, rel, links=False)
    except (UnicacheError, OSError):
        return None
    try:
        return _fd_digest(fd)
    finally:
        os.close(fd)


def _content(info: dict | None) -> dict[str, list[dict]]:
    """A marker's ``content``: for each file it lists, the contents (:func:`digest`) the tool recorded writing there
    (two while a write is under way: the earlier and the new); entries of another shape are dropped."""
    got = info.get("content") if isinstance(info, dict) else None
    return {rel: good for rel, ds in (got.items() if isinstance(got, dict) else ())
            if isinstance(rel, str) and (good := [{"sha256": d["sha256"], "size": d["size"]}
                                                  for d in (ds if isinstance(ds, list) else [])
                                                  if isinstance(d, dict) and isinstance(d.get("sha256"), str)
                                                  and len(d["sha256"]) == 64 and type(d.get("size")) is int])}


def _not_a_name(rel: str) -> bool:
    """True for a name no marker of ours holds: empty, absolute, with '..', a NUL byte, too long, the marker itself."""
    return (not rel or rel.startswith("/") or ".." in rel.split("/") or name_problem(rel) is not None
            or rel == OUTPUT_MARKER)


def _not_ours(folder: Path, rel: str, accepted: list[dict] | None, tool: str) -> str:
    """Why the file ``folder/rel``, which a marker lists, is not one ``tool`` may remove or replace ("" when its content
    is one the marker recorded, :func:`digest`)."""
    if os.path.islink(folder / rel):
        return f"{rel} is a symbolic link, and {tool} never writes one"
    if not accepted:
        return (f"{rel} is listed without its SHA-256 (an older {OUTPUT_MARKER}, or a run cut short), so {tool} cannot "
                f"tell it wrote it")
    return (f"{rel} is not a regular file inside the folder" if (d := file_digest(folder, rel)) is None
            else "" if d in accepted else f"{rel}'s content is not what {tool} recorded writing there")


def _written_by(info: dict | None, tool: str) -> set[str]:
    """The files a marker says ``tool`` wrote: its ``files`` when ``tool`` wrote the folder, else what ``tool`` added
    to another tool's folder (``also``)."""
    if info is None:
        return set()
    mine = info["also"].get(tool, []) if isinstance(info.get("also"), dict) else []
    return (set(info["files"]) if info["written_by"] == tool else set()) | {f for f in mine if isinstance(f, str)}


def _write_marker(folder: Path, info: dict) -> None:
    """Write ``info`` as the folder's :data:`OUTPUT_MARKER` (atomically: a temporary file renamed over it, never
    written through a symbolic link)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_inside(folder, OUTPUT_MARKER, (json.dumps(info, indent=1) + "\n").encode())


def record_output_files(folder, tool: str, data: dict) -> None:
    """Note in ``folder``'s :data:`OUTPUT_MARKER` that ``tool`` writes ``data`` there (name -> the bytes it writes), before
    it writes them: each name with the SHA-256 and size of those bytes (:func:`digest`), beside the content the name
    holds now when the marker recorded it (so a write cut short leaves either version recognised), for
    :func:`check_output_path`'s ``files``: a later call may replace a file whose content is one recorded here, nothing
    else. In the marker's ``files`` when the folder is ``tool``'s or has no marker yet, under ``also`` in a folder
    another tool (a notebook) marked."""
    folder = Path(folder)
    info = _marker(folder) if os.path.lexists(folder / OUTPUT_MARKER) else None
    names = {str(n) for n in data}
    if info is None:
        info = {"written_by": tool, "files": [], "note": f"{tool} overwrites only the files listed here, while their "
                "content is what it recorded"}
    if info["written_by"] == tool:
        info["files"] = sorted(set(info["files"]) | names)
    else:
        info["also"] = {**(info["also"] if isinstance(info.get("also"), dict) else {}),
                        tool: sorted(_written_by(info, tool) | names)}
    content = _content(info)
    for name, raw in data.items():
        now = file_digest(folder, str(name))
        content[str(name)] = [d for d in content.get(str(name), []) if d == now] + [digest(bytes(raw))]
    info["content"] = {k: content[k] for k in sorted(content)}
    _write_marker(folder, info)


def check_output_path(path, option: str = "--out", tool: str = "this tool", roots=(), within=(), files=()) -> Path:
    """The resolved folder ``path`` names, or :class:`InputError` in one line saying why not and what to do
    (:func:`output_path_refusal`). For a tool that writes into a folder without listing what it wrote. ``files``: the
    names the tool is about to write there; one that exists is refused unless the folder's marker says ``tool`` wrote
    it (:func:`record_output_files`, called as the tool writes them), so nothing it did not write is ever replaced."""
    p, why = output_path_refusal(path, option, tool, roots, within)
    if p is None:
        raise InputError(f"{option} {str(path)!r} {why}")
    if (there := [str(n) for n in files if os.path.lexists(p / str(n))]):
        info = _marker(p) if os.path.lexists(p / OUTPUT_MARKER) else None
        mine, content = _written_by(info, tool), _content(info)
        if (theirs := [n for n in there if n not in mine or _not_ours(p, n, content.get(n), tool)]):
            raise InputError(f"{option} {str(path)!r}: {', '.join(theirs)} {'is' if len(theirs) == 1 else 'are'} there "
                             f"already and {'is not a file' if len(theirs) == 1 else 'are not files'} {tool} wrote as "
                             f"it is now (its {OUTPUT_MARKER} lists what it wrote, with its SHA-256: a file of yours, "
                             f"one edited since, or one a run cut short left unrecorded): choose another name, or move "
                             f"the file away")
    return p


def cli_output_path(path, tool: str, option: str = "--out", roots=(), within=(), files=()) -> Path:
    """:func:`check_output_path` for a command line: a refusal is one line on stderr and exit status 2."""
    try:
        return check_output_path(path, option, tool, roots, within, files)
    except InputError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e


def claim_output_folder(path, tool: str, option: str = "--out", files=(), writes: str = "its outputs") -> Path:
    """For a command line that writes many files under one folder (replicate, the rehearsals, the stand-in builders):
    the folder ``path`` names, checked as :func:`cli_output_path` checks it (``files``: its own names it is about to
    write there), and new, empty or one an earlier run of ``tool`` marked; then created and marked as ``tool``'s (its
    :data:`OUTPUT_MARKER`), so a later run takes it again and no user's folder is ever written into. A refusal is one
    line on stderr and exit status 2, before anything is written."""
    out = cli_output_path(path, tool, option, files=files)
    if out.is_dir() and any(out.iterdir()) and (_marker(out) or {}).get("written_by") != tool:
        print(f"{tool}: error: {option} {str(path)!r} holds files {tool} did not write ({writes} would replace them): "
              f"choose a new or empty folder, or one {tool} wrote before" + (
                  f"; if an earlier version of {tool} made it (before it marked its folders), delete it (rm -r "
                  f"{shlex.quote(str(out))}) and run again" if any(out.is_relative_to(r / "outputs")
                                                                     for r in repository_roots()) else ""),
              file=sys.stderr)
        raise SystemExit(2)
    record_output_files(out, tool, {})  # the folder (made) is the tool's from now on
    return out


class OutputFolder:
    """A folder ``tool`` writes to, and what it wrote there (its :data:`OUTPUT_MARKER`); see :func:`output_folder`."""

    def __init__(self, path: Path, tool: str, files: set[str], content: dict | None = None):
        self.path, self.tool, self.files = path, tool, set(files)
        self.content = {k: list(v) for k, v in (content or {}).items()}  # rel -> contents recorded (digest)

    def _listed(self):
        """The listed files that are safely inside the folder (lexically, and their parent folder after symlinks)."""
        for rel in sorted(self.files):
            if _not_a_name(rel):
                continue
            p = self.path / rel
            try:
                p.parent.resolve().relative_to(self.path)
            except (ValueError, OSError, RuntimeError):
                continue
            yield rel, p

    def clean(self, keep=()) -> list[str]:
        """Remove every file the marker lists but ``keep`` (the files the tool has just written) whose content is still
        what the marker recorded (:func:`digest`), and the folders that leaves empty, then list only ``keep``, with
        their content now. A listed file whose content differs, or that is a symbolic link, a special file or outside
        the folder, is left where it is, named in one warning, and returned; nothing the marker does not list is
        touched."""
        keep = {str(k) for k in keep}
        folders, left = set(), []
        for rel, p in self._listed():
            if rel in keep or not os.path.lexists(p):
                continue
            differs = lambda fd, a=self.content.get(rel, []): not a or _fd_digest(fd, {d["size"] for d in a}) not in a  # noqa: E731
            try:
                gone = not os.path.islink(p) and unlink_inside(self.path, rel, keep=differs)
            except (UnicacheError, OSError):
                gone = False
            if gone:
                folders.update(q for q in p.parents if q != self.path and q.is_relative_to(self.path))
            else:
                left.append(rel)
        for d in sorted(folders, key=lambda q: len(q.parts), reverse=True):
            if d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
                d.rmdir()
        self.record(self.files & keep, wrote=self.files & keep)
        if left:
            warnings.warn(f"{self.tool} left {len(left)} file(s) in {self.path} that its {OUTPUT_MARKER} listed but that "
                          f"no longer hold what it wrote (e.g. {left[0]}): they are yours now; move them out or delete "
                          f"them yourself", stacklevel=2)
        return left

    def record(self, files, wrote=()) -> None:
        """Write the marker: this tool wrote ``files`` (paths relative to the folder) here, or is about to (list them
        first, so a run cut short leaves nothing unlisted). ``wrote``: those it has just written: their content now
        (SHA-256 and size, :func:`digest`) is recorded, and only a file whose content is recorded is ever removed or
        replaced later; the others keep what was recorded of them before."""
        self.files = {str(f) for f in files} - {OUTPUT_MARKER}
        fresh = {rel: file_digest(self.path, rel) for rel in {str(w) for w in wrote} & self.files}  # None: gone
        self.content = ({rel: ds for rel, ds in self.content.items() if rel in self.files and rel not in fresh}
                        | {rel: [d] for rel, d in fresh.items() if d is not None})
        _write_marker(self.path, {"written_by": self.tool, "files": sorted(self.files),
                                  "content": {k: self.content[k] for k in sorted(self.content)},
                                  "note": f"{self.tool} cleans and overwrites only the files listed here, while their "
                                          f"content is the one recorded"})

    def present(self) -> set[str]:
        """Every file (or link) under the folder now, the marker aside, relative to it."""
        return set(_entries(self.path)) - {OUTPUT_MARKER}


def _entries(folder: Path):
    """Relative paths of the files and links under ``folder`` (links to folders not followed), one at a time."""
    for top, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            yield Path(os.path.relpath(os.path.join(top, name), folder)).as_posix()


def output_folder(path, tool: str, option: str = "--out", roots=(), legacy=None, within=()) -> OutputFolder:
    """The folder ``path`` names, for ``tool`` to write to: :func:`check_output_path`'s refusals, then, where the
    folder exists and holds anything, it must be ``tool``'s own: its :data:`OUTPUT_MARKER` names ``tool``, names no
    path outside the folder, and every file in it is one the marker lists with the content it holds now (its SHA-256
    and size: a forged or edited marker that lists your file does not make it the tool's). ``legacy(folder)``: for a
    folder without a marker, the set of files an earlier version of ``tool`` wrote there, or None; such a folder is
    refused too (nothing recorded what it wrote), with a message that says so and how to proceed. Refused in one line
    that says what to do. Creates nothing; the caller :meth:`~OutputFolder.clean`\\ s what it wrote before and
    :meth:`~OutputFolder.record`\\ s what it writes."""
    p = check_output_path(path, option, tool, roots, within)
    if not p.exists():
        return OutputFolder(p, tool, set())
    gone = f"delete the folder (rm -r {shlex.quote(str(p))}) and run again, or choose another, {_eg(option)}"
    if os.path.lexists(p / OUTPUT_MARKER):
        # None: not a regular file inside the folder, not JSON, or not of the marker's shape
        if (info := _marker(p)) is None:
            raise InputError(f"{option} {str(path)!r} has a damaged {OUTPUT_MARKER}: if nothing in it is yours, {gone}")
        by, files = info["written_by"], info["files"]
        if (outside := next((f for f in files if _not_a_name(f)), None)) is not None:
            raise InputError(f"{option} {str(path)!r}: its {OUTPUT_MARKER} names {outside[:80]!r}, a path outside the "
                             f"folder that {tool} never writes, so the marker is not {tool}'s; nothing was removed. If "
                             f"nothing in it is yours, {gone}")
        owned = set(files) if by == tool else set()  # a notebook's folder (shared): none of its files are the tool's
        content = _content(info) if by == tool else {}
    else:
        if (first := next(_entries(p), None)) is None:
            return OutputFolder(p, tool, set())
        if legacy is not None and legacy(p) is not None:
            raise InputError(f"{option} {str(path)!r} looks like what an earlier version of {tool} wrote (no "
                             f"{OUTPUT_MARKER}), which recorded no SHA-256 of its files, so {tool} cannot tell them "
                             f"from yours: if nothing in it is yours, {gone}")
        raise InputError(f"{option} {str(path)!r} holds files {tool} did not write (e.g. {first}; no "
                         f"{OUTPUT_MARKER}): choose an empty or new folder, {_eg(option)}")
    foreign, differ, unrecorded = [], [], []
    for rel in _entries(p):
        if rel == OUTPUT_MARKER:
            continue
        if rel not in owned:
            foreign.append(rel)
        elif why := _not_ours(p, rel, content.get(rel), tool):
            (unrecorded if rel not in content else differ).append(why)
        if len(foreign) == 3:
            break
    if foreign:
        raise InputError(f"{option} {str(path)!r} holds files {tool} did not write ({', '.join(foreign)}): move them "
                         f"out or choose another folder")
    if differ:
        raise InputError(f"{option} {str(path)!r} holds files {tool} did not write ({differ[0]}"
                         f"{f', and {len(differ) - 1} more' if len(differ) > 1 else ''}): nothing was removed; move "
                         f"them out or choose another folder")
    if unrecorded:
        raise InputError(f"{option} {str(path)!r}: {unrecorded[0]}{f' (and {len(unrecorded) - 1} more)' if len(unrecorded) > 1 else ''}; "
                         f"nothing was removed. If nothing in it is yours, {gone}")
    return OutputFolder(p, tool, owned, content)


# ----------------------------------------------------------------------------------------------- a notebook's OUT_DIR


def notebook_output_refusal(path, option: str = "OUT_DIR") -> tuple[Path | None, str]:
    """``(resolved folder, "")`` when a notebook may use ``path`` as its output folder, else ``(None, why and what to
    do)``: :func:`output_path_refusal`'s refusals, and a folder that holds anything but has no :data:`OUTPUT_MARKER`
    made by a notebook (your home, /tmp, a folder of your files): a notebook replaces and removes files in its output
    folder (the stores it rewrites), so it takes only a new or empty folder or one a notebook marked
    (:func:`notebook_output`); a folder under the repository's outputs/ gets no exemption (one written before notebooks
    marked their folders is refused with the way to proceed: delete it and run again), and a notebook's folder holding
    a symbolic link anywhere inside, a hard link (a file with another name elsewhere), a FIFO or a device, is refused
    (its writes would follow it out, or hang). Reads only the folder's tree (never
    through a link) and its marker; creates nothing."""
    p, why = output_path_refusal(path, option, NOTEBOOK)
    if p is None or not p.exists():
        return p, why
    try:
        with os.scandir(p) as it:
            first = next((e.name for e in it), None)
    except OSError as e:
        return None, f"cannot be listed ({e.strerror or e}): choose another folder, {_eg(option)}"
    if first is None:
        return p, ""
    info = _marker(p) if os.path.lexists(p / OUTPUT_MARKER) else None
    if info is not None and info["written_by"] == NOTEBOOK:  # a notebook's: never with a link inside (its writes and
        # removals, plots.save, to_csv, remove_store of a sub-folder, would go where the link points)
        why = odd_entry(p, "no notebook")  # (a hard link: a file rewritten in place; a FIFO would hang)
        return (p, "") if not why else (None, why + f": a notebook writes and removes files in its {option}, never "
                                                    f"through a link: remove it (os.unlink), or choose another folder, "
                                                    f"{_eg(option)}")
    earlier = (f"; if an earlier run of a notebook made it (before notebooks marked their folders), delete it (rm -r "
               f"{shlex.quote(str(p))}) and run again" if any(p.is_relative_to(r / "outputs") for r in repository_roots())
               else "")
    return None, (f"holds files no notebook wrote (e.g. {first}) and no {OUTPUT_MARKER} made by a notebook: a notebook "
                  f"replaces and removes files in its {option} (the stores it rewrites), so it takes only a new or empty "
                  f"folder or one a notebook made, {_eg(option)}{earlier}")


def odd_entry(folder, who: str = "no tool") -> str:
    """Why a tool that writes and replaces files in ``folder`` must not ("" when its tree holds only folders and regular
    files of one name each): the first symbolic link, hard link (a file with another name elsewhere, which a write in
    place would change too), FIFO or device inside it, named and quoted. Never follows a link."""
    q = next((q for r, ds, fs in os.walk(folder) for n in ds + fs if os.path.islink(q := os.path.join(r, n))
              or n in fs and ((st := os.lstat(q)).st_nlink > 1 or not stat.S_ISREG(st.st_mode))), None)
    return ("" if q is None else f"holds a symbolic link, {q!r} (to {os.readlink(q)!r})" if os.path.islink(q) else
            f"holds {q!r}, {file_kind(os.lstat(q).st_mode)}, which {who} writes" if not stat.S_ISREG(os.lstat(q).st_mode)
            else f"holds {q!r}, a file with another name elsewhere (a hard link, as cp -al makes): rewritten in place, "
                 f"the other name would change too")


def notebook_output(path, option: str = "OUT_DIR") -> Path:
    """The folder ``path`` names, checked (:func:`notebook_output_refusal`; :class:`InputError` in one line otherwise),
    created and marked as a notebook's output folder (its :data:`OUTPUT_MARKER` names :data:`NOTEBOOK`), so a later
    run takes it again and no other tool's check mistakes it for one of yours."""
    p, why = notebook_output_refusal(path, option)
    if p is None:
        raise InputError(f"{option}={str(path)!r} {why}")
    mark_notebook_output(p)
    return p


def mark_notebook_output(folder) -> None:
    """Mark ``folder`` (created if need be) as a notebook's output folder, unchecked: for a caller that made the
    folder itself (a test's temporary folder); a marker a notebook already wrote is kept as it is."""
    folder = Path(folder)
    info = _marker(folder) if os.path.lexists(folder / OUTPUT_MARKER) else None
    if info is None or info["written_by"] != NOTEBOOK:
        _write_marker(folder, {"written_by": NOTEBOOK, "files": [], "note": "a notebook's output folder (OUT_DIR): "
                               "the notebooks write, replace and remove files here; other tools may add theirs"})
