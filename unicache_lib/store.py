"""A sharded, append-only store of capture records.

Layout of a store directory::

    meta.json                       model id, dtype, library version (written once, checked after)
    index-rank00000.json            the records one writer (rank) has committed
    rank00000/chunk000000/L0003_language.npz   one compressed file per layer and chunk

Every write is one *chunk*: its layer files are written to temporary names and renamed into
place, then the rank's index is replaced atomically (``os.replace``). A write interrupted at any
point leaves the previous index, and so the previous store, intact; an orphaned chunk folder is
ignored (``verify`` reports it). A record key (sample, part, layer, step) can be written once:
writing it again raises instead of silently overwriting, and ``missing`` tells a resumed capture
what is left to do. Several processes (``torchrun`` / ``accelerate launch`` ranks) write their own
index and folders; readers merge all indexes and refuse duplicates.

One writer per rank: the first write takes an exclusive OS lock (``.lock-rank00000``, see
:mod:`unicache_lib.locks`) held until :meth:`Store.close` (or the object is dropped, or the process
ends or crashes); a second process writing the same rank is refused with the holder's pid, host and
start time. :func:`remove_store` deletes a store only when no other process writes to it.

Damage: :meth:`Store.damaged` lists records whose file is missing or fails its checksum; reading
other records keeps working; :meth:`Store.repair` drops the damaged records from the index (their
files are kept, renamed ``*.damaged``) and removes leftovers of interrupted writes, so
:meth:`Store.missing` reports those samples and a resumed capture recaptures them.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from .capture.record import Record
from .locks import LockedError, acquire, forget, held_here
from .modality import Spans

FORMAT = 1


class StoreError(RuntimeError):
    """A store that is missing, corrupt, or would be overwritten."""


class StoreLockedError(StoreError, LockedError):
    """Another process is writing this store (the same rank). ``holder``: its pid, host, since, cmd."""

    def __init__(self, message: str, holder: dict):
        LockedError.__init__(self, message, holder)


_ENTRY_KEYS = {"key", "sample", "part", "layer", "step", "file", "slot", "arrays"}
_LOCK_ADVICE = ("Wait for it to finish or stop it (a JupyterLab kernel: call store.close() there or restart the kernel), "
                "or write to another folder (another OUT_DIR; a distributed capture gives each process its own rank).")


def _locked(path: Path, what: str):
    try:
        return acquire(path, what, _LOCK_ADVICE)
    except LockedError as e:
        raise StoreLockedError(str(e), e.holder) from None


def library_version() -> str:
    from . import __version__

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


class Store:
    """Read and append capture records.

    Args:
        path: the store directory (created on first write).
        rank: this writer's rank (each process of a distributed capture uses its own).
        meta: written to ``meta.json`` on first write (``model``, ``dtype``, anything else); a later
            writer with different ``model`` raises rather than mixing two models in one store.
    """

    def __init__(self, path, rank: int = 0, meta: dict | None = None):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a store folder: pass the folder a capture writes to "
                             f"(e.g. outputs/02_understanding_maps/stats)")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise TypeError(f"rank must be an int >= 0, got {rank!r}")
        self.rank = rank
        self.meta = dict(meta or {})
        self._lock = None

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
        """Release the writer lock (reading needs no lock). Also done when the object is dropped or the
        process ends."""
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
        return self.path / f"index-rank{self.rank if rank is None else rank:05d}.json"

    def _load_index(self, p: Path) -> dict:
        fix = (f"Move it aside (rename it to {p.name}.bad) and run the capture again: a resumed capture recaptures "
               f"every sample that no index lists")
        try:
            idx = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"index {p} is corrupt ({e}). {fix}") from e
        recs = idx.get("records") if isinstance(idx, dict) else None
        bad = not isinstance(recs, list) or any(not isinstance(e, dict) or not _ENTRY_KEYS <= e.keys() for e in recs)
        if bad:
            found = f"a {type(idx).__name__} with keys {sorted(idx)[:6]}" if isinstance(idx, dict) else type(idx).__name__
            raise StoreError(f"index {p} is not a store index (expected {{'records': [...]}} with one entry per record, "
                             f"found {found}). {fix}")
        return idx

    def _indexes(self) -> list[tuple[int, Path, list[dict]]]:
        """``(rank, index path, entries)`` of every rank's index."""
        out = []
        for p in sorted(self.path.glob("index-rank*.json")):
            try:
                rank = int(p.name[len("index-rank"):-len(".json")])
            except ValueError:
                continue
            out.append((rank, p, self._load_index(p)["records"]))
        return out

    def index(self) -> list[dict]:
        """Every committed record's entry, merged over all ranks."""
        if not self.path.exists():
            raise StoreError(f"no store at {self.path}: run a capture that writes to it first")
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a store folder")
        entries, seen = [], {}
        for _, p, recs in self._indexes():
            for e in recs:
                k = e["key"]
                if k in seen:
                    raise StoreError(f"record {k} is in both {seen[k]} and {p.name}: two ranks captured the "
                                     f"same sample; give each rank a disjoint slice (shard_samples)")
                seen[k] = p.name
                entries.append(e)
        return entries

    def _own_entries(self) -> list[dict]:
        p = self._index_path()
        return self._load_index(p)["records"] if p.exists() else []

    def keys(self) -> set[str]:
        try:
            return {e["key"] for e in self.index()}
        except StoreError:
            if not self.path.exists():
                return set()
            raise

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
            other = sorted({e["mode"] for e in self.index()} - {mode})
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
        with self._writer_lock().mutex:
            return self._write(records)

    def _write(self, records: list[Record]) -> int:
        self._check_meta()
        modes = {r.mode for r in records}
        if len(modes) > 1:
            raise StoreError(f"one write mixes capture modes {sorted(modes)}: one store holds one mode")
        self.check_resume(mode=next(iter(modes)))
        have = self.keys()
        keys = [key_str(r.key) for r in records]
        dup = [k for k in keys if k in have] or [k for i, k in enumerate(keys) if k in keys[:i]]
        if dup:
            raise StoreError(f"{len(dup)} record(s) already stored, e.g. {dup[0]!r}; stored data is never "
                             f"overwritten: skip them (Store.missing) or write to a new directory")
        own = self._own_entries()
        n_chunk = len({e["file"].split("/")[1] for e in own})
        chunk = f"rank{self.rank:05d}/chunk{n_chunk:06d}"
        while (self.path / chunk).exists():  # an orphan from an interrupted write: never reuse it
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
                    "key": key_str(r.key), "sample": r.sample, "part": r.part, "layer": r.layer,
                    "step": r.step, "mode": r.mode, "heads": r.heads, "seq_len": r.seq_len,
                    "query_stride": r.query_stride, "key_stride": r.key_stride, "file": rel, "slot": j,
                    "arrays": sorted(r.data), "sha256": digest,
                    "spans": r.spans.to_json() if r.spans is not None else None, "meta": r.meta,
                }
        index = {"format": FORMAT, "rank": self.rank, "records": own + new_entries}
        _atomic_write_bytes(self._index_path(), json.dumps(index).encode())
        return len(records)

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

    def _inside(self, rel) -> Path | None:
        """``self.path / rel`` when ``rel`` names a file of this store (a relative path that stays inside it, also
        after symlinks are resolved); None for ``..``, an absolute path, a symlink that leaves the store, or not a
        string. An index entry naming such a path is a damaged record: never opened, renamed or deleted."""
        if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            return None
        p = self.path / rel
        try:
            p.resolve().relative_to(self.path.resolve())
        except ValueError:
            return None
        return p

    def _open(self, rel: str, digest: str | None = None):
        fix = (f"Run Store({str(self.path)!r}).repair() to drop its records from the index (the other records stay "
               f"readable), then run the capture again: a resumed capture recaptures exactly those samples")
        p = self._inside(rel)
        if p is None:
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
        ents = [e for e in self.index()
                if (sample is None or e["sample"] == str(sample)) and (layer is None or e["layer"] == layer)
                and (part is None or e["part"] == part) and (step is None or e["step"] == step)]
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
                heads=e["heads"], query_stride=e["query_stride"], key_stride=e["key_stride"], meta=e.get("meta", {}),
            ))
        return out

    def damaged(self) -> dict[str, list[str]]:
        """Damaged records: ``{file: [record keys]}`` for every indexed file that is missing, unreadable or
        fails its checksum. Reads every file once (use it to check a store, not in a loop)."""
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

    def _leftovers(self) -> list[Path]:
        """Traces of interrupted writes: temporary files and chunk folders no index lists."""
        used = {str(e["file"]).rsplit("/", 1)[0] for e in self.index()}
        tmp = sorted(self.path.rglob(".*.tmp"))
        # a chunk whose every record was damaged keeps its *.damaged files (repair's promise): not an orphan
        orphans = [d for d in sorted(self.path.glob("rank*/chunk*"))
                   if d.relative_to(self.path).as_posix() not in used and not any(d.glob("*.damaged"))]
        return tmp + orphans

    def verify(self) -> list[str]:
        """Problems found, one line each: damaged records (missing or corrupt files, with their record
        keys) and leftovers of interrupted writes (ignored by readers; :meth:`repair` removes them).
        Empty when the store is sound."""
        problems = []
        for f, keys in self.damaged().items():
            problems.append(f"damaged file {f}: {len(keys)} record(s) unreadable ({', '.join(keys[:3])}"
                            f"{', ...' if len(keys) > 3 else ''}); Store.repair() drops them so a resumed capture "
                            f"recaptures them")
        for p in self._leftovers():
            rel = p.relative_to(self.path).as_posix()
            problems.append(f"orphaned chunk {rel} (an interrupted write); it is ignored, Store.repair() removes it"
                            if p.is_dir() else f"temporary file {rel} left by an interrupted write; it is ignored, "
                            f"Store.repair() removes it")
        return problems

    def drop(self, keys) -> list[str]:
        """Remove the records ``keys`` (``"sample|part|layer|step"``) from their ranks' indexes, atomically
        per index, under each rank's writer lock. Their data files stay on disk. Returns the keys dropped."""
        keys = set(keys)
        dropped = []
        for rank, p, _ in self._indexes():
            lock = _locked(self._lock_path(rank), f"rank {rank} of store {self.path}")
            try:
                with lock.mutex:
                    idx = self._load_index(p)
                    keep = [e for e in idx["records"] if e["key"] not in keys]
                    if len(keep) < len(idx["records"]):
                        dropped += [e["key"] for e in idx["records"] if e["key"] in keys]
                        _atomic_write_bytes(p, json.dumps({**idx, "records": keep}).encode())
            finally:
                lock.release()
        return dropped

    def repair(self) -> list[str]:
        """Make a damaged store whole again: drop damaged records from the index (their files are kept,
        renamed ``*.damaged``), delete leftovers of interrupted writes. Refused (StoreLockedError) while
        another process writes any rank. Afterwards :meth:`missing` lists the dropped samples and a
        resumed capture recaptures them. Returns the record keys dropped."""
        ranks = sorted({r for r, _, _ in self._indexes()}
                       | {int(p.name[len(".lock-rank"):]) for p in self.path.glob(".lock-rank*")
                          if p.name[len(".lock-rank"):].isdigit()})
        locks = []
        try:
            for r in ranks:  # nobody else may write while we decide what is an orphan
                locks.append(_locked(self._lock_path(r), f"rank {r} of store {self.path}"))
            bad = self.damaged()
            dropped = self.drop([k for keys in bad.values() for k in keys])
            for f in bad:
                p = self._inside(f)  # a path outside the store is dropped from the index, never touched
                if p is not None and (p.exists() or p.is_symlink()):
                    os.replace(p, p.with_name(p.name + ".damaged"))
            for p in self._leftovers():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            return dropped
        finally:
            for lk in locks:
                lk.release()


def remove_store(path) -> bool:
    """Delete the store folder ``path`` (a notebook's own output of an earlier run), refused with
    :class:`StoreLockedError` while another process writes to it, and refused for a folder that holds
    anything but a store. A writer of this process is released first (re-running a notebook cell).
    Returns True if something was removed."""
    p = Path(path)
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
        raise ValueError(f"rank {rank} outside world size {world_size}")
    return list(samples)[rank::world_size]
