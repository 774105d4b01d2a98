"""Text and paths that come from a reader's data: the one place each is made safe.

A samples folder, a prompts file, a store's index or a decisive run's shard is untrusted input. Three rules, each with
one helper here, used wherever such input is read or shown:

- a path read from data names a file *inside* the folder it came from, and a regular one: no ``..``, no absolute
  path, no symlink that leaves the folder, no FIFO or device, and a file opened for writing has one name (no hard
  link that may sit outside); one family does it, lstat by lstat with every part
  opened with O_NOFOLLOW (:func:`open_inside`, :func:`read_inside`, :func:`write_inside`, :func:`folder_inside`,
  :func:`unlink_inside`; :func:`stat_inside` and :func:`path_inside` judge without opening);
- text from data that meets HTML is escaped (:func:`html_text`), quotes included, so it can sit in an attribute;
- a text file from data is decoded as UTF-8 with a refusal that names the file and the line (:func:`read_utf8`).

Matplotlib text from data is drawn with math text off (``parse_math=False``), so a label such as ``$\\frac{$`` is
shown as typed instead of failing the figure.
"""
import contextlib
import errno
import html
import json
import os
import posixpath
import secrets
import stat
from pathlib import Path

from .errors import InputError, MissingFileError, UnicacheError


def html_text(text) -> str:
    """``text`` (anything: ``str()`` is taken) escaped for HTML, quotes included: safe in an element or an attribute."""
    return html.escape(str(text), quote=True)


def iframe_srcdoc(page: str, height: int = 500) -> str:
    """An ``<iframe>`` showing the HTML document ``page`` inline (``srcdoc``): the whole page escaped as the attribute's
    value, so the frame receives it exactly as written (its own escaping intact) and nothing of it runs outside."""
    return f'<iframe srcdoc="{html_text(page)}" width="100%" height="{int(height)}"></iframe>'


class RepeatedKeyError(InputError):
    """A JSON object that names one key twice (a reader keeps the last, silently): raised by :func:`json_loads`."""


def _one_of_each(pairs: list) -> dict:
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise RepeatedKeyError(f"the key {k!r} is written twice in one object (which one is meant?)")
        seen.add(k)
    return dict(pairs)


def json_loads(text):
    """``json.loads`` for text from data: an object naming a key twice is refused (:class:`RepeatedKeyError`) instead
    of keeping the last value."""
    return json.loads(text, object_pairs_hook=_one_of_each)


def read_utf8(path: str | Path) -> str:
    """The text of ``path`` decoded as UTF-8; a file in another encoding is refused naming the file and the line."""
    return decode_utf8(Path(path).read_bytes(), path)  # (decode_utf8 names it as a Path)


def decode_utf8(data: bytes, path) -> str:
    """``data`` (the bytes of ``path``) decoded as UTF-8; refused naming the file and the line otherwise."""
    path = Path(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(f"{path}, line {line}: not UTF-8 (byte {data[e.start]:#04x} at offset {e.start}): save the "
                         f"file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path.name} > fixed && mv fixed "
                         f"{path.name}`") from e


# ---- opening a file named by data: inside its folder, a regular file, a name that can exist ---------------------------
# The rule of :func:`inside`, enforced where the file is opened: every part of the path is looked at with lstat
# (never followed blindly), the file is opened through descriptors of its folders with O_NOFOLLOW, so a part swapped
# for a symlink between the look and the open is refused too, and a FIFO, device, socket or folder is refused before
# it is opened (a FIFO named like an index would hang the reader, a link to /dev/zero would fill memory). Writes never
# go through a symbolic link, even one that stays inside. Each refusal is one line naming the file and the reason.
NAME_MAX, PATH_MAX = 255, 4096  # bytes: one part of a path, a whole path (Linux)
_MAX_LINKS = 40  # symbolic links followed in one path before it is called a loop (the kernel's MAXSYMLINKS)
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _Refused(UnicacheError):
    """Internal, never escapes: why a path is refused (turned into the caller's error class by :func:`_fail`)."""


def name_problem(name) -> str | None:
    """Why no file can have the path ``name`` (a reason to follow the name in a sentence), or ``None``: not a path,
    empty, a NUL byte, a part longer than :data:`NAME_MAX` bytes or a whole longer than :data:`PATH_MAX`."""
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(name, str):
        return f"is not a path but a {type(name).__name__}"
    if not name:
        return "is empty"
    if "\x00" in name:
        return "holds a NUL byte, which no file name can hold"
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:
        return "holds a lone surrogate, which no file name can be encoded with"
    longest = max(len(p) for p in raw.split(b"/"))
    return (f"is too long to be a file name ({longest} bytes in its longest part, {len(raw)} in all; a file system "
            f"takes {NAME_MAX} a part and {PATH_MAX - 1} in all)" if longest > NAME_MAX or len(raw) >= PATH_MAX else None)


def file_kind(mode: int) -> str:
    """``"a regular file"``, ``"a folder"``, ``"a FIFO (named pipe)"``, ... for an ``st_mode``."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def _shown(rel) -> str:
    return repr(rel) if not isinstance(rel, str) or len(rel) <= 80 else f"{rel[:60]!r}... ({len(rel)} characters)"


def _fail(error, what: str, base, rel, reason: str, fix: str):
    """Raise ``error`` with one line: what, the name, where, the reason, the fix."""
    err = error(f"{what} {_shown(rel)} in {base} {reason}" + (f". {fix}" if fix else ""))  # the caller's class
    raise err from None


def _link_reason(root: str, here: str, sub: str, write: bool, links: bool) -> tuple[str, str | None]:
    """(why the symlink ``here`` is refused, or "" when it may be followed; its target resolved inside root)."""
    target = os.readlink(here)
    try:
        os.stat(here)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{sub} a symbolic link loop (it never reaches a file)", None
    real = os.path.realpath(os.path.join(os.path.dirname(here), target))
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        return f"{sub} a symbolic link to {target}, which points outside the folder: it is never followed", None
    return ((f"{sub} a symbolic link (to {target}): nothing is ever written through a symbolic link", None) if write
            else (f"{sub} a symbolic link (to {target}), and links are not followed here", None) if not links
            else ("", real))


def _walk(base, rel, write: bool, links: bool) -> tuple[str, list[str], os.stat_result | None]:
    """``(root, parts, st)``: ``base`` resolved, the parts of ``rel`` below it with the symlinks it may follow
    resolved, and the lstat of the last part (``None``: it does not exist; the parts past the first missing one
    follow it unresolved)."""
    why = name_problem(rel)
    if why:
        raise _Refused(why)
    rel = os.fspath(rel)
    if rel.startswith("/") or ".." in rel.split("/"):
        raise _Refused("points outside the folder (an absolute path or '..'): only files inside it are opened"
                       if rel.startswith("/") or posixpath.normpath(rel).startswith("..") else "holds '..' (it comes "
                       "back inside, but a path through a parent folder is never followed): write it without '..'")
    root = os.path.realpath(base)
    todo = [p for p in rel.split("/") if p not in ("", ".")]
    parts: list[str] = []
    hops = 0
    while todo:
        name = todo.pop(0)
        here = os.path.join(root, *parts, name)
        sub = "is" if not todo and not hops else f"passes through {'/'.join(parts + [name])},"
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return root, parts + [name] + todo, None
        except OSError as e:
            raise _Refused(f"cannot be looked at ({e.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            why, real = _link_reason(root, here, sub, write, links)
            hops += 1
            if why or hops > _MAX_LINKS:
                raise _Refused(why or f"{sub} a symbolic link loop (it never reaches a file)")
            parts, todo = [], [p for p in os.path.relpath(real, root).split(os.sep) if p not in ("", ".")] + todo
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"passes through {'/'.join(parts + [name])}, which is {file_kind(st.st_mode)}, not a folder")
        parts.append(name)
    if not parts:  # no part left (".", "./"), or a link back to the folder itself
        raise _Refused("names the folder itself, not a file in it")
    return root, parts, st


def _folder_fd(root: str, parts: list[str], create: bool) -> int:
    """A descriptor of the folder ``root/parts``, every part opened with O_NOFOLLOW (created when missing and
    ``create``)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for p in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p, 0o777, dir_fd=fd)
                    with contextlib.suppress(OSError):  # (a file system that cannot sync a folder: as before)
                        os.fsync(fd)  # the new folder's name durable in its parent (a power cut keeps it)
            fd, parent = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(parent)
    except FileNotFoundError:
        os.close(fd)
        raise _Refused("is missing") from None
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused("changed while it was opened (a part of it became a symbolic link or a file)") from None
        raise _Refused(f"cannot be opened ({e.strerror})") from None
    return fd


def stat_inside(base, rel, *, links: bool = True, write: bool = False, error=InputError, what: str = "file",
                fix: str = "") -> os.stat_result | None:
    """The lstat of the file ``base/rel`` checked as :func:`open_inside` checks it, without opening it; ``None`` when it
    does not exist. Raises ``error`` (one line: what, the name, the reason, ``fix``) when the name cannot exist, leaves
    ``base``, passes through a symbolic link it may not follow, or is not a regular file."""
    try:
        _, _, st = _walk(base, rel, write, links and not write)
        _refuse_unless_file(st, write)
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    return st



def path_inside(base, rel, *, folder: bool = False, error=InputError, what: str = "file", fix: str = "") -> Path:
    """The real path of ``base/rel`` once the symbolic links inside ``base`` are followed (the walk of
    :func:`open_inside`, judged by lstat without opening anything), when it is a regular file (``folder``: a folder).
    Raises ``error`` as :func:`stat_inside` does, and :class:`MissingFileError` when nothing is there (a dangling link
    included). For a caller that hands the path on (a site that publishes it); one that reads should open it with
    :func:`open_inside` / :func:`read_inside`."""
    try:
        root, parts, st = _walk(base, rel, False, True)
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    if st is None:
        _fail(MissingFileError, what, base, rel, "is not there (a missing file or a symbolic link to nothing)", fix)
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        _fail(error, what, base, rel, f"is {file_kind(st.st_mode)}, not a {'folder' if folder else 'regular file'}",
              fix)
    return Path(root, *parts)

def _refuse_unless_file(st, write: bool = False, fd: int | None = None) -> None:
    """Raise :class:`_Refused` (closing ``fd`` first) when the stat ``st`` is not a regular file, or is one opened for
    writing that has several names (a hard link); nothing when ``st`` is None (no file there)."""
    why = "" if st is None else (
        f"is {file_kind(st.st_mode)}, not a {'file' if stat.S_ISDIR(st.st_mode) else 'regular file'}: it is never "
        "opened" if not stat.S_ISREG(st.st_mode) else
        f"has {st.st_nlink} names (a hard link: the same file may sit outside the folder under another name): it is "
        f"never written through; copy it (cp, not ln) or remove this name (os.unlink)" if write and st.st_nlink > 1
        else "")
    if why:
        if fd is not None:
            os.close(fd)
        raise _Refused(why)


def open_inside(base, rel, flags: int = os.O_RDONLY, mode: int = 0o644, *, links: bool = True, error=InputError,
                what: str = "file", fix: str = "") -> int:
    """An OS descriptor (the caller closes it) of the regular file ``base/rel``: a path read from data, opened only when
    it names a file that can exist, inside ``base`` after every symlink is resolved, and regular (a FIFO, device, socket
    or folder is refused before it is opened). ``links=False`` refuses every symbolic link on the way; a write
    (``flags`` with O_WRONLY, O_RDWR, O_CREAT, O_APPEND or O_TRUNC) always does, so nothing is written through one.
    The folders are opened one by one with O_NOFOLLOW and the file with O_NOFOLLOW | O_NONBLOCK, then checked again
    with fstat, so a part swapped in between is refused too. Raises ``error`` with one line: ``what``, the name, the
    reason, then ``fix``."""
    write = bool(flags & _WRITES)
    try:
        root, parts, st = _walk(base, rel, write, links and not write)
        if st is None and not flags & os.O_CREAT:
            raise _Refused("is missing")
        _refuse_unless_file(st, write)
        dfd = _folder_fd(root, parts[:-1], create=False)
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=dfd)
        except FileNotFoundError:
            raise _Refused("is missing") from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
                raise _Refused("changed while it was opened (it became a symbolic link or a special file)") from None
            raise _Refused(f"cannot be opened ({e.strerror})") from None
        finally:
            os.close(dfd)
        _refuse_unless_file(os.fstat(fd), write, fd)
        return fd
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)


def read_inside(base, rel, *, offset: int = 0, links: bool = True, limit: int | None = None, error=InputError,
                what: str = "file", fix: str = "") -> bytes:
    """The bytes of the regular file ``base/rel`` from ``offset`` on, opened by :func:`open_inside` (same checks).
    ``limit``: the most bytes such a file can hold; a bigger one (a sparse file grown by ``truncate`` reads as gigabytes
    of zeros) is refused in one line from its size, before a byte is read, and never more than ``limit`` bytes are
    read (a file that grows meanwhile is refused too)."""
    fd = open_inside(base, rel, links=links, error=error, what=what, fix=fix)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size - offset
        if limit is not None and size > limit:
            _fail(error, what, base, rel, too_big(size + offset, limit), fix)
        f.seek(offset)
        data = f.read() if limit is None else f.read(limit + 1)  # one byte past the limit: a file that grew meanwhile
        if limit is not None and len(data) > limit:
            _fail(error, what, base, rel, too_big(len(data) + offset, limit), fix)
        return data


def unlink_inside(base, rel, keep=None, *, error=InputError, what: str = "file", fix: str = "") -> bool:
    """Remove the regular file ``base/rel``, found as :func:`open_inside` finds it with ``links=False`` (no symbolic
    link on the way or at the end: a link is never removed or followed), through a descriptor of its folder; True when
    it was removed. ``keep(fd)``: given a read descriptor of the file, True to leave it where it is (its content is not
    what the caller may remove); the name is removed only while it still is that file (same device and inode).
    Raises ``error`` (one line) when the name cannot exist, leaves ``base``, passes through a link, or is not a
    regular file; a missing file is False."""
    try:
        root, parts, st = _walk(base, rel, False, False)
        if st is None:
            return False
        _refuse_unless_file(st)
        dfd = _folder_fd(root, parts[:-1], create=False)
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise _Refused("changed while it was opened (it became a symbolic link or a special file)"
                           if e.errno in (errno.ELOOP, errno.ENXIO) else f"cannot be opened ({e.strerror})") from None
        try:
            fst = os.fstat(fd)
            _refuse_unless_file(fst)
            if keep is not None and keep(fd):
                return False
            now = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (fst.st_dev, fst.st_ino):
                raise _Refused("changed while it was looked at (another file took its name): it was left alone")
            os.unlink(parts[-1], dir_fd=dfd)
            return True
        finally:
            os.close(fd)
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    finally:
        os.close(dfd)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def too_big(size: int, limit: int) -> str:
    """Why a file of ``size`` bytes is refused where at most ``limit`` fit (a reason to follow its name)."""
    return (f"is {_size(size)} ({size} bytes), more than the {_size(limit)} such a file can hold: it is never read "
            f"(a damaged file, or one grown by truncate into gigabytes of zeros)")


def folder_inside(base, rel: str, *, create: bool = False, error=InputError, what: str = "folder",
                  fix: str = "") -> Path:
    """``base/rel``, a real folder inside ``base`` (no symbolic link on the way, every part a folder), created with its
    parents when missing and ``create``. Raises ``error`` (one line) otherwise."""
    try:
        root, parts, st = _walk(base, rel, True, False)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"is {file_kind(st.st_mode)}, not a folder")
        if st is None and not create:
            raise _Refused("is missing")
        os.close(_folder_fd(root, parts, create))
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    return Path(base) / rel


def write_inside(base, rel: str, data: bytes, *, error=InputError, what: str = "file", fix: str = "") -> Path:
    """Write ``data`` to ``base/rel`` atomically and durably: a temporary file ``.NAME.XXXXXXXX.tmp`` beside it (created
    with O_EXCL | O_NOFOLLOW), fsync'd, mode 0644, renamed over the name, the folder fsync'd. The folders are checked and created as by
    :func:`folder_inside`; an existing ``rel`` that is not a regular file (a link, FIFO, folder) is refused, so nothing
    is written through a symbolic link. Returns ``base/rel``."""
    try:
        root, parts, st = _walk(base, rel, True, False)
        _refuse_unless_file(st)  # a name with several links is replaced by the rename, never written through
        dfd = _folder_fd(root, parts[:-1], create=True)
    except _Refused as e:
        _fail(error, what, base, rel, str(e), fix)
    name = parts[-1]
    tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.fchmod(fd, 0o644)  # stored files are meant to be shared, whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        with contextlib.suppress(OSError):  # (a file system that cannot sync a folder: as before)
            os.fsync(dfd)  # the rename durable: a line committed after it never names a file a power cut took back
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    finally:
        os.close(dfd)
    return Path(base) / rel
