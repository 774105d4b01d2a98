"""Exclusive writer locks held by the operating system (``flock``), so they cannot go stale: the OS
drops a lock when its holder exits, crashes or is killed, and a lock file left behind holds nothing.

One :class:`WriterLock` per lock file and process: a second request from the same process shares it
(the notebook that re-runs a cell is the same writer), a request from another process fails at once
with :class:`LockedError` naming the holder (pid, host, since when, command).

Linux and macOS (``fcntl``); on a file system without ``flock`` support (some network mounts) taking a
lock raises ``OSError`` from the OS rather than pretending to hold it.

A lock file sits in a folder someone may have shared: it is opened with ``O_NOFOLLOW | O_NONBLOCK`` and must be a
regular file, so a symbolic link planted under its name is never written through (the holder's pid and host would
overwrite the file it points to) and a FIFO never blocks; what a holder wrote is read as untrusted text.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from .core.errors import InputError, LockedError

_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK  # a link planted under a lock's name is refused, a FIFO never blocks


def _text(value, limit: int) -> str:
    """``value`` from a lock file as one line of at most ``limit`` characters (it is untrusted text)."""
    return " ".join(str(value).split())[:limit]


def describe(holder: dict) -> str:
    """``pid 123 on host x since 2026-11-30 12:00:01 UTC (python -m ...)`` from a lock file's content."""
    if not holder:
        return "another process (it has not written its name yet)"
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    except (TypeError, ValueError, OverflowError, OSError):
        since = "an unknown time"
    cmd = _text(holder.get("cmd", ""), 120)
    return (f"pid {_text(holder.get('pid', '?'), 20)} on host {_text(holder.get('host', '?'), 80)} since {since}"
            + (f" ({cmd})" if cmd else ""))


def read_holder(path: Path) -> dict:
    """What the holder wrote into the lock file ``path`` (``{}`` when it is not a regular file or holds no object)."""
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return {}
    try:
        data = os.read(fd, 1 << 16) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        holder = json.loads(data or b"{}")
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return holder if isinstance(holder, dict) else {}


_HELD: dict[str, "WriterLock"] = {}  # lock file (absolute path) -> the lock this process holds on it
# re-entrant: a Store dropped while this process takes a lock (the garbage collector can run inside acquire's mkdir or
# open) releases its own lock from __del__ on the same thread, which a plain Lock would wait for forever
_HELD_GUARD = threading.RLock()


class WriterLock:
    """An exclusive ``flock`` on ``path``, shared within this process (reference-counted).

    Use :func:`acquire` rather than the constructor. ``mutex`` serialises threads of this process that
    write through the same lock.
    """

    def __init__(self, path: Path, fd: int):
        self.path, self.fd, self.users = path, fd, 0
        self.pid = os.getpid()  # the process that took it; a forked child has another pid and holds nothing
        self.mutex = threading.RLock()

    def valid(self) -> bool:
        """True while the file we hold is still the one at ``path`` (not deleted or replaced)."""
        try:
            mine, there = os.fstat(self.fd), os.lstat(self.path)
            return self.fd >= 0 and (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
        except OSError:
            return False

    def release(self) -> None:
        """Drop one user; the OS lock is released when the last user of this process lets go."""
        with _HELD_GUARD:
            self.users -= 1
            if self.users <= 0:
                self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1
        if _HELD.get(str(self.path)) is self:
            del _HELD[str(self.path)]


def acquire(path, what: str, advice: str) -> WriterLock:
    """Take (or share, within this process) the exclusive lock on ``path``.

    Args:
        what: what the lock protects, for the error ("rank 0 of store runs/x").
        advice: what a refused user can do, appended to the error.
    Raises:
        LockedError: another process holds it; the message names the holder.
    """
    path = Path(os.path.abspath(path))
    with _HELD_GUARD:
        held = _HELD.get(str(path))
        if held is not None and held.valid():
            held.users += 1
            return held
        if held is not None:  # the file was removed (e.g. by remove_store in this process): start over
            held._close()
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
                raise InputError(f"lock file {path} is a symbolic link or special file: a lock is never taken through "
                                 f"one (it would write into what it points to). Remove it (os.unlink) and try "
                                 f"again") from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InputError(f"lock file {path} is not a regular file (a FIFO, device or folder): it is "
                                     f"never written. Remove it (os.unlink) and try again")
                if os.fstat(fd).st_nlink > 1:
                    raise InputError(f"lock file {path} has {os.fstat(fd).st_nlink} names (a hard link: the same file "
                                     f"may sit outside the folder under another name): it is never written. Remove "
                                     f"it (os.unlink) and try again")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = read_holder(path)
                raise LockedError(f"{what} is being written by {describe(holder)}. {advice}", holder) from None
            except BaseException:
                os.close(fd)
                raise
            lock = WriterLock(path, fd)
            if not lock.valid():  # removed between our open and our flock: take the new file instead
                os.close(fd)
                continue
            info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "cmd": " ".join(sys.argv)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            lock.users = 1
            _HELD[str(path)] = lock
            return lock
        raise LockedError(f"could not lock {path}: it was removed and re-created 10 times while we tried", {})


def _after_fork_in_child() -> None:
    """A forked child inherits its parent's lock descriptors and the table of held locks. Both are dropped in the
    child: its copies of the descriptors are closed (closing a copy leaves the parent's ``flock`` in place, but once
    the parent exits no living child keeps the lock held), and a child that asks for a lock asks the OS afresh, so
    while the parent holds it the child is refused instead of writing beside it."""
    global _HELD_GUARD
    for lock in list(_HELD.values()):
        if lock.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(lock.fd)
            lock.fd = -1
    _HELD.clear()
    _HELD_GUARD = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def held_here(path) -> WriterLock | None:
    """The lock this process holds on ``path``, if any."""
    lock = _HELD.get(os.path.abspath(path))
    return lock if lock is not None and lock.valid() else None


def holder_if_held(path) -> dict | None:
    """The holder (``pid``, ``host``, ``since``, ``cmd``) of the lock on ``path`` while some process holds it, else
    None. Probes with a non-blocking shared ``flock`` on a fresh descriptor, released at once; never waits."""
    path = Path(os.path.abspath(path))
    if held_here(path) is not None:
        return read_holder(path)
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return None  # no lock file (nobody ever wrote, or the folder is gone), or a link: no lock of ours
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(path) or {"pid": "?"}
    finally:
        os.close(fd)  # closing drops the probe's shared lock
    return None


def forget(path) -> None:
    """Release this process's lock on ``path`` whatever its user count (its file is being removed)."""
    with _HELD_GUARD:
        lock = _HELD.get(os.path.abspath(path))
        if lock is not None:
            lock._close()
