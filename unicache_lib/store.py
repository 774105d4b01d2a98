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
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from .capture.record import Record
from .modality import Spans

FORMAT = 1


class StoreError(RuntimeError):
    """A store that is missing, corrupt, or would be overwritten."""


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
        self.rank = int(rank)
        self.meta = dict(meta or {})

    # ---- index ---------------------------------------------------------------------------------
    def _index_path(self, rank: int | None = None) -> Path:
        return self.path / f"index-rank{self.rank if rank is None else rank:05d}.json"

    def _load_index(self, p: Path) -> dict:
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise StoreError(f"index {p} is corrupt ({e}); restore it from a backup or delete the store "
                             f"and capture again") from e

    def index(self) -> list[dict]:
        """Every committed record's entry, merged over all ranks."""
        if not self.path.exists():
            raise StoreError(f"no store at {self.path}: run a capture that writes to it first")
        entries, seen = [], {}
        for p in sorted(self.path.glob("index-rank*.json")):
            for e in self._load_index(p)["records"]:
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
    def _check_meta(self):
        mp = self.path / "meta.json"
        if mp.exists():
            old = json.loads(mp.read_text())
            for k in ("model",):
                if k in self.meta and k in old and self.meta[k] != old[k]:
                    raise StoreError(f"store {self.path} holds {k}={old[k]!r}, this capture is {self.meta[k]!r}: "
                                     f"write to another directory")
            return old
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
        self._check_meta()
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
        return json.loads(mp.read_text())

    def _open(self, rel: str, digest: str | None = None):
        p = self.path / rel
        if not p.exists():
            raise StoreError(f"file {rel} listed in the index is missing from {self.path}: restore it, or delete "
                             f"its records and capture those samples again")
        data = p.read_bytes()
        if digest and hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"file {rel} in {self.path} is corrupt (checksum mismatch): capture its samples again")
        return np.load(io.BytesIO(data))

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

    def verify(self) -> list[str]:
        """Problems found (missing / corrupt files, orphaned chunks); empty when the store is sound."""
        problems, used = [], set()
        for e in self.index():
            used.add(e["file"].rsplit("/", 1)[0])
            try:
                self._open(e["file"], e.get("sha256"))
            except StoreError as err:
                problems.append(str(err))
        for d in sorted(self.path.glob("rank*/chunk*")):
            rel = d.relative_to(self.path).as_posix()
            if rel not in used:
                problems.append(f"orphaned chunk {rel} (an interrupted write); it is ignored and can be deleted")
        return sorted(set(problems))


def shard_samples(samples: list, rank: int, world_size: int) -> list:
    """The slice of ``samples`` that ``rank`` of ``world_size`` captures (round-robin, disjoint)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    return list(samples)[rank::world_size]
