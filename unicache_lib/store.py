"""A sharded, append-only store of capture records.

Layout of a store directory::

    meta.json                       model id, dtype, library version (written once, checked after)
    index-rank00000.jsonl           the chunks one writer (rank) has committed: an append-only log, a line each
    rank00000/chunk000000/L0003_language.npz   one compressed file per layer and chunk

Every write is one *chunk*: its layer files are written to temporary names and renamed into place, then one line
listing its records is appended to the rank's index and fsync'd. That line is the commit. A write interrupted
before it leaves the previous store intact: an orphaned chunk folder is ignored (``verify`` reports it), and a write
cut off inside the line leaves a torn last line (no newline at its end) that readers ignore as an interrupted write
and the rank's next write (or :meth:`Store.repair`) cuts off. A record key (sample, part, layer, step) can be written
once: writing it again raises instead of silently overwriting, and ``missing`` tells a resumed capture what is left
to do. Several processes (``torchrun`` / ``accelerate launch`` ranks) write their own index and folders; readers
merge all indexes and refuse duplicates.

Each line is a JSON array ``[head, records]``: the head holds the chunk's record keys, capture mode and folder
(``{"keys": ["7|language|3|-1", ...], "mode": "stats", "chunk": "rank00000/chunk000007"}``), ``records`` one entry
per record (its file, slot, checksum, spans, ...). :meth:`Store.drop` appends ``[{"drop": [keys]}, []]``. A
:class:`Store` keeps the heads of every rank's log in memory and, on each call, reads only the bytes a log gained
since it last looked (by byte offset); a line's records are parsed when one of them is read. So appending a chunk
costs the same at the 100,000th record as at the first, and opening a large store reads only the heads (a log
written before heads named their chunk is parsed once, to learn which line owns which chunk). Why a log and not
SQLite: the store stays plain files that readers only read (a copy on a read-only or shared mount reads; no database
locks beside the writer's OS lock, no connection to reopen after a fork), a commit is one atomic step (an fsync'd
line), and the index is text a person can read and mend.

One writer per rank: the first write takes an exclusive OS lock (``.lock-rank00000``, see :mod:`unicache_lib.locks`)
held until :meth:`Store.close` (or the object is dropped, or the process ends or crashes); a second process writing
the same rank is refused with the holder's pid, host and start time. :func:`remove_store` deletes a store only when
no other process writes to it.

Damage: :meth:`Store.damaged` lists records whose file is missing or fails its checksum; reading other records keeps
working; :meth:`Store.repair` drops the damaged records from the index (their files are kept, renamed ``*.damaged``)
and removes leftovers of interrupted writes, so :meth:`Store.missing` reports those samples and a resumed capture
recaptures them.

A store someone shared is untrusted input (see :mod:`unicache_lib.core.untrusted`). Every file the store opens, writes
or removes -- lock, index, ``meta.json``, rank and chunk folders, chunk and temporary files -- is checked inside the
store folder first: a symbolic link is never followed or written through (a store never makes one), a FIFO or device
is refused before it is opened, a name no file can have is refused as such; each in one line. A line's records must
name files of the chunk folder that line wrote (the first line naming a folder owns it): a hand-appended line that
aliases another line's record, or an entry whose checksum is not its file's, is refused when read, reported by
:meth:`Store.verify` and dropped by :meth:`Store.repair`, which never drops a record that a sound line names nor
renames a sound file.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .capture.record import Record
from .core.errors import InputError, InputTypeError, MissingFileError, StoreError, StoreLockedError
from .core.modality import Spans
from .core.untrusted import (file_kind, folder_inside, name_problem, open_inside, read_inside, stat_inside,
                             write_inside)
from .locks import LockedError, acquire, describe, forget, held_here, holder_if_held

FORMAT = 1


_ENTRY_KEYS = {"key", "sample", "part", "layer", "step", "file", "slot", "arrays", "mode", "heads", "seq_len",
               "query_stride", "key_stride", "spans"}  # every field Store.write gives an entry ("meta", "sha256" too)
_MAX_POSITIONS = 1 << 24  # spans longer than any sequence a model takes: a hand-edited index, never expanded
_LOCK_ADVICE = ("Wait for it to finish or stop it (a JupyterLab kernel: call store.close() there or restart the kernel), "
                "or write to another folder (another OUT_DIR; a distributed capture gives each process its own rank).")


def _links_fix(path: Path) -> str:
    return (f"A store makes its own files and folders and never a symbolic link, FIFO or device: remove this one "
            f"(os.unlink({str(path)!r}); what it points to is not touched) and try again")


def _check_name(path) -> None:
    """Refuse a store path no folder can have (a NUL byte, a part over 255 bytes), before the OS is asked."""
    why = name_problem(path)
    if why:
        raise InputError(f"store folder {str(path)!r:.100} {why}: pass a folder such as outputs/02_understanding_maps")


def _locked(path: Path, what: str):
    stat_inside(path.parent, path.name, write=True, error=StoreError, what="lock file", fix=_links_fix(path))
    try:
        return acquire(path, what, _LOCK_ADVICE)
    except LockedError as e:
        raise StoreLockedError(str(e), e.holder) from None


def library_version() -> str:
    return __version__


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; stored files are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def key_str(key: tuple) -> str:
    sample, part, layer, step = key
    return f"{sample}|{part}|{layer}|{step}"


_INDEX_NAME = re.compile(r"index-rank(\d{5,})\.jsonl")  # a rank's log (the name _index_path gives it)
_HEAD = json.JSONDecoder().raw_decode


def _index_fix(p: Path) -> str:
    return (f"Move it aside (rename it to {p.name}.bad) and run the capture again: a resumed capture recaptures "
            f"every sample that no index lists")


def _read_from(path: Path, offset: int) -> bytes:
    """The bytes of ``path`` from ``offset`` on: the only way an index is read (a regular file of the store folder,
    never through a symbolic link, never a FIFO or device)."""
    return read_inside(path.parent, path.name, offset=offset, links=False, error=StoreError, what="index",
                       fix=_index_fix(path))


def _open_index(path: Path, flags: int) -> int:
    """A descriptor of the index ``path`` for writing: a regular file of the store folder, never a link."""
    return open_inside(path.parent, path.name, flags, 0o644, error=StoreError, what="index", fix=_links_fix(path))


def _append_line(path: Path, data: bytes) -> None:
    """Append ``data`` (one line) to ``path`` and fsync it; on any error nothing of it stays."""
    fd = _open_index(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _line(head: dict, records: list) -> str:
    return json.dumps([head, records], separators=(",", ":"))


def _strs(x) -> bool:
    return isinstance(x, list) and all(isinstance(k, str) for k in x)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _spans_ok(s) -> bool:
    """``None`` or ``{"runs": [[kind, length], ...]}`` of kinds 0 / 1, no longer than any sequence."""
    if s is None:
        return True
    runs = s.get("runs") if isinstance(s, dict) else None
    return (isinstance(runs, list) and all(isinstance(r, list) and len(r) == 2 and r[0] in (0, 1) and _int(r[0])
                                           and _int(r[1]) and r[1] >= 0 for r in runs)
            and sum(r[1] for r in runs) <= _MAX_POSITIONS)


def _entry_ok(e: dict) -> bool:
    """An index entry whose fields have the types Store.write gives them and whose key is its own (a hand-typed
    ``"layer": "0"`` is not a record of layer 0)."""
    return (isinstance(e["sample"], str) and isinstance(e["part"], str) and _int(e["layer"]) and _int(e["step"])
            and _int(e["slot"]) and isinstance(e["file"], str) and _strs(e["arrays"]) and isinstance(e["mode"], str)
            and all(_int(e[k]) for k in ("heads", "seq_len", "query_stride", "key_stride")) and _spans_ok(e["spans"])
            and isinstance(e.get("meta", {}), dict) and isinstance(e.get("sha256", ""), str)
            and e["key"] == key_str((e["sample"], e["part"], e["layer"], e["step"])))


class _Log:
    """One rank's index as a :class:`Store` last read it. ``lines``: ``(head, text)`` of each line, in order (the
    text is parsed when a record of it is read); ``live``: record key -> its line, in index order; ``samples``:
    sample -> the lines that hold it; ``end``: the byte after the last whole line; ``torn``: bytes after it;
    ``owner``: chunk folder -> the first line that names it (the line that wrote it); ``refused``: record key -> why
    its entry is never read (found when its line is parsed)."""

    def __init__(self, path: Path):
        self.path, self.sig, self.end, self.torn, self.last = path, None, 0, 0, b""
        self.folder = path.name[len("index-"):-len(".jsonl")]  # rank00000: the folder every chunk of this log lies in
        self.lines: list[tuple[dict, str]] = []
        self.live: dict[str, int] = {}
        self.samples: dict[str, list[int]] = {}
        self.modes: set = set()
        self.chunks = 0
        self.conflicts: list[str] = []  # a key listed twice (in one line, or again while live): refused, not guessed
        self.owner: dict[str, int] = {}
        self.claims: list[str | None] = []  # the chunk folder of each line looked at so far (None: a drop line)
        self.refused: dict[str, str] = {}

    def refresh(self) -> list[str] | None:
        """Read what the file gained since the last call. Returns the keys it added, or None when anything else
        changed (records dropped, the file replaced or rewritten)."""
        st = stat_inside(self.path.parent, self.path.name, links=False, error=StoreError, what="index",
                         fix=_index_fix(self.path))
        if st is None:
            raise MissingFileError(f"index {self.path} was removed while it was read")
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self.sig:
            return []
        ok = self.sig is not None and self.sig[:2] == sig[:2] and st.st_size >= self.end
        data = _read_from(self.path, self.end - len(self.last)) if ok else b""
        fresh = not ok or not data.startswith(self.last)
        if fresh:  # not just appended to: read it all again
            self.__init__(self.path)
            data = _read_from(self.path, 0)
        else:
            data = data[len(self.last):]
        dropped, added = False, []
        done = data.rfind(b"\n") + 1
        for raw in data[:done].split(b"\n")[:-1]:  # lines end at "\n" only (U+2028 inside a string is text)
            n = len(self.lines)
            try:
                text = raw.decode()
                head = _HEAD(text, 1)[0] if text.startswith("[{") else None
            except (UnicodeDecodeError, ValueError) as e:
                raise self.corrupt(n, f"is corrupt ({e})") from e
            if isinstance(head, dict) and _strs(head.get("drop")):
                for k in head["drop"]:
                    self.live.pop(k, None)
                self.lines.append((head, text))
                dropped = True
            elif isinstance(head, dict) and _strs(head.get("keys")) and isinstance(head.get("mode"), str) \
                    and isinstance(head.get("chunk", ""), str):
                added += self._add(head, text)
            else:
                raise self.corrupt(n, 'is corrupt: not a store index line ([{"keys": [...], "mode": ..., '
                                      '"chunk": ...}, [records]])')
        if dropped:
            self.modes = {self.lines[n][0]["mode"] for n in set(self.live.values())}
        self.end += done
        self.torn, self.last, self.sig = len(data) - done, data[max(0, done - 64):done] or self.last, sig
        return None if fresh or dropped else added

    def _add(self, head: dict, text: str) -> list[str]:
        n = len(self.lines)
        self.lines.append((head, text))
        seen = set()
        for k in head["keys"]:
            if k in seen or k in self.live:  # Store.write never does this: a hand-edited or damaged log
                where = "twice in that line" if k in seen else f"while line {self.live[k] + 1} still holds it"
                self.conflicts.append(f"line {n + 1} of {self.path.name} lists record {k} {where}")
                continue  # the first entry stays the record: nothing is read from the second
            seen.add(k)
            self.live[k] = n
            s = self.samples.setdefault(k.rsplit("|", 3)[0], [])
            if not s or s[-1] != n:
                s.append(n)
        self.modes.add(head["mode"])
        self.chunks += 1
        return head["keys"]

    def claim(self, n: int) -> str | None:
        """The chunk folder line ``n`` wrote: its head's ``chunk`` (a line written before heads named it: the folder of
        its first record); None for a drop line. The first line naming a folder owns it (``owner``)."""
        while len(self.claims) < len(self.lines):
            head, text = self.lines[len(self.claims)]
            c = head.get("chunk") if "keys" in head else None
            if "keys" in head and c is None:  # parsed here once: a line of a log written before heads named the chunk
                try:
                    c = str(json.loads(text)[1][0]["file"]).rpartition("/")[0]
                except (ValueError, LookupError, TypeError):
                    c = None
            if c is not None:
                self.owner.setdefault(c, len(self.claims))
            self.claims.append(c)
        return self.claims[n]

    def _problem(self, n: int, e: dict, folder: str | None, slots: dict) -> str | None:
        """Why the entry ``e`` of line ``n`` is not a record that line wrote, or None. Store.write gives every line a
        chunk folder of its own, in its rank's folder, and every record a slot of its own."""
        f, slot = e["file"], e["slot"]
        why = name_problem(f)
        if why:
            return f"names a file {f!r:.80} that {why}"
        if f.startswith("/") or ".." in f.split("/"):
            return f"names {f!r}, a path that points outside the store"
        if folder is None or f.rpartition("/")[0] != folder:
            return f"names {f!r}, outside the chunk folder {folder} its line wrote"
        if folder.rpartition("/")[0] != self.folder:
            return f"names a chunk of {folder}, outside {self.folder}/, the only folder {self.path.name} writes"
        if self.owner[folder] != n:
            return (f"names {f!r} of chunk {folder}, which line {self.owner[folder] + 1} wrote: an alias of that "
                    f"line's records, never read as them")
        if (f, slot) in slots:
            return f"names slot {slot} of {f!r}, which record {slots[f, slot]} of the same line holds"
        slots[f, slot] = e["key"]
        return None

    def entries(self, n: int) -> list[dict]:
        """The entries of line ``n`` still in the index (those it may not hold are noted in ``refused``)."""
        head, text = self.lines[n]
        try:
            line = json.loads(text)
        except ValueError as e:
            raise self.corrupt(n, f"is corrupt ({e})") from e
        recs = line[1] if isinstance(line, list) and len(line) == 2 else None
        if not isinstance(recs, list) or any(not isinstance(e, dict) or not _ENTRY_KEYS <= e.keys() for e in recs) \
                or [e["key"] for e in recs] != head["keys"]:
            raise self.corrupt(n, "is corrupt: its records are not one entry per key of its head")
        bad = next((e["key"] for e in recs if not _entry_ok(e)), None)
        if bad is not None:
            raise self.corrupt(n, f"is corrupt: the entry of record {bad} has fields of the wrong type (layer, step, "
                                  f"slot, heads, seq_len and strides are whole numbers; sample, part, mode, file and "
                                  f"sha256 texts; spans runs of [0 or 1, length]; meta an object) or a key that is not "
                                  f"its own")
        folder, slots = self.claim(n), {}
        for e in recs:
            why = self._problem(n, e, folder, slots)
            if self.live.get(e["key"]) == n:
                if why:
                    self.refused[e["key"]] = f"record {e['key']} (line {n + 1} of {self.path.name}) {why}"
                else:
                    self.refused.pop(e["key"], None)
        return [e for e in recs if self.live.get(e["key"]) == n]

    def corrupt(self, n: int, what: str) -> "StoreError":
        return StoreError(f"line {n + 1} of index {self.path} {what}. {_index_fix(self.path)}")

    def cut(self) -> None:
        """Cut a torn last line off (a write of this rank that was interrupted: the caller holds its lock)."""
        if self.torn:
            fd = _open_index(self.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, self.end)
            finally:
                os.close(fd)
            self.torn = 0


class Store:
    """Read and append capture records.

    Args:
        path: the store directory (created on first write).
        rank: this writer's rank (each process of a distributed capture uses its own).
        meta: written to ``meta.json`` on first write (``model``, ``dtype``, anything else); a later writer with
            different ``model`` raises rather than mixing two models in one store.
    """

    def __init__(self, path, rank: int = 0, meta: dict | None = None):
        _check_name(path)
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a store folder: pass the folder a capture writes to "
                             f"(e.g. outputs/02_understanding_maps/stats)")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise InputTypeError(f"rank must be an int >= 0, got {rank!r}")
        self.rank = rank
        self.meta = dict(meta or {})
        self._lock = None
        self._logs: dict[int, _Log] = {}  # every rank's index as last read (see the module docstring)
        self._owner: dict[str, int] = {}  # record key -> its rank, over all ranks
        self._clash: str | None = None  # the first key two ranks hold
        self._guard = threading.RLock()  # threads of this process sharing the object take turns on the above

    # ---- the writer lock -----------------------------------------------------------------------
    def _lock_path(self, rank: int | None = None) -> Path:
        return self.path / f".lock-rank{self.rank if rank is None else rank:05d}"

    def _writer_lock(self):
        """This writer's lock, taken on first use and kept until :meth:`close`."""
        if self._lock is not None and self._lock.pid != os.getpid():
            raise StoreError(
                f"this Store of {self.path} (rank {self.rank}) was opened for writing by process {self._lock.pid} and "
                f"inherited by process {os.getpid()} through a fork: a forked child must not write through its "
                f"parent's writer (their index updates would overwrite each other). Write from one process, or open "
                f"Store(path, rank=<a rank of its own>) in the child (a distributed capture gives every process its rank)")
        if self._lock is not None and not self._lock.valid():  # the store was removed under us
            self._lock.release()
            self._lock = None
        if self._lock is None:
            self._lock = _locked(self._lock_path(), f"rank {self.rank} of store {self.path}")
        return self._lock

    def close(self) -> None:
        """Release the writer lock (reading needs no lock). Also done when the object is dropped or the process ends."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- index ---------------------------------------------------------------------------------
    def _index_path(self, rank: int | None = None) -> Path:
        return self.path / f"index-rank{self.rank if rank is None else rank:05d}.jsonl"

    def _refresh(self) -> None:
        """Bring the in-memory index up to date, reading only what each rank's log gained since the last call."""
        with self._guard:
            for again in (True, False):
                try:
                    return self._refresh_once()
                except BaseException as e:
                    self._logs, self._owner, self._clash = {}, {}, None  # the next look reads everything again
                    if not (again and isinstance(e, MissingFileError)):  # (a log gone since listed)
                        raise

    def _refresh_once(self) -> None:
        files: dict[int, Path] = {}
        for p in self.path.glob("index-rank*"):
            m = _INDEX_NAME.fullmatch(p.name)
            if m and p.name == self._index_path(int(m[1])).name:  # (index-rank0.jsonl is no rank's log)
                files[int(m[1])] = p
        rebuild = files.keys() != self._logs.keys()
        self._logs = {r: log for r, log in self._logs.items() if r in files and log.path == files[r]}
        added = []
        for r in sorted(files):
            log = self._logs.setdefault(r, _Log(files[r]))
            new = log.refresh()
            rebuild = rebuild or new is None
            added += [(k, r) for k in new or ()]
        if rebuild:
            self._owner, self._clash = {}, None
            added = [(k, r) for r, log in sorted(self._logs.items()) for k in log.live]
        for k, r in added:
            o = self._owner.setdefault(k, r)
            if o != r and self._clash is None:
                self._clash = (f"record {k} is in both {self._logs[o].path.name} and {self._logs[r].path.name}: two ranks "
                               f"captured the same sample; give each rank a disjoint slice (shard_samples)")

    def _current(self) -> None:
        """Refresh the index; raise for a missing store or a key two ranks hold."""
        if not self.path.exists():
            raise StoreError(f"no store at {self.path}: run a capture that writes to it first")
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a store folder")
        self._refresh()
        if self._clash:
            raise StoreError(self._clash)
        conflicts = self._conflicts()
        if conflicts:
            raise StoreError(f"{conflicts[0]}{f' (and {len(conflicts) - 1} more)' if len(conflicts) > 1 else ''}: a "
                             f"hand-edited or damaged index, whose records could be the wrong sample's. Nothing is read "
                             f"until it is mended: delete the line that should not be there (Store.verify() lists them "
                             f"all), or capture into a new folder")

    def _conflicts(self) -> list[str]:
        return [c for _, log in sorted(self._logs.items()) for c in log.conflicts]

    def _refused(self, key: str) -> str | None:
        """Why the entry of ``key`` (its line parsed already) is not a record its line wrote, or None."""
        return next((log.refused[key] for log in self._logs.values() if key in log.refused), None)

    def index(self) -> list[dict]:
        """Every committed record's entry, merged over all ranks."""
        with self._guard:
            self._current()
            return [e for _, log in sorted(self._logs.items()) for n in sorted(set(log.live.values()))
                    for e in log.entries(n)]

    def keys(self) -> set[str]:
        if not self.path.exists():
            return set()
        with self._guard:
            self._current()
            return set(self._owner)

    def missing(self, samples, layers, part: str = "language", step: int = -1) -> list:
        """Samples of ``samples`` that lack any of ``layers`` (what a resumed capture still has to do)."""
        have = self.keys()
        return [s for s in samples if any(key_str((str(s), part, int(li), step)) not in have for li in layers)]

    # ---- writing -------------------------------------------------------------------------------
    RESUME_KEYS = ("model", "dtype")  # meta fields a resumed capture must share with the store

    def check_resume(self, mode: str | None = None) -> None:
        """Refuse to add to this store what does not belong beside what it holds: another model or weight dtype (its
        ``meta``) or records of another capture ``mode``. Capture calls it before deciding what is already done,
        so a resumed capture never mixes (nor silently skips samples stored in another mode). Raises
        :class:`StoreError` naming the difference and how to start a new store."""
        if os.path.lexists(self.path / "meta.json"):
            old = self.read_meta()
            for k in self.RESUME_KEYS:
                if k in self.meta and k in old and self.meta[k] != old[k]:
                    raise StoreError(f"store {self.path} holds {k}={old[k]!r}, this capture is {k}={self.meta[k]!r}: "
                                     f"one store holds one {k}. Write to a new folder, or remove_store({str(self.path)!r}) "
                                     f"to start this one again")
        if mode is not None and self.path.exists():
            with self._guard:
                self._current()
                other = sorted({m for log in self._logs.values() for m in log.modes if m} - {mode})
            if other:
                raise StoreError(f"store {self.path} holds mode={other[0]!r} records, this capture is mode={mode!r}: "
                                 f"one store holds one capture mode. Write to a new folder (e.g. {self.path.name}-{mode}), "
                                 f"or remove_store({str(self.path)!r}) to start this one again")

    def _check_meta(self):
        mp = self.path / "meta.json"
        if os.path.lexists(mp):
            self.check_resume()
            return self.read_meta()
        meta = {"format": FORMAT, "library_version": library_version(), **self.meta}
        write_inside(self.path, "meta.json", json.dumps(meta, indent=1).encode(), error=StoreError, what="file",
                     fix=_links_fix(mp))
        return meta

    def write(self, records: list[Record]) -> int:
        """Append ``records`` as one chunk. Returns the number written. Raises :class:`StoreError` if a
        key is already stored (nothing is written then)."""
        records = list(records)
        if not records:
            return 0
        self.path.mkdir(parents=True, exist_ok=True)
        with self._writer_lock().mutex, self._guard:
            return self._write(records)

    def _write(self, records: list[Record]) -> int:
        for r in records:  # what the line will say, checked before anything is written: a reader must accept it
            if not (isinstance(r.sample, str) and isinstance(r.part, str) and _int(r.layer) and _int(r.step)):
                raise InputTypeError(f"record {r.key!r}: sample and part must be texts, layer and step whole numbers")
            why = name_problem(f"L{r.layer:04d}_{r.part}.npz") or ("holds '/' or '|'" if set("/|") & set(r.part)
                                                                   else None)
            if why:
                raise InputError(f"record {r.key!r}: its part {r.part!r:.80} names its file, and that name {why}: use "
                                 f"a short part name such as 'language'")
        self._check_meta()
        modes = {r.mode for r in records}
        if len(modes) > 1:
            raise StoreError(f"one write mixes capture modes {sorted(modes)}: one store holds one mode")
        self.check_resume(mode=next(iter(modes)))  # brings the index up to date
        keys = [key_str(r.key) for r in records]
        dup = [k for k in keys if k in self._owner] or [k for i, k in enumerate(keys) if k in keys[:i]]
        if dup:
            raise StoreError(f"{len(dup)} record(s) already stored, e.g. {dup[0]!r}; stored data is never "
                             f"overwritten: skip them (Store.missing) or write to a new directory")
        n_chunk = self._logs[self.rank].chunks if self.rank in self._logs else 0
        home = f"rank{self.rank:05d}"
        folder_inside(self.path, home, create=True, error=StoreError, what="rank folder",
                      fix=_links_fix(self.path / home))
        while os.path.lexists(self.path / f"{home}/chunk{n_chunk:06d}"):  # an orphan (or anything else): never reused
            n_chunk += 1
        chunk = f"rank{self.rank:05d}/chunk{n_chunk:06d}"
        by_layer: dict[tuple, list[int]] = {}
        for i, r in enumerate(records):
            by_layer.setdefault((r.part, r.layer), []).append(i)
        new_entries: list[dict | None] = [None] * len(records)  # kept in the order written
        for (part, layer), idx in by_layer.items():
            rel = f"{chunk}/L{layer:04d}_{part}.npz"
            arrays = {}
            for j, i in enumerate(idx):
                for name, t in records[i].data.items():
                    t = t.detach().cpu()
                    arrays[f"r{j}__{name}"] = (t if t.dtype == torch.bool else t.float()).numpy()
            buf = io.BytesIO()
            np.savez_compressed(buf, **arrays)
            data = buf.getvalue()
            write_inside(self.path, rel, data, error=StoreError, what="chunk file", fix=_links_fix(self.path / rel))
            digest = hashlib.sha256(data).hexdigest()
            for j, i in enumerate(idx):
                r = records[i]
                new_entries[i] = {
                    "key": key_str(r.key), "sample": r.sample, "part": r.part, "layer": r.layer, "step": r.step,
                    "mode": r.mode, "heads": r.heads, "seq_len": r.seq_len, "query_stride": r.query_stride,
                    "key_stride": r.key_stride, "file": rel, "slot": j, "arrays": sorted(r.data), "sha256": digest,
                    "spans": r.spans.to_json() if r.spans is not None else None, "meta": r.meta}
        self._append(self.rank, {"keys": keys, "mode": records[0].mode, "chunk": chunk}, new_entries)
        return len(records)

    def _append(self, rank: int, head: dict, records: list) -> None:
        """Commit one line to ``rank``'s log, its writer lock held and the index just refreshed (a torn last line is
        cut off first)."""
        log = self._logs.get(rank)
        if log is not None:
            log.cut()
        _append_line(self._index_path(rank), (_line(head, records) + "\n").encode())

    # ---- reading -------------------------------------------------------------------------------
    def read_meta(self) -> dict:
        mp = self.path / "meta.json"
        if not os.path.lexists(mp):
            raise StoreError(f"{self.path} has no meta.json: not a store, or nothing was written yet")
        data = read_inside(self.path, "meta.json", links=False, error=StoreError, what="file", fix=_links_fix(mp))
        try:
            meta = json.loads(data.decode())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{mp} is corrupt ({e}): it only describes the store (model, dtype); rewrite it as "
                             f'{{"model": "<name>"}} or capture again into a new folder') from e
        if not isinstance(meta, dict):
            raise StoreError(f"{mp} holds a {type(meta).__name__}, not an object: rewrite it as {{\"model\": \"<name>\"}}")
        return meta

    def _fix(self) -> str:
        return (f"Run Store({str(self.path)!r}).repair() to drop its records from the index (the other records stay "
                f"readable), then run the capture again: a resumed capture recaptures exactly those samples")

    def _open(self, rel: str) -> tuple[bytes, str]:
        """The bytes of the chunk file ``rel`` and their SHA-256: a regular file inside the store, reached without a
        symbolic link (never a FIFO or device, never opened when it is not)."""
        data = read_inside(self.path, rel, links=False, error=StoreError, what="file listed in the index",
                           fix=self._fix())
        return data, hashlib.sha256(data).hexdigest()

    def _load(self, rel: str, data: bytes):
        try:
            return np.load(io.BytesIO(data))  # (allow_pickle=False: no code in an archive is ever run)
        except Exception as e:  # noqa: BLE001 - an unreadable archive without a recorded checksum
            raise StoreError(f"file {rel} in {self.path} cannot be read ({' '.join(str(e).split())}). "
                             f"{self._fix()}") from e

    def _archive(self, e: dict, cache: dict):
        """The archive that holds the record of entry ``e``, after every check: its line wrote it (no alias, no file
        outside its chunk), the file is a regular one inside the store whose SHA-256 is the one ``e`` gives, and it
        holds ``e``'s arrays. Raises :class:`StoreError` naming what is wrong."""
        k, f = e["key"], e["file"]
        why = self._refused(k)
        if why:
            raise StoreError(f"{why}: a hand-edited or damaged index; it is never read. {self._fix()}")
        if f not in cache:
            cache[f] = [*self._open(f), None]
        got = cache[f]
        if e.get("sha256") and e["sha256"] != got[1]:
            raise StoreError(f"file {f} in {self.path} is corrupt (checksum mismatch: it is not the file the entry of "
                             f"record {k} gives; the file or that index line is damaged). {self._fix()}")
        if got[2] is None:
            got[2] = self._load(f, got[0])
        lost = [n for n in e["arrays"] if f"r{e['slot']}__{n}" not in got[2].files]
        if lost:
            raise StoreError(f"record {k}: file {f} in {self.path} holds no {lost[0]!r} for its slot {e['slot']} (a "
                             f"hand-edited or damaged index). {self._fix()}")
        return got[2]

    def read(self, sample=None, layer=None, part=None, step=None) -> list[Record]:
        """Records matching the filters (None = any), in index order, exactly as written."""
        if sample is None:
            ents = self.index()
        else:  # only the lines that hold the sample are parsed
            with self._guard:
                self._current()
                ents = [e for _, log in sorted(self._logs.items()) for n in log.samples.get(str(sample), ())
                        for e in log.entries(n) if e["sample"] == str(sample)]
        ents = [e for e in ents if (layer is None or e["layer"] == layer) and (part is None or e["part"] == part)
                and (step is None or e["step"] == step)]
        cache: dict[str, list] = {}
        out = []
        for e in ents:
            z = self._archive(e, cache)
            try:
                data = {n: torch.from_numpy(z[f"r{e['slot']}__{n}"]) for n in e["arrays"]}
            except Exception as err:  # noqa: BLE001 - an archive without a checksum holding what np.load refuses
                raise StoreError(f"record {e['key']}: file {e['file']} in {self.path} cannot be read "
                                 f"({' '.join(str(err).split())}). {self._fix()}") from err
            out.append(Record(
                sample=e["sample"], layer=e["layer"], part=e["part"], mode=e["mode"], data=data,
                spans=Spans.from_json(e["spans"]) if e["spans"] else None, step=e["step"], seq_len=e["seq_len"],
                heads=e["heads"], query_stride=e["query_stride"], key_stride=e["key_stride"], meta=e.get("meta", {})))
        return out

    def _inspect(self) -> list[tuple[str, list[str], str, bool]]:
        """Every record that cannot be read, as ``(file, keys, why, whole file)``. A whole file is damaged when it is
        missing, not a regular file of the store, unreadable, or has the checksum of no entry that names it (then all
        its records are); a record alone when its entry is not one its line wrote (an alias of another line's record,
        a file outside its chunk), or gives a checksum or slot its sound file does not have. Reads every file once."""
        by_file: dict[str, list[dict]] = {}
        for e in self.index():
            by_file.setdefault(e["file"], []).append(e)
        out = []
        for f, ents in by_file.items():
            sound = []
            for e in ents:
                why = self._refused(e["key"])
                out += [(f, [e["key"]], why, False)] if why else []
                sound += [] if why else [e]
            if not sound:
                continue
            try:
                data, digest = self._open(f)
                ok = {e["key"] for e in sound if not e.get("sha256") or e["sha256"] == digest}
                names = set(self._load(f, data).files) if ok else set()
            except StoreError:
                ok = set()
            if not ok:
                out.append((f, [e["key"] for e in sound], "", True))
                continue
            for e in sound:
                if e["key"] not in ok:
                    out.append((f, [e["key"]], f"record {e['key']} gives a checksum that {f} does not have (another "
                                               f"record's entry matches the file)", False))
                elif any(f"r{e['slot']}__{n}" not in names for n in e["arrays"]):
                    out.append((f, [e["key"]], f"record {e['key']} names slot {e['slot']} of {f}, which does not hold "
                                               f"its arrays", False))
        return out

    def damaged(self) -> dict[str, list[str]]:
        """Damaged records: ``{file: [record keys]}`` for every indexed file that is missing, unreadable or fails its
        checksum, and for every entry that names a file its line did not write or a checksum or slot its file does
        not have. Reads every file once (use it to check a store, not in a loop)."""
        out: dict[str, list[str]] = {}
        for f, keys, _, _ in self._inspect():
            out.setdefault(f, []).extend(keys)
        return out

    def _named_chunks(self) -> set[str]:
        """Every chunk folder a line of any log names (its records live, dropped or in conflict): never an orphan."""
        used = set()
        for _, log in sorted(self._logs.items()):
            for head, text in log.lines:
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                recs = line[1] if isinstance(line, list) and len(line) == 2 and isinstance(line[1], list) else []
                used |= {str(e["file"]).rsplit("/", 1)[0] for e in recs if isinstance(e, dict) and "file" in e}
                used |= {head["chunk"]} if isinstance(head.get("chunk"), str) else set()
        return used

    def _scan(self) -> tuple[list[Path], list[tuple[Path, str]]]:
        """``(leftovers, strangers)``. Leftovers of interrupted writes: temporary files and chunk folders no line of
        any index names. Strangers: a symbolic link, FIFO, device or socket under a name the store uses for its own
        files and folders (``meta.json``, ``index-rank*``, ``.lock-rank*``, ``rank*``, ``rank*/chunk*``), with what
        it is. Only real folders of the store are looked into: a link is never followed."""
        with self._guard:
            self._current()
        used = self._named_chunks()
        tmp, orphans, strangers = [], [], []

        def look(folder: Path, depth: int) -> None:
            try:
                found = sorted(os.scandir(folder), key=lambda d: d.name)
            except OSError:
                return
            for d in found:
                p, n = Path(d.path), d.name
                try:
                    mode = d.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                own = (n == "meta.json" or n.startswith(("index-rank", ".lock-rank", "rank"))) if depth == 0 else \
                    depth == 1 and n.startswith("chunk")
                if n.startswith(".") and n.endswith(".tmp") and not stat.S_ISDIR(mode):
                    tmp.append(p)  # (removing a link or FIFO removes the name, never what it points to)
                elif own and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    kind = f"a symbolic link to {os.readlink(p)}" if stat.S_ISLNK(mode) else file_kind(mode)
                    strangers.append((p, kind))
                elif stat.S_ISDIR(mode) and depth == 0 and n.startswith("rank"):
                    look(p, 1)
                elif stat.S_ISDIR(mode) and own:  # a chunk folder
                    if p.relative_to(self.path).as_posix() not in used and not any(
                            q.endswith(".damaged") for q in os.listdir(p)):  # (repair's kept *.damaged: not an orphan)
                        orphans.append(p)
                    look(p, 2)

        look(self.path, 0)
        return tmp + orphans, strangers

    def _leftovers(self) -> list[Path]:
        """Traces of interrupted writes: temporary files and chunk folders no line of any index names."""
        return self._scan()[0]

    def verify(self) -> list[str]:
        """Problems found, one line each: damaged records (missing or corrupt files, with their record keys; entries a
        line may not hold: an alias of another line's record, a checksum or slot its file does not have), leftovers
        of interrupted writes (ignored by readers; :meth:`repair` removes them) and symbolic links, FIFOs or devices
        under the store's own names (never followed nor removed). A leftover of a rank that a live process is writing
        right now is reported as a write in flight, not as damage. Empty when the store is sound. Records listed twice
        (a hand-edited log) are reported, each naming its file and line; nothing else is checked until they are
        mended."""
        with self._guard:
            self._refresh()
            conflicts = self._conflicts()
        if conflicts:
            return [f"{c}: delete the line that should not be there (a hand-edited or damaged index); reads are refused "
                    f"until then" for c in conflicts]
        leftovers, strangers = self._scan()
        problems = [f"{p.relative_to(self.path).as_posix()} is {kind}: a store never makes one, so it is never "
                    f"followed, opened, written or removed (repair() leaves it); remove it yourself "
                    f"(os.unlink({str(p)!r})) if it should not be there" for p, kind in strangers]
        for f, keys, why, whole in self._inspect():
            problems.append(f"damaged file {f}: {len(keys)} record(s) unreadable ({', '.join(keys[:3])}"
                            f"{', ...' if len(keys) > 3 else ''}); Store.repair() drops them so a resumed capture "
                            f"recaptures them" if whole else
                            f"{why}: a hand-edited or damaged index, never read; Store.repair() drops the record (the "
                            f"file stays as it is) so a resumed capture recaptures it")
        writing = {}

        def live(rank) -> dict | None:  # another live process that holds the rank's writer lock, if any
            if rank not in writing:
                lock = self._lock_path(rank) if rank is not None else None
                writing[rank] = None if lock is None or held_here(lock) else holder_if_held(lock)
            return writing[rank]

        def in_flight(what: str, rank) -> str:
            return (f"{what}: possibly a write in flight, not damage (rank {rank} is held by a live writer, "
                    f"{describe(live(rank))}); check again once it has closed the store")

        for p in leftovers:
            rel = p.relative_to(self.path).as_posix()
            head = rel.split("/", 1)[0]
            rank = int(head[4:]) if head.startswith("rank") and head[4:].isdigit() else None
            if live(rank):
                problems.append(in_flight(("chunk " if p.is_dir() else "temporary file ") + rel, rank))
                continue
            problems.append(f"orphaned chunk {rel} (an interrupted write); it is ignored, Store.repair() removes it"
                            if p.is_dir() else f"temporary file {rel} left by an interrupted write; it is ignored, "
                            f"Store.repair() removes it")
        for rank, log in sorted(self._logs.items()):
            if log.torn:
                problems.append(in_flight(f"{log.path.name} ends in {log.torn} bytes of an unfinished line", rank)
                                if live(rank) else f"{log.path.name} ends in {log.torn} bytes of an unfinished line "
                                f"(an interrupted write); it is ignored, Store.repair() removes it")
        return problems

    def drop(self, keys) -> list[str]:
        """Remove the records ``keys`` (``"sample|part|layer|step"``) from their ranks' indexes: one line appended
        to each rank's log that holds any, under that rank's writer lock. Their data files stay on disk. Returns
        the keys dropped."""
        keys, dropped = set(keys), []
        self._refresh()
        for rank in sorted(self._logs):
            lock = _locked(self._lock_path(rank), f"rank {rank} of store {self.path}")
            try:
                with lock.mutex, self._guard:
                    self._refresh()  # what the rank holds now that nobody else writes it
                    gone = [k for k in self._logs[rank].live if k in keys] if rank in self._logs else []
                    if gone:
                        self._append(rank, {"drop": gone}, [])
                        dropped += gone
            finally:
                lock.release()
        return dropped

    def _set_aside(self, rel: str) -> None:
        """Rename the damaged file (or folder) ``rel`` to ``*.damaged``, kept for inspection: only one of the store's
        own, reached without a symbolic link; a link, FIFO or device is left where it is, never followed."""
        folder, _, name = rel.rpartition("/")
        try:
            if folder:
                folder_inside(self.path, folder, error=StoreError)
            p = self.path / rel
            if stat.S_ISREG(os.lstat(p).st_mode) or stat.S_ISDIR(os.lstat(p).st_mode):
                os.replace(p, p.with_name(name + ".damaged"))
        except (StoreError, OSError, ValueError):  # outside, gone, or a name no file can have: nothing to keep
            pass

    def repair(self) -> list[str]:
        """Make a damaged store whole again: drop damaged records from the index (their files are kept, renamed
        ``*.damaged``; a sound file that a bad entry names stays as it is), delete leftovers of interrupted writes.
        Refused (StoreLockedError) while another process writes any rank. Afterwards :meth:`missing` lists the dropped
        samples and a resumed capture recaptures them. Returns the record keys dropped. A store whose logs list a
        record twice is refused (StoreError): which line is right is for a person to decide, and nothing is deleted.
        Symbolic links, FIFOs and devices under the store's names are left alone (:meth:`verify` names them)."""
        self._refresh()
        if self._conflicts():
            raise StoreError(f"{self._conflicts()[0]}: repair() does not guess which line is right and deletes nothing. "
                             f"Delete the line that should not be there (Store.verify() lists them all), then repair")
        ranks = sorted(set(self._logs) | {int(n[len(".lock-rank"):]) for n in os.listdir(self.path)
                                          if n.startswith(".lock-rank") and n[len(".lock-rank"):].isdigit()
                                          and n == self._lock_path(int(n[len(".lock-rank"):])).name})
        locks = []
        try:
            for r in ranks:  # nobody else may write while we decide what is an orphan
                locks.append(_locked(self._lock_path(r), f"rank {r} of store {self.path}"))
            bad = self._inspect()
            dropped = self.drop([k for _, keys, _, _ in bad for k in keys])
            for f in dict.fromkeys(f for f, _, _, whole in bad if whole):
                self._set_aside(f)
            for p in self._leftovers():  # (brings the index up to date)
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            for log in self._logs.values():
                log.cut()
            return dropped
        finally:
            for lk in locks:
                lk.release()


def remove_store(path) -> bool:
    """Delete the store folder ``path`` (a notebook's own output of an earlier run), refused with
    :class:`StoreLockedError` while another process writes to it, and refused for a folder that holds anything but a
    store (a symbolic link, FIFO or device under a store's name included: what it points to is never touched). A
    writer of this process is released first (re-running a notebook cell). Returns True if something was removed."""
    _check_name(path)
    p = Path(path)
    if p.is_symlink():
        raise StoreError(f"{p} is a symbolic link (to {os.path.realpath(p)}): not removed. Remove the link with "
                         f"os.unlink({str(p)!r}), or call remove_store on the folder it points to")
    if not p.exists():
        return False
    if not p.is_dir():
        raise StoreError(f"{p} is a file, not a store folder; remove it yourself if it is yours")
    kinds = {q.name: os.lstat(q).st_mode for q in p.iterdir()}

    def tmp(n: str) -> bool:
        return n.startswith(".") and n.endswith(".tmp")

    other = [n for n in kinds if not (n == "meta.json" or n.startswith(("index-rank", ".lock-rank", "rank")) or tmp(n))]
    if other:
        shown = ", ".join(n if n.isprintable() else repr(n) for n in sorted(other)[:5])
        raise StoreError(f"{p} holds more than a store ({shown}): not removed. Point OUT_DIR to a folder of its own")
    strange = sorted(n for n, m in kinds.items() if not tmp(n) and not (stat.S_ISDIR(m) if n.startswith("rank")
                                                                        else stat.S_ISREG(m)))
    if strange:
        raise StoreError(f"{p} holds {', '.join(f'{n} ({file_kind(kinds[n])})' for n in strange[:3])}, which a store "
                         f"never makes: not removed, and nothing a link points to is touched. Remove "
                         f"{'it' if len(strange) == 1 else 'them'} yourself (os.unlink) if that is right, then call "
                         f"remove_store again")
    locks = []
    try:
        for lp in sorted(p.glob(".lock-rank*")):
            if held_here(lp) is not None:
                forget(lp)  # this process's own earlier writer (a re-run cell): its lock goes with the files
            locks.append(_locked(lp, f"store {p}"))
        shutil.rmtree(p)
    finally:
        for lk in locks:
            lk.release()
    return True


def shard_samples(samples: list, rank: int, world_size: int) -> list:
    """The slice of ``samples`` that ``rank`` of ``world_size`` captures (round-robin, disjoint)."""
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside world size {world_size}")
    return list(samples)[rank::world_size]
