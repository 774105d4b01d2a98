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

Each line is a JSON array ``[head, records]``: the head holds the chunk's record keys and capture mode
(``{"keys": ["7|language|3|-1", ...], "mode": "stats"}``), ``records`` one entry per record (its file, slot,
checksum, spans, ...). :meth:`Store.drop` appends ``[{"drop": [keys]}, []]``. A :class:`Store` keeps the heads of
every rank's log in memory and, on each call, reads only the bytes a log gained since it last looked (by byte
offset); a line's records are parsed when one of them is read. So appending a chunk costs the same at the
100,000th record as at the first, and opening a large store reads only the heads. Why a log and not SQLite: the
store stays plain files that readers only read (a copy on a read-only or shared mount reads; no database locks
beside the writer's OS lock, no connection to reopen after a fork), a commit is one atomic step (an fsync'd line),
and the index is text a person can read and mend. Stores of the former format (one ``index-rankNNNNN.json`` per
rank, rewritten whole on every write) still read; a rank's next write (or drop) converts its index to a log.

One writer per rank: the first write takes an exclusive OS lock (``.lock-rank00000``, see :mod:`unicache_lib.locks`)
held until :meth:`Store.close` (or the object is dropped, or the process ends or crashes); a second process writing
the same rank is refused with the holder's pid, host and start time. :func:`remove_store` deletes a store only when
no other process writes to it.

Damage: :meth:`Store.damaged` lists records whose file is missing or fails its checksum; reading other records keeps
working; :meth:`Store.repair` drops the damaged records from the index (their files are kept, renamed ``*.damaged``)
and removes leftovers of interrupted writes, so :meth:`Store.missing` reports those samples and a resumed capture
recaptures them.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .capture.record import Record
from .core.errors import InputError, InputTypeError, StoreError, StoreLockedError
from .core.modality import Spans
from .core.untrusted import inside
from .locks import LockedError, acquire, describe, forget, held_here, holder_if_held

FORMAT = 1


_ENTRY_KEYS = {"key", "sample", "part", "layer", "step", "file", "slot", "arrays"}
_LOCK_ADVICE = ("Wait for it to finish or stop it (a JupyterLab kernel: call store.close() there or restart the kernel), "
                "or write to another folder (another OUT_DIR; a distributed capture gives each process its own rank).")


def _locked(path: Path, what: str):
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


_INDEX_NAME = re.compile(r"index-rank(\d+)\.(jsonl|json)")  # a rank's log, or its index in the former format
_HEAD = json.JSONDecoder().raw_decode


def _index_fix(p: Path) -> str:
    return (f"Move it aside (rename it to {p.name}.bad) and run the capture again: a resumed capture recaptures "
            f"every sample that no index lists")


def _read_from(path: Path, offset: int) -> bytes:
    """The bytes of ``path`` from ``offset`` on: the only way an index is read."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def _append_line(path: Path, data: bytes) -> None:
    """Append ``data`` (one line) to ``path`` and fsync it; on any error nothing of it stays."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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


def _entry_ok(e: dict) -> bool:
    """An index entry whose fields have the types Store.write gives them and whose key is its own (a hand-typed
    ``"layer": "0"`` is not a record of layer 0)."""
    return (isinstance(e["sample"], str) and isinstance(e["part"], str) and _int(e["layer"]) and _int(e["step"])
            and _int(e["slot"]) and isinstance(e["file"], str) and _strs(e["arrays"])
            and e["key"] == key_str((e["sample"], e["part"], e["layer"], e["step"])))


class _Log:
    """One rank's index as a :class:`Store` last read it. ``lines``: ``(head, text)`` of each line, in order (the
    text is parsed when a record of it is read); ``live``: record key -> its line, in index order; ``samples``:
    sample -> the lines that hold it; ``end``: the byte after the last whole line; ``torn``: bytes after it."""

    def __init__(self, path: Path):
        self.path, self.sig, self.end, self.torn, self.last = path, None, 0, 0, b""
        self.lines: list[tuple[dict, str]] = []
        self.live: dict[str, int] = {}
        self.samples: dict[str, list[int]] = {}
        self.modes: set = set()
        self.chunks = 0
        self.conflicts: list[str] = []  # a key listed twice (in one line, or again while live): refused, not guessed

    def refresh(self, store: "Store") -> list[str] | None:
        """Read what the file gained since the last call. Returns the keys it added, or None when anything else
        changed (records dropped, the file replaced or rewritten, the former format re-read)."""
        st = os.stat(self.path)
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self.sig:
            return []
        if self.path.suffix == ".json":  # the former format: one JSON, read whole, turned into lines in memory
            self.__init__(self.path)
            groups: list[list[dict]] = []
            for e in store._load_index(self.path)["records"]:  # a line per chunk: consecutive records of one folder
                if not groups or str(e["file"]).rsplit("/", 1)[0] != str(groups[-1][0]["file"]).rsplit("/", 1)[0]:
                    groups.append([])
                groups[-1].append(e)
            for g in groups:
                head = {"keys": [e["key"] for e in g], "mode": g[0].get("mode") or ""}
                self._add(head, _line(head, g))
            self.sig = sig
            return None
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
        for raw in data[:done].split(b"\n")[:-1]:
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
            elif isinstance(head, dict) and _strs(head.get("keys")) and isinstance(head.get("mode"), str):
                added += self._add(head, text)
            else:
                raise self.corrupt(n, 'is corrupt: not a store index line ([{"keys": [...], "mode": ...}, [records]])')
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

    def entries(self, n: int) -> list[dict]:
        """The entries of line ``n`` still in the index."""
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
            raise self.corrupt(n, f"is corrupt: the entry of record {bad} has fields of the wrong type (layer, step and "
                                  f"slot are whole numbers; sample, part and file texts) or a key that is not its own")
        return [e for e in recs if self.live.get(e["key"]) == n]

    def corrupt(self, n: int, what: str) -> "StoreError":
        return StoreError(f"line {n + 1} of index {self.path} {what}. {_index_fix(self.path)}")

    def cut(self) -> None:
        """Cut a torn last line off (a write of this rank that was interrupted: the caller holds its lock)."""
        if self.torn:
            os.truncate(self.path, self.end)
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

    def _load_index(self, p: Path) -> dict:
        """An index of the former format (``index-rankNNNNN.json``, read whole)."""
        try:
            idx = json.loads(_read_from(p, 0))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"index {p} is corrupt ({e}). {_index_fix(p)}") from e
        recs = idx.get("records") if isinstance(idx, dict) else None
        bad = not isinstance(recs, list) or any(not isinstance(e, dict) or not _ENTRY_KEYS <= e.keys() for e in recs)
        if bad:
            found = f"a {type(idx).__name__} with keys {sorted(idx)[:6]}" if isinstance(idx, dict) else type(idx).__name__
            raise StoreError(f"index {p} is not a store index (expected {{'records': [...]}} with one entry per record, "
                             f"found {found}). {_index_fix(p)}")
        return idx

    def _refresh(self) -> None:
        """Bring the in-memory index up to date, reading only what each rank's log gained since the last call."""
        with self._guard:
            for again in (True, False):
                try:
                    return self._refresh_once()
                except BaseException as e:
                    self._logs, self._owner, self._clash = {}, {}, None  # the next look reads everything again
                    if not (again and isinstance(e, FileNotFoundError)):  # (a log gone since listed: a rank converted)
                        raise

    def _refresh_once(self) -> None:
        files: dict[int, Path] = {}
        for p in self.path.glob("index-rank*"):
            m = _INDEX_NAME.fullmatch(p.name)
            if m and (m[2] == "jsonl" or int(m[1]) not in files):  # a rank's log wins over a former-format index
                files[int(m[1])] = p
        rebuild = files.keys() != self._logs.keys()
        self._logs = {r: log for r, log in self._logs.items() if r in files and log.path == files[r]}
        added = []
        for r in sorted(files):
            log = self._logs.setdefault(r, _Log(files[r]))
            new = log.refresh(self)
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
        if (self.path / "meta.json").exists():
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
        if mp.exists():
            self.check_resume()
            return self.read_meta()
        meta = {"format": FORMAT, "library_version": library_version(), **self.meta}
        _atomic_write_bytes(mp, json.dumps(meta, indent=1).encode())
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
        while (self.path / f"rank{self.rank:05d}/chunk{n_chunk:06d}").exists():  # an orphan: never reused
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
            _atomic_write_bytes(self.path / rel, data)
            digest = hashlib.sha256(data).hexdigest()
            for j, i in enumerate(idx):
                r = records[i]
                new_entries[i] = {
                    "key": key_str(r.key), "sample": r.sample, "part": r.part, "layer": r.layer, "step": r.step,
                    "mode": r.mode, "heads": r.heads, "seq_len": r.seq_len, "query_stride": r.query_stride,
                    "key_stride": r.key_stride, "file": rel, "slot": j, "arrays": sorted(r.data), "sha256": digest,
                    "spans": r.spans.to_json() if r.spans is not None else None, "meta": r.meta}
        self._append(self.rank, {"keys": keys, "mode": records[0].mode}, new_entries)
        return len(records)

    def _append(self, rank: int, head: dict, records: list) -> None:
        """Commit one line to ``rank``'s log, its writer lock held and the index just refreshed: an index of the
        former format is converted first (written whole, then removed), a torn last line is cut off."""
        p, log = self._index_path(rank), self._logs.get(rank)
        if log is not None and log.path != p:
            _atomic_write_bytes(p, "".join(text + "\n" for _, text in log.lines).encode())
            log.path.unlink()
        elif log is not None:
            log.cut()
        _append_line(p, (_line(head, records) + "\n").encode())

    # ---- reading -------------------------------------------------------------------------------
    def read_meta(self) -> dict:
        mp = self.path / "meta.json"
        if not mp.exists():
            raise StoreError(f"{self.path} has no meta.json: not a store, or nothing was written yet")
        try:
            meta = json.loads(mp.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{mp} is corrupt ({e}): it only describes the store (model, dtype); rewrite it as "
                             f'{{"model": "<name>"}} or capture again into a new folder') from e
        if not isinstance(meta, dict):
            raise StoreError(f"{mp} holds a {type(meta).__name__}, not an object: rewrite it as {{\"model\": \"<name>\"}}")
        return meta

    def _open(self, rel: str, digest: str | None = None):
        fix = (f"Run Store({str(self.path)!r}).repair() to drop its records from the index (the other records stay "
               f"readable), then run the capture again: a resumed capture recaptures exactly those samples")
        p = inside(self.path, rel)  # None for "..", an absolute path, a symlink out of the store, a non-string
        if p is None:  # a damaged record: never opened, renamed or deleted
            raise StoreError(f"the index lists {rel!r}, a path outside {self.path}: a hand-edited or damaged index. "
                             f"It is never opened. {fix}")
        if not p.exists():
            raise StoreError(f"file {rel} listed in the index is missing from {self.path}. {fix}")
        if not p.is_file():
            raise StoreError(f"{rel} listed in the index is not a file in {self.path} (a folder?). {fix}")
        data = p.read_bytes()
        if digest and hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"file {rel} in {self.path} is corrupt (checksum mismatch). {fix}")
        try:
            return np.load(io.BytesIO(data))
        except Exception as e:  # noqa: BLE001 - an unreadable archive without a recorded checksum
            raise StoreError(f"file {rel} in {self.path} cannot be read ({e}). {fix}") from e

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
        cache: dict[str, object] = {}
        out = []
        for e in ents:
            if e["file"] not in cache:
                cache[e["file"]] = self._open(e["file"], e.get("sha256"))
            z = cache[e["file"]]
            data = {n: torch.from_numpy(z[f"r{e['slot']}__{n}"]) for n in e["arrays"]}
            out.append(Record(
                sample=e["sample"], layer=e["layer"], part=e["part"], mode=e["mode"], data=data,
                spans=Spans.from_json(e["spans"]) if e["spans"] else None, step=e["step"], seq_len=e["seq_len"],
                heads=e["heads"], query_stride=e["query_stride"], key_stride=e["key_stride"], meta=e.get("meta", {})))
        return out

    def damaged(self) -> dict[str, list[str]]:
        """Damaged records: ``{file: [record keys]}`` for every indexed file that is missing, unreadable or fails its
        checksum. Reads every file once (use it to check a store, not in a loop)."""
        by_file: dict[str, list[dict]] = {}
        for e in self.index():
            by_file.setdefault(e["file"], []).append(e)
        out = {}
        for f, ents in by_file.items():
            try:
                z = self._open(f, ents[0].get("sha256"))
                names = set(z.files)
                if any(f"r{e['slot']}__{n}" not in names for e in ents for n in e["arrays"]):
                    raise StoreError("arrays missing")
            except StoreError:
                out[f] = [e["key"] for e in ents]
        return out

    def _named_chunks(self) -> set[str]:
        """Every chunk folder a line of any log names (its records live, dropped or in conflict): never an orphan."""
        used = set()
        for _, log in sorted(self._logs.items()):
            for _, text in log.lines:
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                recs = line[1] if isinstance(line, list) and len(line) == 2 and isinstance(line[1], list) else []
                used |= {str(e["file"]).rsplit("/", 1)[0] for e in recs if isinstance(e, dict) and "file" in e}
        return used

    def _leftovers(self) -> list[Path]:
        """Traces of interrupted writes: temporary files and chunk folders no line of any index names."""
        with self._guard:
            self._current()
        used = self._named_chunks()
        tmp = sorted(self.path.rglob(".*.tmp"))
        # a chunk whose every record was damaged keeps its *.damaged files (repair's promise): not an orphan
        orphans = [d for d in sorted(self.path.glob("rank*/chunk*"))
                   if d.relative_to(self.path).as_posix() not in used and not any(d.glob("*.damaged"))]
        return tmp + orphans

    def verify(self) -> list[str]:
        """Problems found, one line each: damaged records (missing or corrupt files, with their record keys) and
        leftovers of interrupted writes (ignored by readers; :meth:`repair` removes them). A leftover of a rank that a
        live process is writing right now is reported as a write in flight, not as damage. Empty when the store is
        sound. Records listed twice (a hand-edited log) are reported, each naming its file and line; nothing else is
        checked until they are mended."""
        with self._guard:
            self._refresh()
            conflicts = self._conflicts()
        if conflicts:
            return [f"{c}: delete the line that should not be there (a hand-edited or damaged index); reads are refused "
                    f"until then" for c in conflicts]
        problems = []
        for f, keys in self.damaged().items():
            problems.append(f"damaged file {f}: {len(keys)} record(s) unreadable ({', '.join(keys[:3])}"
                            f"{', ...' if len(keys) > 3 else ''}); Store.repair() drops them so a resumed capture "
                            f"recaptures them")
        writing = {}

        def live(rank) -> dict | None:  # another live process that holds the rank's writer lock, if any
            if rank not in writing:
                lock = self._lock_path(rank) if rank is not None else None
                writing[rank] = None if lock is None or held_here(lock) else holder_if_held(lock)
            return writing[rank]

        def in_flight(what: str, rank) -> str:
            return (f"{what}: possibly a write in flight, not damage (rank {rank} is held by a live writer, "
                    f"{describe(live(rank))}); check again once it has closed the store")

        for p in self._leftovers():
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

    def repair(self) -> list[str]:
        """Make a damaged store whole again: drop damaged records from the index (their files are kept, renamed
        ``*.damaged``), delete leftovers of interrupted writes. Refused (StoreLockedError) while another process writes
        any rank. Afterwards :meth:`missing` lists the dropped samples and a resumed capture recaptures them. Returns
        the record keys dropped. A store whose logs list a record twice is refused (StoreError): which line is right is
        for a person to decide, and nothing is deleted."""
        self._refresh()
        if self._conflicts():
            raise StoreError(f"{self._conflicts()[0]}: repair() does not guess which line is right and deletes nothing. "
                             f"Delete the line that should not be there (Store.verify() lists them all), then repair")
        ranks = sorted(set(self._logs) | {int(p.name[len(".lock-rank"):]) for p in self.path.glob(".lock-rank*")
                                          if p.name[len(".lock-rank"):].isdigit()})
        locks = []
        try:
            for r in ranks:  # nobody else may write while we decide what is an orphan
                locks.append(_locked(self._lock_path(r), f"rank {r} of store {self.path}"))
            bad = self.damaged()
            dropped = self.drop([k for keys in bad.values() for k in keys])
            for f in bad:
                p = inside(self.path, f)  # a path outside the store is dropped from the index, never touched
                if p is not None and (p.exists() or p.is_symlink()):
                    os.replace(p, p.with_name(p.name + ".damaged"))
            for p in self._leftovers():  # (brings the index up to date)
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            for log in self._logs.values():
                log.cut()
            return dropped
        finally:
            for lk in locks:
                lk.release()


def remove_store(path) -> bool:
    """Delete the store folder ``path`` (a notebook's own output of an earlier run), refused with
    :class:`StoreLockedError` while another process writes to it, and refused for a folder that holds anything but a
    store. A writer of this process is released first (re-running a notebook cell). Returns True if something was
    removed."""
    p = Path(path)
    if p.is_symlink():
        raise StoreError(f"{p} is a symbolic link (to {os.path.realpath(p)}): not removed. Remove the link with "
                         f"os.unlink({str(p)!r}), or call remove_store on the folder it points to")
    if not p.exists():
        return False
    if not p.is_dir():
        raise StoreError(f"{p} is a file, not a store folder; remove it yourself if it is yours")
    def ours(q: Path) -> bool:
        n = q.name
        return (n == "meta.json" or n.startswith(("index-rank", ".lock-rank")) or (n.startswith(".") and n.endswith(".tmp"))
                or (q.is_dir() and n.startswith("rank")))
    other = [q.name for q in p.iterdir() if not ours(q)]
    if other:
        raise StoreError(f"{p} holds more than a store ({', '.join(sorted(other)[:5])}): not removed. Point OUT_DIR to "
                         f"a folder of its own")
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
