"""A sharded, append-only store of capture records.

Layout of a store directory::

    meta.json                       model id, dtype, library version (written once, checked after)
    index-rank00000.jsonl           the chunks one writer (rank) has committed: an append-only log, a line each
    rank00000/chunk000000/L0003_language.npz   one compressed file per layer and chunk (its records' arrays and
                                               what it holds at each slot)
    rank00000/chunk000000/committed            empty, written once the chunk's index line is

Every write is one *chunk*: its layer files are written to temporary names and renamed into place, then one line
listing its records is appended to the rank's index and fsync'd. That line is the commit (the chunk's ``committed``
marker follows it, so a chunk whose index was later set aside is never taken for a cut-off write). A write interrupted
before it leaves the previous store intact: an orphaned chunk folder is ignored (``verify`` reports it; ``repair``
removes it once every record it holds is live again as the same record, arrays equal bit for bit), and a write
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
is refused before it is opened, a name no file can have is refused as such; each in one line. Every read is bounded by
what the format holds (an index line :data:`MAX_LINE_BYTES`, ``meta.json`` :data:`MAX_META_BYTES`, a chunk file the
size its entry gives and :data:`MAX_CHUNK_BYTES` at most; Store.write keeps to the same bounds), so a sparse file
grown to 100 GB is refused in one line instead of filling memory.

A line's records must name files of the chunk folder that line's head names, and each chunk file records, in its
array ``__records__``, what it holds at each slot (key, spans, seq_len, strides, meta, array names): an entry is read
only when it says exactly that, so which line wrote a chunk is decided by content, never by the order of the lines.
A hand-made line aliasing another line's record (before or after it), two entries with swapped slots or files, an
edited ``spans`` or ``seq_len``, or a checksum or size that is not its file's is refused when read, reported by
:meth:`Store.verify` and dropped by :meth:`Store.repair`, which never drops a record that a sound line names nor
renames a sound file. A store written before files recorded their records still reads; there, two lines naming one
chunk cannot be told apart, so neither is read and ``repair()`` deletes nothing until a person deletes one.
:func:`remove_store` removes only the names a store gives its own files, at every depth.
"""
import contextlib
import functools
import hashlib
import io
import itertools
import json
import numbers
import os
import re
import shutil
import stat
import threading
from pathlib import Path

import numpy as np
import torch

from . import __version__
from .capture.record import Record
from .core.errors import InputError, InputTypeError, MissingFileError, StoreError, StoreLockedError
from .core.modality import Spans
from .core.untrusted import (file_kind, folder_inside, name_problem, open_inside, read_inside, stat_inside,
                             too_big, write_inside)
from .locks import LockedError, acquire, describe, forget, held_here, holder_if_held

FORMAT = 1


_ENTRY_KEYS = {"key", "sample", "part", "layer", "step", "file", "slot", "arrays", "mode", "heads", "seq_len",
               "query_stride", "key_stride", "spans"}  # every field Store.write gives an entry ("meta", "sha256",
#                                                         "bytes" too)
# What a chunk file records of each of its records (the array "__records__": one JSON object per slot, in slot order),
# so an entry is read only when it describes the record its file and slot hold: a record key, spans or seq_len edited
# in the index, or two entries' slots or files swapped, never read as the other record.
_BOUND = ("key", "sample", "part", "layer", "step", "mode", "heads", "seq_len", "query_stride", "key_stride", "arrays",
          "spans", "meta")
_RECORDS = "__records__"
_MARKED = "__marked__"  # in a chunk file whose write leaves a committed marker once its index line is written
# Bounds on every read, from what the format holds: the store never reads more than these from a file it did not write
# (a sparse file grown by `truncate -s 100G` reads as 100 GB of zeros).
MAX_LINE_BYTES = 64 << 20  # an index line (Store.write refuses to commit a longer one): a torn tail is shorter too
MAX_META_BYTES = 1 << 20  # meta.json (Store.write refuses to write a bigger one)
_META_FIX = ("It records which model wrote the records (model_config, dtype), so a resume can be checked: restore it "
             "from a copy, or capture again into a new folder")  # (a hand-written one names no model_config: refused)
MAX_CHUNK_BYTES = 16 << 30  # a chunk file (Store.write refuses to write a bigger one)
_READ_WHOLE = 64 << 20  # a chunk file larger than this is read into memory only once its SHA-256 matches its entry's
_BLOCK = 1 << 20
_MAX_POSITIONS = 1 << 24  # spans longer than any sequence a model takes: a hand-edited index, never expanded
_LOCK_ADVICE = ("Wait for it to finish or stop it (a JupyterLab kernel: call store.close() there or restart the kernel), "
                "or write to another folder (another OUT_DIR; a distributed capture gives each process its own rank).")


def _links_fix(path: Path) -> str:
    return (f"A store makes its own files and folders and never a symbolic link, FIFO or device: remove this one "
            f"(os.unlink({str(path)!r}); what it points to is not touched) and try again")


def _check_name(path) -> None:
    """Refuse a store path no folder can have (a NUL byte, a part over 255 bytes), before the OS is asked."""
    if (why := name_problem(path)):
        raise InputError(f"store folder {str(path)!r:.100} {why}: pass a folder such as outputs/02_understanding_maps")


def _locked(path: Path, what: str):
    stat_inside(path.parent, path.name, write=True, error=StoreError, what="lock file", fix=_links_fix(path))
    try:
        return acquire(path, what, _LOCK_ADVICE)
    except LockedError as e:
        raise StoreLockedError(str(e), e.holder) from None


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`~unicache_lib.core.untrusted.write_inside`: a temporary file
    beside it, fsync'd, mode 0644, renamed over it; never written through a symbolic link), its folder created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_inside(path.parent, path.name, data)


def key_str(key: tuple) -> str:
    sample, part, layer, step = key
    return f"{sample}|{part}|{layer}|{step}"


_INDEX_NAME = re.compile(r"index-rank(\d{5,})\.jsonl")  # a rank's log (the name _index_path gives it)
_HEAD = json.JSONDecoder().raw_decode
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark (Notepad's): a store never writes one
_BLANK = b" \t\r"  # the JSON whitespace a line may hold besides its newline


def _index_fix(p: Path) -> str:
    return (f"Move it aside (rename it to {p.name}.bad) and run the capture again: a resumed capture recaptures "
            f"every sample that no index lists")


def _index_blocks(path: Path, offset: int):
    """The bytes of ``path`` from ``offset`` on, in blocks of at most 1 MiB: the only way an index is read (a regular
    file of the store folder, never through a symbolic link, never a FIFO or device). The reader parses each line as
    it arrives, so it never holds more than one line beside what it keeps."""
    fd = open_inside(path.parent, path.name, links=False, error=StoreError, what="index", fix=_index_fix(path))
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while block := os.read(fd, _BLOCK):
            yield block
    finally:
        os.close(fd)


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
            and _int(e.get("bytes", 0)) and e.get("bytes", 0) >= 0
            and e["key"] == key_str((e["sample"], e["part"], e["layer"], e["step"])))


def _canon(x) -> str:
    """``x`` as canonical JSON text (keys sorted), so an entry and what its file recorded compare as data."""
    return json.dumps(x, sort_keys=True, separators=(",", ":"), allow_nan=True)


def _npy_digest(a: np.ndarray) -> str:
    """SHA-256 of the array as a chunk file holds it (its ``.npy`` member: header, dtype, shape and bytes)."""
    buf = io.BytesIO()
    np.save(buf, a)
    return hashlib.sha256(buf.getbuffer()).hexdigest()


def _npy_shape(z, name: str) -> tuple | None:
    """The shape of the array ``name`` of the archive ``z``, from its header alone (None when it cannot be read)."""
    try:
        with z.zip.open(name + ".npy") as fp:
            header = (np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(fp) == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            return tuple(header(fp)[0])
    except Exception:  # noqa: BLE001 - a member that is not an array: its read says why
        return None


def _shape_problem(e: dict, z) -> str | None:
    """Why the fields of entry ``e`` cannot describe the arrays of a file written before files recorded their records
    (a hand-edited spans or seq_len), or None. What every capture writes: spans cover seq_len positions (the keys), and
    a full map is [heads, queries, seq_len / key_stride] (rounded up)."""
    total = sum(r[1] for r in (e["spans"] or {}).get("runs") or [])
    if e["spans"] and e["seq_len"] > 0 and total != e["seq_len"]:
        return f"gives spans covering {total} positions and seq_len {e['seq_len']}, which a capture never writes"
    if e["mode"] == "full" and "probs" in e["arrays"]:
        shape = _npy_shape(z, f"r{e['slot']}__probs")
        if shape is not None and len(shape) == 3:
            if e["heads"] > 0 and shape[0] != e["heads"]:
                return f"gives heads {e['heads']} for a map of {shape[0]} heads"
            if e["seq_len"] > 0 and e["key_stride"] > 0 and shape[2] != -(-e["seq_len"] // e["key_stride"]):
                return (f"gives seq_len {e['seq_len']} (key_stride {e['key_stride']}) for a map of {shape[2]} keys")
    return None


class _Log:
    """One rank's index as a :class:`Store` last read it. ``lines``: ``(head, text)`` of each line, in order (the
    text is parsed when a record of it is read); ``live``: record key -> its line, in index order; ``samples``:
    sample -> the lines that hold it; ``end``: the byte after the last whole line; ``torn``: bytes after it;
    ``claimants``: chunk folder -> the lines that name it (Store.write gives each line a folder of its own: two are a
    hand-made line, and which wrote the folder is decided by what its files recorded, never by order); ``refused``:
    record key -> why its entry is never read (found when its line is parsed); ``open``: the last line read is whole
    but has no newline yet (``end`` is its last byte's end), ``pad`` the spaces, tabs and CRs that end it (cut() drops
    them before the newline); ``folder``: rank00000, the folder every chunk of this log lies in; ``conflicts``: a key
    listed twice (in one line, or again while live): refused, not guessed; ``claims``: the chunk folder of each line
    looked at so far (None: a drop line)."""

    def __init__(self, path: Path):
        self.path, self.sig, self.end, self.torn, self.last, self.open, self.pad = path, None, 0, 0, b"", False, 0
        self.folder = path.name[len("index-"):-len(".jsonl")]
        self.lines: list[tuple[dict, str]] = []
        self.live, self.samples, self.claimants, self.refused = {}, {}, {}, {}
        self.modes, self.chunks, self.conflicts, self.claims = set(), 0, [], []

    def refresh(self) -> list[str] | None:
        """Read what the file gained since the last call. Returns the keys it added, or None when anything else
        changed (records dropped, the file replaced or rewritten). Lines are parsed as they are read, one at a time;
        a line (or a torn tail) longer than :data:`MAX_LINE_BYTES` is refused before more of it is read."""
        st = stat_inside(self.path.parent, self.path.name, links=False, error=StoreError, what="index",
                         fix=_index_fix(self.path))
        if st is None:
            raise MissingFileError(f"index {self.path} was removed while it was read")
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self.sig:
            return []
        ok = self.sig is not None and self.sig[:2] == sig[:2] and st.st_size >= self.end
        start = b""
        if ok:  # the bytes before self.end must be the ones read last time (else the file was rewritten)
            blocks = _index_blocks(self.path, self.end - len(self.last))
            for block in blocks:
                start += block
                if len(start) >= len(self.last):
                    break
            ok, start = start.startswith(self.last), start[len(self.last):]
            if ok and self.open and not start:
                start = next(blocks, b"")
            if ok and self.open and start[:1] == b"\n":  # the newline the whole last line lacked: it ends there
                start, self.end, self.open, self.pad = start[1:], self.end + 1, False, 0
                self.last = (self.last + b"\n")[-64:]
            elif not ok or (self.open and start):  # rewritten, or bytes glued to a line read as whole: the file was
                blocks.close()  # not written by a store
                ok = False
        fresh = not ok
        if fresh:  # not just appended to: read it all again
            self.__init__(self.path)
            blocks, start = _index_blocks(self.path, 0), b""
        taken = []  # (a drop line, the keys it adds) of each line read
        pending = bytearray(start)
        for block in itertools.chain([b""], blocks):
            pending += block
            pos = 0
            while True:
                nl = pending.find(b"\n", pos)
                if nl < 0:
                    break
                raw = bytes(pending[pos:nl])  # lines end at "\n" only (U+2028 inside a string is text)
                if len(raw) > MAX_LINE_BYTES:
                    raise self._too_long()
                taken.append(self._take(raw))
                self.end += nl - pos + 1
                self.last = (self.last + raw[-64:] + b"\n")[-64:]
                pos = nl + 1
            del pending[:pos]
            if len(pending) > MAX_LINE_BYTES:
                raise self._too_long()
        if b"\r[" in pending:  # lines that end in a CR only (an old-Mac conversion): no line is whole; never cut them
            raise StoreError(f"index {self.path}: its lines end in a carriage return only (\\r, an old Mac's line end), "
                             f"so none can be read; nothing was changed: convert them back, python -c \"import pathlib; "
                             f"p = pathlib.Path('{self.path}'); p.write_bytes(p.read_bytes().replace(b'\\r', b'\\n'))\"")
        if pending and (self._whole(bytes(pending)) or pending.startswith(_BOM)):
            # a whole line that only lacks its newline (trailing spaces or a CR after it too): a record, not torn; a
            # tail that starts with a byte-order mark is no store's write either (_take refuses it, naming the fix)
            raw = bytes(pending)
            taken.append(self._take(raw))
            self.end += len(raw)
            self.last = (self.last + raw[-64:])[-64:]
            self.open, self.pad, pending = True, len(raw) - len(raw.rstrip(_BLANK)), b""
        dropped, added = any(d for d, _ in taken), [k for _, a in taken for k in a]
        if dropped:
            self.modes = {self.lines[n][0]["mode"] for n in set(self.live.values())}
        self.torn, self.sig = len(pending), sig
        return None if fresh or dropped else added

    @staticmethod
    def _whole(raw: bytes) -> bool:
        """Whether the tail ``raw`` (bytes after the last newline) is a whole index line: ``[head, records]`` parses
        to its last byte. A write cut off inside a line never does (no proper prefix of that array is JSON), so such
        a tail is the line an editor or a full disk left without its final newline (spaces, tabs or a CR after its
        ``]`` included; a leading byte-order mark too, which :meth:`_take` refuses naming the fix): its records are read and checked
        like any other line's (a chunk that fails its SHA-256 is damage, reported), never cut off."""
        raw = raw.removeprefix(_BOM).rstrip(_BLANK)  # JSON whitespace after the ``]`` (an editor's) is still the line
        if not raw.startswith(b"[{") or not raw.endswith(b"]"):
            return False
        try:
            line = json.loads(raw.decode())
        except (UnicodeDecodeError, ValueError, RecursionError):
            return False
        return isinstance(line, list) and len(line) == 2 and isinstance(line[0], dict) and isinstance(line[1], list)

    def _too_long(self) -> "StoreError":
        return StoreError(
            f"index {self.path}: the bytes from offset {self.end} on run past {MAX_LINE_BYTES >> 20} MiB without a line "
            f"end, longer than any line (or unfinished line) a store writes: a damaged file, or one grown by truncate "
            f"into zeros; it is not read further. Cut it there (os.truncate({str(self.path)!r}, {self.end}) keeps every "
            f"line before it; a resumed capture recaptures what the rest held), or {_index_fix(self.path)[0].lower()}"
            f"{_index_fix(self.path)[1:]}")

    def _take(self, raw: bytes) -> tuple[bool, list[str]]:
        """Parse the whole line ``raw`` (its head only): ``(a drop line, the keys it adds)``."""
        n = len(self.lines)
        if raw.startswith(_BOM):
            raise StoreError(
                f"line {n + 1} of index {self.path} starts with a UTF-8 byte-order mark (an editor such as Notepad "
                f"saved the file; a store never writes one), so it is not read and nothing is cut. Remove those 3 "
                f"bytes: "
                f"python -c \"import pathlib; p = pathlib.Path({str(self.path)!r}); b = p.read_bytes(); "
                f"p.write_bytes(b.replace(bytes.fromhex('efbbbf'), b''))\"; every line then reads as before")
        if not raw.strip(_BLANK):  # a blank line (an editor's) holds nothing: kept as a placeholder (line numbers stay)
            self.lines.append(({}, raw.decode("ascii")))
            return False, []
        try:
            text = raw.decode()
            head = _HEAD(text, 1)[0] if text.startswith("[{") else None
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self.corrupt(n, f"is corrupt ({' '.join(str(e).split())[:200]})") from None
        if isinstance(head, dict) and _strs(head.get("drop")):
            for k in head["drop"]:
                self.live.pop(k, None)
            self.lines.append((head, text))
            return True, []
        if isinstance(head, dict) and _strs(head.get("keys")) and isinstance(head.get("mode"), str) \
                and isinstance(head.get("chunk", ""), str):
            return False, self._add(head, text)
        raise self.corrupt(n, 'is corrupt: not a store index line ([{"keys": [...], "mode": ..., "chunk": ...}, '
                              '[records]])')

    def _add(self, head: dict, text: str) -> list[str]:
        n = len(self.lines)
        self.lines.append((head, text))
        seen = set()
        for k in head["keys"]:
            if k in seen or k in self.live:  # Store.write never does this: a hand-edited or damaged log
                self.conflicts.append(f"line {n + 1} of {self.path.name} lists record {k} " + (
                    "twice in that line" if k in seen else f"while line {self.live[k] + 1} still holds it"))
                continue  # the first entry stays the record: nothing is read from the second
            seen.add(k)
            self.live[k] = n
            s = self.samples.setdefault(k.rsplit("|", 3)[0], [])
            if not s or s[-1] != n:
                s.append(n)
        if head["keys"]:  # (a hand-made line without records holds no mode)
            self.modes.add(head["mode"])
        self.chunks += 1
        return head["keys"]

    def claim(self, n: int) -> str | None:
        """The chunk folder line ``n`` wrote: its head's ``chunk`` (a line written before heads named it: the folder of
        its first record); None for a drop line. Every line naming a folder is noted in ``claimants``."""
        while len(self.claims) < len(self.lines):
            head, text = self.lines[len(self.claims)]
            c = head.get("chunk") if "keys" in head else None
            if "keys" in head and c is None:  # parsed here once: a line of a log written before heads named the chunk
                try:
                    c = str(json.loads(text)[1][0]["file"]).rpartition("/")[0]
                except (ValueError, LookupError, TypeError):
                    c = None
            if c is not None:
                self.claimants.setdefault(c, []).append(len(self.claims))
            self.claims.append(c)
        return self.claims[n]

    def _problem(self, n: int, e: dict, folder: str | None, slots: dict) -> str | None:
        """Why the entry ``e`` of line ``n`` is not a record that line wrote, or None. Store.write gives every line a
        chunk folder of its own, in its rank's folder, and every record a slot of its own."""
        f, slot = e["file"], e["slot"]
        if (why := name_problem(f)):
            return f"names a file {f!r:.80} that {why}"
        if f.startswith("/") or ".." in f.split("/"):
            return f"names {f!r}, a path that points outside the store"
        if folder is None or f.rpartition("/")[0] != folder:
            return f"names {f!r}, outside the chunk folder {folder} its line wrote"
        if folder.rpartition("/")[0] != self.folder:
            return f"names a chunk of {folder}, outside {self.folder}/, the only folder {self.path.name} writes"
        if (f, slot) in slots:
            return f"names slot {slot} of {f!r}, which record {slots[f, slot]} of the same line holds"
        slots[f, slot] = e["key"]
        return None

    def entries(self, n: int) -> list[dict]:
        """The entries of line ``n`` still in the index (those it may not hold are noted in ``refused``)."""
        head, text = self.lines[n]
        try:
            line = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise self.corrupt(n, f"is corrupt ({' '.join(str(e).split())[:200]})") from None
        recs = line[1] if isinstance(line, list) and len(line) == 2 else None
        if not isinstance(recs, list) or any(not isinstance(e, dict) or not _ENTRY_KEYS <= e.keys() for e in recs) \
                or [e["key"] for e in recs] != head["keys"]:
            raise self.corrupt(n, "is corrupt: its records are not one entry per key of its head")
        if (bad := next((e["key"] for e in recs if not _entry_ok(e)), None)) is not None:
            raise self.corrupt(n, f"is corrupt: the entry of record {bad} has fields of the wrong type (layer, step, "
                                  f"slot, heads, seq_len and strides are whole numbers; sample, part, mode, file and "
                                  f"sha256 texts; bytes a whole number; spans runs of [0 or 1, length]; meta an "
                                  f"object) or a key that is not "
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

    def sharing(self, key: str) -> list[int]:
        """The other lines that name the chunk folder of the line holding ``key`` (none in a store Store.write made)."""
        n = self.live[key]
        folder = self.claim(n)
        return [m for m in self.claimants.get(folder, ()) if m != n] if folder is not None else []

    def corrupt(self, n: int, what: str) -> "StoreError":
        return StoreError(f"line {n + 1} of index {self.path} {what}. {_index_fix(self.path)}")

    def cut(self) -> None:
        """Cut a torn last line off (a write of this rank that was interrupted: the caller holds its lock); a whole
        last line without its newline gets the newline instead (its records stay; the spaces, tabs or CR after its
        ``]`` are dropped first, so the tail is what a store writes)."""
        if self.open and not self.torn:
            if self.pad:
                self._truncate(self.end - self.pad)
                self.end, self.last, self.pad = self.end - self.pad, self.last[:max(len(self.last) - self.pad, 0)], 0
            _append_line(self.path, b"\n")
            self.end, self.open, self.last = self.end + 1, False, (self.last + b"\n")[-64:]
            st = os.lstat(self.path)
            self.sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self.torn:
            self._truncate(self.end)
            self.torn = 0

    def _truncate(self, size: int) -> None:
        fd = _open_index(self.path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)


class Store(contextlib.AbstractContextManager):
    """Read and append capture records (a context manager: ``with Store(...) as s:`` closes it on exit).

    Args:
        path: the store directory (created on first write).
        rank: this writer's rank (each process of a distributed capture uses its own).
        meta: written to ``meta.json`` on first write (``model``, ``dtype``, anything else); a later writer with
            different ``model`` raises rather than mixing two models in one store.
    """

    def __init__(self, path, rank: int = 0, meta: dict | None = None):
        _check_name(path)
        self.path = Path(path).absolute()  # a later os.chdir must not move it under the lock of this one
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is a file, not a store folder: pass the folder a capture writes to "
                             f"(e.g. outputs/02_understanding_maps/stats)")
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:  # numpy's ints too
            raise InputTypeError(f"rank must be an int >= 0, got {rank!r}")
        self.rank, self.meta, self._lock = int(rank), dict(meta or {}), None
        # _logs: every rank's index as last read (see the module docstring); _owner: record key -> its rank, over all
        # ranks; _clash: the first key two ranks hold
        self._logs, self._owner, self._clash = {}, {}, None
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

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:  # (at interpreter shutdown modules may be gone: contextlib too)
            self.close()
        except Exception:  # noqa: BLE001
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
        files = {int(m[1]): p for p in self.path.glob("index-rank*")  # (index-rank0.jsonl is no rank's log)
                 if (m := _INDEX_NAME.fullmatch(p.name)) and p.name == self._index_path(int(m[1])).name}
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
        if (conflicts := self._conflicts()):
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
        """Samples of ``samples`` that lack any of ``layers`` (what a resumed capture still has to do). Both are lists:
        a text for either would be read as its characters (``missing("12", [0])`` asks about samples "1" and "2")."""
        if isinstance(samples, (str, bytes)) or not hasattr(samples, "__iter__"):
            raise InputTypeError(f"missing takes a list of samples, not {type(samples).__name__} {samples!r:.80}: pass "
                                 f"[{samples!r:.80}] (a text would be read as its characters)")
        layers = list(layers) if hasattr(layers, "__iter__") else [layers]  # one layer number: that layer
        # a layer of -1 is not the last (no record); int(0.7) would ask about layer 0 without a word
        if (odd := [x for x, low in [*((li, 0) for li in layers), (step, -1)]
                    if not isinstance(x, numbers.Integral) or isinstance(x, bool) or x < low]) or not isinstance(part, str):
            raise InputTypeError(f"missing takes whole numbers for layers (from 0) and step (-1: none) and a name for "
                                 f"part; got "
                                 f"{odd[0] if odd else part!r:.80}")
        have = self.keys()
        return [s for s in samples if any(key_str((str(s), part, int(li), step)) not in have for li in layers)]

    # ---- writing -------------------------------------------------------------------------------
    RESUME_KEYS = ("model", "dtype", "sample_seed", "model_config")  # meta fields a resumed capture must share with the store (the
    # standard sets of two seeds share their ids: a resume of another seed would skip every sample)

    def check_resume(self, mode: str | None = None) -> None:
        """Refuse to add to this store what does not belong beside what it holds: another model or weight dtype (its
        ``meta``) or records of another capture ``mode``. Capture calls it before deciding what is already done,
        so a resumed capture never mixes (nor silently skips samples stored in another mode). Raises
        :class:`StoreError` naming the difference and how to start a new store."""
        mp = self.path / "meta.json"  # (logs listed first: a writer writes meta.json before its first line)
        if os.path.isdir(self.path) and self._logs_on_disk() and not os.path.lexists(mp):
            raise StoreError(f"{mp} is missing but the store holds records: restore it, or capture into a new folder "
                             f"(a fresh one would name this capture's model over records of another); nothing was "
                             f"written")
        if os.path.lexists(mp):
            old = self.read_meta()
            for k in self.RESUME_KEYS:
                if k in self.meta and k in old and self.meta[k] != old[k]:
                    raise StoreError(f"store {self.path} holds {k}={old[k]!r}, this capture is {k}={self.meta[k]!r}: "
                                     f"one store holds one {k}" + (" (or, for a store captured before 2026-12-05, an "
                                     "older fingerprint of the same weights)" if k == "model_config" else "") +
                                     f". Write to a new folder, or remove_store({str(self.path)!r}) to start this one "
                                     "again")
            # what this capture names must be checkable: a capture's model_config against the store's (a meta naming
            # only "model" cannot check it); a model against a meta a store wrote (not one rewritten without it)
            if (k := max({"model", "model_config"} & set(self.meta), default=None)) and self._logs_on_disk() and (
                    k == "model_config" and k not in old or not {"model", "library_version"} & set(old)):
                raise StoreError(f"store {self.path} names no model (no {k!r} in its meta.json: its records are older "
                                 f"than captures recording theirs, or the file was rewritten), so a resume cannot tell "
                                 f"whether this model wrote them: write to a new folder, or "
                                 f"remove_store({str(self.path)!r}) to start it again")
        if mode is not None and self.path.exists():
            with self._guard:
                self._current()
                other = sorted({m for log in self._logs.values() for m in log.modes if m} - {mode})
            if other:
                raise StoreError(f"store {self.path} holds mode={other[0]!r} records, this capture is mode={mode!r}: "
                                 f"one store holds one capture mode. Write to a new folder (e.g. {self.path.name}-{mode}), "
                                 f"or remove_store({str(self.path)!r}) to start this one again")

    def _logs_on_disk(self) -> bool:
        return any(_own_name(n, 0) == "file" and ".jsonl" in n for n in os.listdir(self.path))

    def _check_meta(self):
        mp = self.path / "meta.json"
        self.check_resume()  # (refuses a meta.json missing beside records: a fresh one would name the wrong model)
        if os.path.lexists(mp):
            return self.read_meta()
        meta = {"format": FORMAT, "library_version": __version__, **self.meta}
        data = json.dumps(meta, indent=1).encode()
        if len(data) > MAX_META_BYTES:
            raise StoreError(f"the store's meta ({len(data)} bytes as JSON) is more than the {MAX_META_BYTES >> 10} KiB "
                             f"meta.json may hold: keep meta to what describes the store (model, dtype, sample set); "
                             f"nothing was written")
        write_inside(self.path, "meta.json", data, error=StoreError, what="file", fix=_links_fix(mp))
        return meta

    def write(self, records: list[Record]) -> int:
        """Append ``records`` as one chunk. Returns the number written. Raises :class:`StoreError` if a
        key is already stored (nothing is written then)."""
        if isinstance(records, Record) or isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
            raise InputTypeError(f"Store.write takes a list of Records, got {type(records).__name__}: pass [record]")
        if not (records := list(records)):
            return 0
        if (bad := next((r for r in records if not isinstance(r, Record)), None)) is not None:
            raise InputTypeError(f"Store.write takes a list of Records (unicache_lib.capture.record.Record), got a "
                                 f"{type(bad).__name__} in it; nothing was written")
        for r in records:  # what is stored is float32 (or bool): a cast that changes values is refused, not done
            if _odd_keys(r.meta) is not None:
                raise InputTypeError(f"record {r.key!r}: its meta holds a key that is not a text ({_odd_keys(r.meta)}), "
                                     f"which would read back as another (1 as '1'); nothing was written")
            for name, t in r.data.items():
                if not (isinstance(name, str) and name.isprintable() and name):  # it names the array in its file
                    raise InputTypeError(f"record {r.key!r}: array name {name!r:.80} is not a printable text; name it "
                                         f"e.g. 'probs'; nothing was written")
                if not isinstance(t, torch.Tensor):
                    raise InputTypeError(f"record {r.key!r}: array {name!r} is a {type(t).__name__}, not a torch "
                                         f"tensor; nothing was written")
                if t.dtype == torch.float64 and t.numel():  # float32 would turn a finite value infinite, or non-zero 0
                    f = t.detach().float()
                    if ((f.isinf() & t.isfinite()) | ((f == 0) & (t != 0))).any():
                        raise InputError(f"record {r.key!r}: array {name!r} holds float64 values float32 cannot hold "
                                         f"(beyond ±3.4e38, or non-zero below 1.4e-45): the store would keep inf or 0; "
                                         f"rescale them first; nothing was written")
                if t.dtype != torch.bool and not t.dtype.is_floating_point:
                    raise InputTypeError(f"record {r.key!r}: array {name!r} is {t.dtype}, but a store holds float32 "
                                         f"(or bool) data, and the cast would change it ({'the imaginary part dropped' if t.is_complex() else 'integers above 2**24 rounded'}): "
                                         f"store t.float() yourself if that is what you mean; nothing was written")
        if os.path.lexists(self.path / "meta.json") and ((m := self.read_meta()).get("format") != FORMAT or
                                                         "library_version" not in m) and not self._logs_on_disk():
            # a file of the user's, not a store's meta (remove_store's rule, _looks_written): never taken as its own
            raise StoreError(f"{self.path / 'meta.json'} is not a store's (no index beside it, no store format in it): "
                             f"write the store to a folder of its own; nothing was written")
        self.path.mkdir(parents=True, exist_ok=True)
        with self._writer_lock().mutex, self._guard:
            return self._write(records)

    def _write(self, records: list[Record]) -> int:
        for r in records:  # what the line will say, checked before anything is written: a reader must accept it
            if not (isinstance(r.sample, str) and isinstance(r.part, str) and _int(r.layer) and _int(r.step)):
                raise InputTypeError(f"record {r.key!r}: sample and part must be texts, layer and step whole numbers")
            if (why := name_problem(f"L{r.layer:04d}_{r.part}.npz") or ("holds '/' or '|'" if set("/|") & set(r.part)
                                                                        else None)):
                raise InputError(f"record {r.key!r}: its part {r.part!r:.80} names its file, and that name {why}: use "
                                 f"a short part name such as 'language'")
        self._check_meta()
        modes = {r.mode for r in records}
        if len(modes) > 1:
            raise StoreError(f"one write mixes capture modes {sorted(modes)}: one store holds one mode")
        self.check_resume(mode=next(iter(modes)))  # brings the index up to date
        keys = [key_str(r.key) for r in records]
        if (dup := [k for k in keys if k in self._owner] or [k for i, k in enumerate(keys) if k in keys[:i]]):
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
        files = []  # (rel, bytes): every file of the chunk, built before any is written
        for (part, layer), idx in by_layer.items():
            rel = f"{chunk}/L{layer:04d}_{part}.npz"
            rs = [records[i] for i in idx]
            arrays = {f"r{j}__{name}": (t.detach().cpu() if t.dtype == torch.bool else t.detach().cpu().float()).numpy()
                      for j, r in enumerate(rs) for name, t in r.data.items()}
            bound = [{"key": key_str(r.key), "sample": r.sample, "part": r.part, "layer": r.layer, "step": r.step,
                      "mode": r.mode, "heads": r.heads, "seq_len": r.seq_len, "query_stride": r.query_stride,
                      "key_stride": r.key_stride, "arrays": sorted(r.data),
                      "spans": r.spans.to_json() if r.spans is not None else None, "meta": r.meta} for r in rs]
            try:  # what the file holds of each slot: the entry must say the same to be read (never another's)
                told = json.dumps(bound, separators=(",", ":"), allow_nan=True)
            except (TypeError, ValueError) as e:
                raise InputTypeError(f"record {bound[0]['key']!r}: its meta must be JSON (texts, numbers, lists, "
                                     f"objects): {e}") from None
            arrays[_RECORDS], arrays[_MARKED] = np.frombuffer(told.encode(), dtype=np.uint8), np.array(True)
            buf = io.BytesIO()
            np.savez_compressed(buf, **arrays)
            data = buf.getvalue()
            if len(data) > MAX_CHUNK_BYTES:
                raise StoreError(f"the records of layer {layer} ({part}) make a file of {len(data)} bytes, more than "
                                 f"the {MAX_CHUNK_BYTES >> 30} GiB a chunk file may hold: write fewer samples at once, "
                                 f"or capture with query_stride / key_stride (nothing was written)")
            digest = hashlib.sha256(data).hexdigest()
            for j, i in enumerate(idx):
                new_entries[i] = {**bound[j], "file": rel, "slot": j, "sha256": digest, "bytes": len(data)}
            files.append((rel, data))
        head = {"keys": keys, "mode": records[0].mode, "chunk": chunk}
        if len(_line(head, new_entries)) > MAX_LINE_BYTES:  # (ASCII JSON: as many bytes as characters)
            raise StoreError(f"one write of {len(records)} records makes an index line over {MAX_LINE_BYTES >> 20} "
                             f"MiB (their spans and meta): write fewer records at once (nothing was written)")
        for rel, data in files:
            write_inside(self.path, rel, data, error=StoreError, what="chunk file", fix=_links_fix(self.path / rel))
        self._append(self.rank, head, new_entries)
        # committed: whichever index names it later (or none, set aside), this chunk is no cut-off write (_scan); the
        # line above is the commit, so a marker that cannot be written (a full disk) fails nothing: the chunk is then
        # kept unless the same records are live elsewhere (_scan, _copies)
        with contextlib.suppress(OSError, StoreError):
            write_inside(self.path, f"{chunk}/{_COMMITTED}", b"", error=StoreError, what="chunk file")
        return len(records)

    def _append(self, rank: int, head: dict, records: list) -> None:
        """Commit one line to ``rank``'s log, its writer lock held and the index just refreshed (a torn last line is
        cut off first)."""
        if (log := self._logs.get(rank)) is not None:
            log.cut()
        _append_line(self._index_path(rank), (_line(head, records) + "\n").encode())

    # ---- reading -------------------------------------------------------------------------------
    def read_meta(self) -> dict:
        mp = self.path / "meta.json"
        if not os.path.lexists(mp):
            raise StoreError(f"{self.path} has no meta.json: not a store, or nothing was written yet")
        data = read_inside(self.path, "meta.json", links=False, limit=MAX_META_BYTES, error=StoreError, what="file",
                           fix=_META_FIX)
        try:
            meta = json.loads(data.decode())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise StoreError(f"{mp} is corrupt ({' '.join(str(e).split())[:200]}). {_META_FIX}") from None
        if not isinstance(meta, dict):
            raise StoreError(f"{mp} holds a {type(meta).__name__}, not an object. {_META_FIX}")
        return meta

    def _fix(self) -> str:
        return (f"Run Store({str(self.path)!r}).repair() to drop its records from the index (the other records stay "
                f"readable), then run the capture again: a resumed capture recaptures exactly those samples")

    def _line_of(self, key: str) -> tuple["_Log", int] | tuple[None, None]:
        log = next((lg for _, lg in sorted(self._logs.items()) if key in lg.live), None)
        return (log, log.live[key]) if log is not None else (None, None)

    def _content(self, rel: str, ents: list[dict]) -> tuple[int, str | None, bytearray | None]:
        """``(size, SHA-256, bytes)`` of the chunk file ``rel`` (a regular file inside the store, reached without a
        symbolic link, never a FIFO or device), read only as far as the entries ``ents`` that name it vouch for: a file
        over :data:`MAX_CHUNK_BYTES`, or of a size no entry gives, is never read (digest and bytes None); one over
        :data:`_READ_WHOLE` is hashed block by block first and read into memory only when its SHA-256 is an entry's."""
        fd = open_inside(self.path, rel, links=False, error=StoreError, what="file listed in the index",
                         fix=self._fix())
        try:
            size = os.fstat(fd).st_size
            if size > MAX_CHUNK_BYTES:
                raise StoreError(f"file listed in the index {rel!r} in {self.path} {too_big(size, MAX_CHUNK_BYTES)}. "
                                 f"{self._fix()}")
            if ents and all("bytes" in e for e in ents) and size not in {e["bytes"] for e in ents}:
                return size, None, None  # every entry gives another size: not the file they describe
            if size > _READ_WHOLE:
                digest = hashlib.file_digest(io.FileIO(fd, "rb", closefd=False), "sha256").hexdigest()
                if digest not in {e.get("sha256") for e in ents}:
                    return size, digest, None
                os.lseek(fd, 0, os.SEEK_SET)
            buf = bytearray(size)
            with io.FileIO(fd, "rb", closefd=False) as f:
                got = 0
                while got < size and (n := f.readinto(memoryview(buf)[got:])):
                    got += n
                if got != size or f.read(1):
                    raise StoreError(f"file {rel} in {self.path} changed while it was read (another process writes "
                                     f"it?): read again once it is done")
            return size, hashlib.sha256(buf).hexdigest(), buf
        finally:
            os.close(fd)

    def _chunk(self, rel: str, ents: list[dict]) -> dict:
        """The chunk file ``rel`` as the entries ``ents`` name it: ``{"size", "digest", "z" (the archive, None when no
        entry vouches for the file: its size and SHA-256 are none of theirs), "told" (what the file recorded of each
        slot; None for a file written before files recorded it), "err" (why the whole file is unreadable)}``."""
        c = {"size": None, "digest": None, "z": None, "told": None, "err": None}
        try:
            c["size"], c["digest"], data = self._content(rel, ents)
        except StoreError as e:
            c["err"] = str(e)
            return c
        if data is None or not any(self._vouches(e, c) for e in ents):
            return c
        try:
            z = np.load(io.BytesIO(data))  # (allow_pickle=False: no code in an archive is ever run)
            told = json.loads(bytes(z[_RECORDS]).decode()) if _RECORDS in z.files else None
            if told is not None and not (isinstance(told, list) and all(isinstance(d, dict) for d in told)):
                raise StoreError(f"its {_RECORDS} is not a list of records")
        except Exception as e:  # noqa: BLE001 - an unreadable archive (its checksum matched an entry or none was given)
            c["err"] = f"file {rel} in {self.path} cannot be read ({' '.join(str(e).split())[:200]}). {self._fix()}"
            return c
        c["z"], c["told"] = z, told
        return c

    @staticmethod
    def _vouches(e: dict, c: dict) -> bool:
        """The entry ``e`` describes the file ``c`` holds: its size and SHA-256 (where it gives them) are the file's."""
        return c["digest"] is not None and e.get("bytes", c["size"]) == c["size"] \
            and (not e.get("sha256") or e["sha256"] == c["digest"])

    def _problem(self, e: dict, c: dict) -> tuple[str, str] | None:
        """Why the record of entry ``e`` is not read from the chunk file ``c`` (:meth:`_chunk`), as ``(why, kind)``,
        or None. Kinds: ``"file"`` (the file is not one any entry describes: missing, unreadable, another size or
        SHA-256), ``"record"`` (this entry alone: it is not what the file recorded for its slot, an alias of another
        record, or gives a size, checksum or slot the sound file does not have), ``"undecided"`` (a file written
        before files recorded their records, whose chunk two lines name: which wrote it is not guessed)."""
        k, f, slot = e["key"], e["file"], e["slot"]
        log, line = self._line_of(k)
        at = f"record {k} ({f'line {line + 1} of {log.path.name}' if log is not None else 'a line no longer in the index'})"
        if c["err"]:
            return c["err"], "file"
        if c["z"] is None:
            if c["digest"] is None:
                return (f"file {f} in {self.path} is corrupt (it is {c['size']} bytes, not the {e.get('bytes')} the "
                        f"entry of record {k} gives: damaged or grown, it is never read). {self._fix()}"), "file"
            if not e.get("sha256"):
                return (f"file {f} in {self.path} is over {_READ_WHOLE >> 20} MiB and the entry of record {k} gives no "
                        f"SHA-256 to check it by (a hand-edited entry): it is never read. {self._fix()}"), "file"
            return (f"file {f} in {self.path} is corrupt (checksum mismatch: it is not the file the entry of record {k} "
                    f"gives; the file or that index line is damaged). {self._fix()}"), "file"
        told = c["told"]
        if told is not None:
            if (d := told[slot] if 0 <= slot < len(told) else None) is None:
                return f"{at} names slot {slot} of {f}, which holds {len(told)} record(s)", "record"
            if d.get("key") != k:
                return f"{at} names slot {slot} of {f}, which holds record {d.get('key')}: an alias of that record", \
                    "record"
            want = {x: e.get(x, {} if x == "meta" else None) for x in _BOUND}
            if (diff := [x for x in _BOUND if _canon(d.get(x, {} if x == "meta" else None)) != _canon(want[x])]):
                return (f"{at} gives {', '.join(diff)} other than {f} recorded for it when it was written (e.g. "
                        f"{diff[0]} {_canon(want[diff[0]])[:60]} for {_canon(d.get(diff[0]))[:60]})"), "record"
        if not self._vouches(e, c):
            return (f"{at} gives a {'size' if e.get('bytes', c['size']) != c['size'] else 'checksum'} that {f} does "
                    f"not have (another record's entry matches the file)"), "record"
        if any(f"r{slot}__{n}" not in c["z"].files for n in e["arrays"]):
            return f"{at} names slot {slot} of {f}, which does not hold its arrays", "record"
        if told is None:  # a file of a store written before files recorded their records
            if (others := log.sharing(k) if log is not None else []):
                return (f"{at} names chunk {log.claim(line)}, which line {', '.join(str(m + 1) for m in others)} of "
                        f"{log.path.name} names too, and its files (written before a chunk file recorded its records) "
                        f"do not say which line wrote it: neither is read, and repair() does not guess. Delete the line "
                        f"that should not be there"), "undecided"
            if (why := _shape_problem(e, c["z"])):
                return f"{at} {why}", "record"
        return None

    def _arrays(self, e: dict, cache: dict, ents: list[dict]) -> dict:
        """The arrays of the record of entry ``e`` (name -> tensor), after every check: its line may hold it (no file
        outside its chunk), the file is a regular one inside the store whose size and SHA-256 are the ones ``e`` gives,
        the file recorded this record at ``e``'s slot (key, spans, seq_len, ... as the entry gives them), and it holds
        ``e``'s arrays. Raises :class:`StoreError` naming what is wrong."""
        f = e["file"]
        if (why := self._refused(e["key"])):
            raise StoreError(f"{why}: a hand-edited or damaged index; it is never read. {self._fix()}")
        if f not in cache:
            cache[f] = self._chunk(f, ents)
        why, kind = self._problem(e, cache[f]) or (None, None)
        if why is not None:
            raise StoreError(f"{why}: a hand-edited or damaged index; it is never read. {self._fix()}"
                             if kind == "record" else why)
        try:
            return {n: torch.from_numpy(cache[f]["z"][f"r{e['slot']}__{n}"]) for n in e["arrays"]}
        except Exception as err:  # noqa: BLE001 - an archive without a checksum holding what np.load refuses
            raise StoreError(f"record {e['key']}: file {f} in {self.path} cannot be read "
                             f"({' '.join(str(err).split())}). {self._fix()}") from err

    def read(self, sample=None, layer=None, part=None, step=None) -> list[Record]:
        """Records matching the filters (None = any), in index order, exactly as written. ``layer`` and ``step`` are
        whole numbers, ``part`` a name and ``sample`` one id (a whole number reads as its text): a filter of another
        type (``layer="0"``, ``sample=["0", "1"]``) could match nothing without a word, so it is refused."""
        for name, value, kind in (("layer", layer, "a whole number"), ("step", step, "a whole number"),
                                  ("part", part, "a name (a string)"), ("sample", sample, "one id (a string)")):
            if not (value is None or (isinstance(value, str) and name in ("part", "sample"))
                    or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and name != "part")):
                raise InputTypeError(f"read({name}={value!r}): {name} is {kind}; e.g. read({name}="
                                     f"{ {'part': repr('language'), 'sample': repr('0')}.get(name, '0')})"
                                     + (": read each sample on its own" if name == "sample" else ""))
        if sample is None:
            ents = self.index()
        else:  # only the lines that hold the sample are parsed
            with self._guard:
                self._current()
                ents = [e for _, log in sorted(self._logs.items()) for n in log.samples.get(str(sample), ())
                        for e in log.entries(n) if e["sample"] == str(sample)]
        ents = [e for e in ents if (layer is None or e["layer"] == layer) and (part is None or e["part"] == part)
                and (step is None or e["step"] == step)]
        by_file: dict[str, list[dict]] = {}
        for e in ents:
            by_file.setdefault(e["file"], []).append(e)
        cache: dict[str, dict] = {}
        return [Record(sample=e["sample"], layer=e["layer"], part=e["part"], mode=e["mode"],
                       data=self._arrays(e, cache, by_file[e["file"]]),
                       spans=Spans.from_json(e["spans"]) if e["spans"] else None, step=e["step"], seq_len=e["seq_len"],
                       heads=e["heads"], query_stride=e["query_stride"], key_stride=e["key_stride"],
                       meta=e.get("meta", {})) for e in ents]

    def _inspect(self) -> list[tuple[str, list[str], str, str]]:
        """Every record that cannot be read, as ``(file, keys, why, kind)``, kind ``"file"`` (the whole file is
        damaged: missing, not a regular file of the store, unreadable, or of a size and SHA-256 no entry naming it
        gives; then all its records are), ``"record"`` (this entry alone: one its line may not hold, such as a file
        outside its chunk, or not what its sound file recorded for its slot, such as an alias of another record or an
        edited seq_len, or a size, checksum or slot that file does not have) or ``"undecided"`` (two lines name the
        chunk of a file that does not say which wrote it). Reads every file once."""
        by_file: dict[str, list[dict]] = {}
        for e in self.index():
            by_file.setdefault(e["file"], []).append(e)
        out = []
        for f, ents in by_file.items():
            refused = {e["key"]: self._refused(e["key"]) for e in ents}
            out += [(f, [k], why, "record") for k, why in refused.items() if why]
            if not (sound := [e for e in ents if not refused[e["key"]]]):
                continue
            c = self._chunk(f, sound)
            if c["err"] or c["z"] is None:
                out.append((f, [e["key"] for e in sound], "", "file"))
                continue
            out += [(f, [e["key"]], *problem) for e in sound if (problem := self._problem(e, c)) is not None]
        return out

    def damaged(self) -> dict[str, list[str]]:
        """Damaged records: ``{file: [record keys]}`` for every indexed file that is missing, unreadable or fails its
        checksum, and for every entry that names a file its line did not write or a checksum or slot its file does
        not have. Reads every file once (use it to check a store, not in a loop)."""
        out: dict[str, list[str]] = {}
        for f, keys, _, _ in self._inspect():
            out.setdefault(f, []).extend(keys)
        return out

    def _named_chunks(self, others: bool = False) -> set[str]:
        """Every chunk folder a line of any log names (its records live, dropped or in conflict): never an orphan.
        ``others``: those an index set aside under another name names (``.bak``, ...): kept aside, never orphans."""
        used = set()
        for _, log in [] if others else sorted(self._logs.items()):
            for head, text in log.lines:
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                recs = line[1] if isinstance(line, list) and len(line) == 2 and isinstance(line[1], list) else []
                used |= ({str(e["file"]).rsplit("/", 1)[0] for e in recs if isinstance(e, dict) and "file" in e}
                         | ({head["chunk"]} if isinstance(head.get("chunk"), str) else set()))
        for n in os.listdir(self.path):  # an index set aside as the store's refusal advises: its chunks are kept too
            if (n.startswith("index-rank") and not n.endswith((".jsonl", ".jsonl.bad")) if others else
                    n.endswith(".jsonl.bad") and _own_name(n, 0) == "file"):
                with contextlib.suppress(StoreError, OSError), os.fdopen(open_inside(
                        self.path, n, links=False, error=StoreError), "rb") as f:
                    used |= {m.decode() for line in f for m in re.findall(rb"rank\d{5,}/chunk\d{6,}", line)}
        return used

    def _scan(self) -> tuple[list[Path], list[tuple[Path, str]], list[Path]]:
        """``(leftovers, strangers, aside)``. Leftovers of interrupted writes: temporary files and chunk folders no line
        of any index names, without the ``committed`` marker, holding only the store's files, whose records
        (:meth:`_held`) are all live as the same records (:meth:`_copies`): removing one loses nothing. Aside:
        the other unnamed chunk folders (an index set aside under a name the store does not read, or moved out: its
        chunks are kept). Strangers: a symbolic link, FIFO, device or socket under a name the store uses for its own
        files and folders, or a hard link under the name of a file it writes (lock, index, meta) (``meta.json``, ``index-rank*``, ``.lock-rank*``, ``rank*``, ``rank*/chunk*``), with what
        it is. Only real folders of the store are looked into: a link is never followed."""
        with self._guard:
            self._current()
        used, kept = self._named_chunks(), self._named_chunks(others=True)
        tmp, orphans, strangers, aside = [], [], [], []

        def look(folder: Path, depth: int) -> None:
            try:
                found = sorted(os.scandir(folder), key=lambda d: d.name)
            except OSError:
                return
            for d in found:
                p, n = Path(d.path), d.name
                try:
                    lst = d.stat(follow_symlinks=False)
                except OSError:
                    continue
                mode = lst.st_mode
                own = _own_name(n, depth)  # exact names, as remove_store's: a user's rankings/ or .x.tmp is not one
                if own and depth == 0 and stat.S_ISREG(mode) and lst.st_nlink > 1:  # a lock, index or meta it writes
                    strangers.append((p, f"a hard link ({lst.st_nlink} names: the same file may sit outside the "
                                         f"store), never written through"))
                    continue
                if own and n.startswith(".") and n.endswith(".tmp") and not stat.S_ISDIR(mode):
                    tmp.append(p)  # (removing a link or FIFO removes the name, never what it points to)
                elif own and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    kind = f"a symbolic link to {os.readlink(p)}" if stat.S_ISLNK(mode) else file_kind(mode)
                    strangers.append((p, kind))
                elif stat.S_ISDIR(mode) and own and depth == 0:  # a rank folder
                    look(p, 1)
                elif stat.S_ISDIR(mode) and own and depth == 1:  # a chunk folder; one holding repair's kept
                    # *.damaged, or a file of a user's, is not an orphan; nor one holding records no index names
                    names = os.listdir(p)  # a user's folder of that name is no chunk; one holding a user's file, or
                    # repair's *.damaged, beside the store's is kept, and said
                    if (rel := p.relative_to(self.path).as_posix()) not in used and (not names or any(
                            _own_name(q, 2) for q in names)):
                        (orphans if rel not in kept and _COMMITTED not in names and all(
                            _own_name(q, 2) and not q.endswith(".damaged") for q in names) and (held := self._held(
                            rel)) is not None and self._copies(held)
                         else aside).append(p)
                    look(p, 2)

        look(self.path, 0)
        return tmp + orphans, strangers, aside

    def _held(self, chunk: str) -> dict[str, tuple[dict, dict]] | None:
        """The records the chunk folder ``chunk`` (``"rank00000/chunk000003"``) holds, as its files recorded them
        (their own ``_RECORDS``, at most an index line's bytes), whatever an index says: key -> (what its file recorded
        of it, the SHA-256 of each array's member, :func:`_npy_digest`); None when a file of it cannot be read so, or was written before chunks were marked
        committed (``_MARKED``): a link, FIFO, a foreign or older file, whose chunk is not known to be a cut-off write.
        Temporary files hold nothing."""
        recs = []
        # (an interrupted write's temporary file holds no record, and is never opened; nor is the marker)
        for n in (q for q in os.listdir(self.path / chunk) if not q.endswith(".tmp") and q != _COMMITTED):
            try:
                with os.fdopen(open_inside(self.path, f"{chunk}/{n}", links=False, error=StoreError), "rb") as f:
                    if (z := np.load(f)).zip.getinfo(f"{_RECORDS}.npy").file_size > MAX_LINE_BYTES or not z[_MARKED] \
                            or sum(i.file_size for i in z.zip.infolist()) > MAX_CHUNK_BYTES:  # (a zip bomb: unread)
                        return None
                    recs += [(d, {a: hashlib.file_digest(z.zip.open(f"r{j}__{a}.npy"), "sha256").hexdigest()
                                  for a in d["arrays"]})  # streamed: memory stays small
                             for j, d in enumerate(json.loads(bytes(z[_RECORDS]).decode()))]
            except Exception:  # noqa: BLE001 - a link, FIFO, foreign or older file: what it holds is not known
                return None
        held = {d["key"]: (d, a) for d, a in recs}
        return held if len(held) == len(recs) else None  # a key twice (no write makes one): not known which is which

    def _copies(self, held: dict) -> bool:
        """Every record ``held`` (:meth:`_held`) names is live in the index, on any rank, as the same record: what its
        file recorded of it alike, its arrays equal bit for bit (their digests); False when one is not live or cannot
        be read. A write cut off before its index line and then run again is such a copy; other values under the same
        key (another picture under an id, the chunk of an index moved out of the store) are not, and are kept. Each
        live file and index line is read once (``cache``)."""
        cache: dict = {}
        for d, arrays in held.values():
            log, n = self._line_of(d["key"])
            try:
                e = (cache.get(at := ("line", log.path.name, n)) or cache.setdefault(at, {x["key"]: x for x in
                                                                                           log.entries(n)}))[d["key"]]
                data = self._arrays(e, cache, [e])
            except (AttributeError, ValueError, TypeError, KeyError, StoreError):  # (not live: no log, no entry)
                return False
            if not (all(_canon(d.get(x, {} if x == "meta" else None)) == _canon(e.get(x, {} if x == "meta" else None))
                        for x in _BOUND) and data.keys() == arrays.keys()
                    and all(_npy_digest(data[a].numpy()) == arrays[a] for a in arrays)):
                return False
        return True

    def verify(self) -> list[str]:
        """Problems found, one line each: damaged records (missing or corrupt files, with their record keys; entries a
        line may not hold: an alias of another line's record, a checksum or slot its file does not have), leftovers
        of interrupted writes (ignored by readers; :meth:`repair` removes them), chunk folders no index names that are
        no interrupted write's (an index set aside or moved out: kept, never removed) and symbolic links, FIFOs or devices
        under the store's own names (never followed nor removed). A leftover of a rank that a live process is writing
        right now is reported as a write in flight, not as damage. Empty when the store is sound. Records listed twice
        (a hand-edited log) are reported, each naming its file and line; nothing else is checked until they are
        mended."""
        with self._guard:
            self._refresh()
            conflicts = self._conflicts() + [self._clash] * bool(self._clash)  # (a key two ranks hold, too)
        if conflicts:
            return [f"{c}: delete the line that should not be there (a hand-edited or damaged index); reads are refused "
                    f"until then" for c in conflicts]
        leftovers, strangers, aside = self._scan()
        problems = [f"{p.relative_to(self.path).as_posix()} is {kind}: a store never makes one, so it is never "
                    f"followed, opened, written or removed (repair() leaves it); remove it yourself "
                    f"(os.unlink({str(p)!r})) if it should not be there" for p, kind in strangers]
        problems += [f"damaged file {f}: {len(keys)} record(s) unreadable ({', '.join(keys[:3])}"
                     f"{', ...' if len(keys) > 3 else ''}); Store.repair() drops them so a resumed capture "
                     f"recaptures them" if kind == "file" else f"{why}; reads of it are refused until then"
                     if kind == "undecided" else
                     f"{why}: a hand-edited or damaged index, never read; Store.repair() drops the record (the "
                     f"file stays as it is) so a resumed capture recaptures it"
                     for f, keys, why, kind in self._inspect()]

        @functools.cache
        def live(rank) -> dict | None:  # another live process that holds the rank's writer lock, if any
            lock = self._lock_path(rank) if rank is not None else None
            return None if lock is None or held_here(lock) else holder_if_held(lock)

        def in_flight(what: str, rank) -> str:
            return (f"{what}: possibly a write in flight, not damage (rank {rank} is held by a live writer, "
                    f"{describe(live(rank))}); check again once it has closed the store")

        kept, have = self._named_chunks(others=True), {k for log in self._logs.values() for k in log.live}
        for p in leftovers + aside:
            rel = p.relative_to(self.path).as_posix()
            rank = int(m[1]) if (m := _RANK_DIR.fullmatch(rel.split("/", 1)[0])) else None  # (a top-level file: None)
            held = self._held(rel) if p in aside else None  # what a kept chunk holds, named
            ks = f" ({', '.join(sorted(held)[:2])}{', ...' if len(held) > 2 else ''}: {len(held)} records)" if held else ""
            again = bool(held) and set(held) <= have  # every key it holds is live (with its values or not)
            cut = rel not in kept and not os.path.lexists(p / _COMMITTED) and held and all(
                _own_name(q, 2) and not q.endswith(".damaged") for q in os.listdir(p))
            problems.append(in_flight(("chunk " if p.is_dir() else "temporary file ") + rel, rank) if live(rank) else
                            (f"chunk {rel} holds records{ks} the index holds with other values or cannot read: "
                             f"captured again otherwise, or the chunk of an index moved out of the store; kept, never "
                             f"read nor removed: move that index back, or remove the folder yourself if the live "
                             f"records are the ones you want" if cut and again else
                             f"chunk {rel} holds a write cut off before its index line{ks}, or the chunk of an index "
                             f"moved out of the store: kept until the same capture writes its records again, then "
                             f"repair() removes it (move a moved-out index back first)" if cut else
                             f"chunk {rel}{ks} is not named by any index (an index set aside?): kept, never "
                             f"read nor removed"
                            + ("" if not again else "; its records are all live again, the same values (a copy)"
                               if self._copies(held) else "; its keys are live again, with other values or unreadable ones: keep it until the live records are "
                               "checked")
                            + f"; if an index was "
                             f"set aside, "
                            + (f"index-rank{rank:05d}.jsonl is live, never move another over it: keep "
                               f"the set-aside index as index-rank{rank:05d}.jsonl.bad (its chunks are kept)"
                               f"{'' if again else ' and capture its samples again'}"
                               if (self.path / f"index-rank{rank:05d}.jsonl").exists() else
                               f"move its index back as index-rank{rank:05d}.jsonl (or .jsonl.bad to keep it aside)")
                            + ", or remove the folder yourself if it is not wanted") if p in aside else
                            f"orphaned chunk {rel} (an interrupted write); it is ignored, Store.repair() removes it"
                            if p.is_dir() else f"temporary file {rel} left by an interrupted write; it is ignored, "
                            f"Store.repair() removes it")
        return problems + [in_flight(f"{log.path.name} ends in {log.torn} bytes of an unfinished line", rank)
                           if live(rank) else f"{log.path.name} ends in {log.torn} bytes of an unfinished line "
                           f"(an interrupted write); it is ignored, Store.repair() removes it"
                           for rank, log in sorted(self._logs.items()) if log.torn]

    def drop(self, keys) -> list[str]:
        """Remove the records ``keys`` (``"sample|part|layer|step"``) from their ranks' indexes: one line appended
        to each rank's log that holds any, under that rank's writer lock. Their data files stay on disk. Returns
        the keys dropped."""
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
            raise InputTypeError(f"drop takes a list of record keys, not {type(keys).__name__} {keys!r:.80}: pass "
                                 f"[{keys!r:.80}] (a text would be read as its characters, and nothing dropped)")
        keys, dropped = list(keys), []
        if (odd := next((k for k in keys if not isinstance(k, str)), None)) is not None:
            raise InputTypeError(f"drop takes record keys as texts 'sample|part|layer|step', got {odd!r:.80}")
        keys = set(keys)
        self._refresh()
        for rank in sorted(self._logs):
            lock = _locked(self._lock_path(rank), f"rank {rank} of store {self.path}")
            try:
                with lock.mutex, self._guard:
                    self._refresh()  # what the rank holds now that nobody else writes it
                    gone = [k for k in self._logs[rank].live if k in keys] if rank in self._logs else []
                    while gone:  # lines no longer than a reader takes: as many keys as fit in half a line (one at least)
                        ends = itertools.accumulate(len(json.dumps(k)) + 1 for k in gone)  # each key's end, with its comma
                        n = max(1, sum(1 for _ in itertools.takewhile(lambda end: end <= MAX_LINE_BYTES // 2, ends)))
                        self._append(rank, {"drop": gone[:n]}, [])
                        dropped += gone[:n]
                        gone = gone[n:]
            finally:
                lock.release()
        return dropped

    def _set_aside(self, rel: str) -> None:
        """Rename the damaged file (or folder) ``rel`` to ``*.damaged``, kept for inspection: only one of the store's
        own, reached without a symbolic link; a link, FIFO or device is left where it is, never followed."""
        folder, _, name = rel.rpartition("/")
        with contextlib.suppress(StoreError, OSError, ValueError):  # outside, gone, or a name no file can have
            if folder:
                folder_inside(self.path, folder, error=StoreError)
            p = self.path / rel
            if stat.S_ISREG(os.lstat(p).st_mode) or stat.S_ISDIR(os.lstat(p).st_mode):
                os.replace(p, p.with_name(name + ".damaged"))

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
        with contextlib.ExitStack() as held:
            for r in ranks:  # nobody else may write while we decide what is an orphan
                held.callback(_locked(self._lock_path(r), f"rank {r} of store {self.path}").release)
            bad = self._inspect()
            if (undecided := [why for _, _, why, kind in bad if kind == "undecided"]):
                raise StoreError(f"{undecided[0]}{f' (and {len(undecided) - 1} more)' if len(undecided) > 1 else ''}. "
                                 f"repair() deletes nothing until then (Store.verify() lists them all)")
            dropped = self.drop([k for _, keys, _, _ in bad for k in keys])
            for f in dict.fromkeys(f for f, _, _, kind in bad if kind == "file"):
                self._set_aside(f)
            for p in self._scan()[0]:  # leftovers of interrupted writes (brings the index up to date)
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            for log in self._logs.values():
                log.cut()
            return dropped


# The names a store gives its own files and folders (remove_store removes only these). Temporary files: write_inside's
# ".NAME.XXXXXXXX.tmp" (and an earlier version's mkstemp names of the same form) beside meta.json or a chunk file.
_TOP_FILES = re.compile(r"meta\.json|index-rank\d{5,}\.jsonl(?:\.bad)?|index-rank\d{5,}\.json|\.lock-rank\d{5,}"
                        r"|\.(?:meta\.json|index-rank\d{5,}\.jsonl)\.[0-9A-Za-z_]{8}\.tmp")
_RANK_DIR = re.compile(r"rank(\d{5,})")
_CHUNK_DIR = re.compile(r"chunk(\d{6,})")
_COMMITTED = "committed"  # written into a chunk folder once its index line is: the write was not cut off
_CHUNK_FILES = re.compile(r"L\d{4,}_[^/]+\.npz(?:\.damaged)?|\.L\d{4,}_[^/]*\.[0-9A-Za-z_]{8}\.tmp|committed"
                          r"|\.committed\.[0-9A-Za-z_]{8}\.tmp")


def _store_tree(p: Path) -> tuple[dict, list[str], list[tuple[str, str]]]:
    """``(tree, foreign, strange)`` of the folder ``p``: ``tree`` the store's own files and folders in it
    (``{"files": [names], "dirs": {name: tree}}``), ``foreign`` the paths whose names a store never gives (a user's
    file or folder), ``strange`` the ``(path, kind)`` under a store's name that is not what a store makes there (a
    symbolic link, FIFO or device; a folder for a file). Nothing is followed: every entry is looked at with lstat."""
    foreign, strange = [], []

    def look(folder: Path, rel: str, depth: int) -> dict:
        node = {"files": [], "dirs": {}}
        for d in sorted(os.scandir(folder), key=lambda d: d.name):
            n, here = d.name, f"{rel}{d.name}"
            mode = d.stat(follow_symlinks=False).st_mode
            own = _own_name(n, depth)
            if not own:
                foreign.append(here)
            elif own == "dir" and stat.S_ISDIR(mode):
                node["dirs"][n] = look(folder / n, here + "/", depth + 1)
            elif own == "file" and stat.S_ISREG(mode):
                node["files"].append(n)
            else:
                kind = f"a symbolic link to {os.readlink(d.path)}" if stat.S_ISLNK(mode) else file_kind(mode)
                strange.append((here, kind))
        return node

    return look(p, "", 0), foreign, strange


def _own_name(n: str, depth: int) -> str | None:
    """``"dir"`` or ``"file"`` when ``n`` is a name the store gives at ``depth`` (0: its folder, 1: a rank folder,
    2: a chunk folder), by its exact form (``rank00000``, not ``rankings``); else None (a user's)."""
    if depth == 0:
        rank = _RANK_DIR.fullmatch(n)
        return "dir" if rank and n == f"rank{int(rank[1]):05d}" else \
            "file" if _TOP_FILES.fullmatch(n) and _canonical(n) else None
    if depth == 1:
        chunk = _CHUNK_DIR.fullmatch(n)
        return "dir" if chunk and n == f"chunk{int(chunk[1]):06d}" else None
    return "file" if _CHUNK_FILES.fullmatch(n) else None


def _odd_keys(x):
    """The repr of the first mapping key under ``x`` that is not a text (JSON would turn it into one), or None."""
    if isinstance(x, dict):
        if (bad := [k for k in x if not isinstance(k, str)]):
            return repr(bad[0])
        x = list(x.values())
    return next((o for o in map(_odd_keys, x) if o is not None), None) if isinstance(x, (list, tuple)) else None


def _looks_written(p: Path, tree: dict) -> bool:
    """Whether a store wrote the folder ``p`` (:func:`_store_tree` ``tree``): a rank folder, an index log or a lock, or
    a meta.json holding the ``format`` a store writes (a user's own meta.json is not a store's)."""
    if any(rank["dirs"] for rank in tree["dirs"].values()) or any(  # a chunk folder, an index, a lock
            n.startswith((".lock-rank", ".meta.json.")) or ".jsonl" in n for n in tree["files"]):
        return True
    try:
        meta = json.loads(read_inside(p, "meta.json", links=False, limit=MAX_META_BYTES, error=StoreError))
    except (StoreError, OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT and "library_version" in meta  # not {"format": "coco"}


def _canonical(name: str) -> bool:
    """A top-level name with a rank number is the one the store gives that rank (``index-rank0.jsonl`` is none's)."""
    m = re.search(r"rank(\d+)", name)
    return m is None or m[1] == f"{int(m[1]):05d}"


def _remove_tree(fd: int, node: dict, rel: str) -> None:
    """Remove the files and folders of ``node`` (:func:`_store_tree`) under the folder open as ``fd``: each folder
    opened with O_NOFOLLOW, each name removed by its folder's descriptor, so nothing outside is ever reached."""
    for name, sub in node["dirs"].items():
        try:
            sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreError(f"{rel}{name} changed while the store was removed ({e.strerror}): the rest is left as it "
                             f"is; look at it and call remove_store again") from None
        try:
            _remove_tree(sfd, sub, f"{rel}{name}/")
        finally:
            os.close(sfd)
        try:
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"{rel}{name} was not removed ({e.strerror}: something was added to it meanwhile, and "
                             f"only what the store wrote is removed); look at it and call remove_store again") from None
    for name in node["files"]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)


def remove_store(path) -> bool:
    """Delete the store folder ``path`` (a notebook's own output of an earlier run), refused with
    :class:`StoreLockedError` while another process writes to it. Only what a store writes is removed, by its exact
    names (``meta.json``, ``index-rankNNNNN.jsonl``, ``.lock-rankNNNNN``, ``rankNNNNN/chunkNNNNNN/LNNNN_part.npz``, their
    temporary and ``*.damaged`` files): a folder holding anything else, at any depth (a user's ``rankings/``, a note in
    ``rank00000/``), or a symbolic link, FIFO or device under a store's name, is refused in one line and left exactly as
    it is (what a link points to is never touched). A writer of this process is released first (re-running a notebook
    cell). Returns True if something was removed."""
    _check_name(path)
    p = Path(path)
    if p.is_symlink():
        raise StoreError(f"{p} is a symbolic link (to {os.path.realpath(p)}): not removed. Remove the link with "
                         f"os.unlink({str(p)!r}), or call remove_store on the folder it points to")
    if not p.exists():
        return False
    if not p.is_dir():
        raise StoreError(f"{p} is a file, not a store folder; remove it yourself if it is yours")
    try:
        tree, foreign, strange = _store_tree(p)
    except OSError as e:
        raise StoreError(f"{p} cannot be looked through ({e.strerror}): not removed") from None
    if foreign:
        raise StoreError(f"{p} holds more than a store ({', '.join(n if n.isprintable() else repr(n) for n in foreign[:5])}"
                         f"{', ...' if len(foreign) > 5 else ''}: names a store "
                         f"never writes): not removed, nothing in it touched. Point OUT_DIR to a folder of its own, or "
                         f"move those out and call remove_store again")
    if (tree["files"] or tree["dirs"]) and not _looks_written(p, tree):
        raise StoreError(f"{p} holds only {', '.join(tree['files'])}, and no store wrote {'it' if len(tree['files']) == 1 else 'them'} "
                         f"(no index, lock or rank folder; a meta.json without a store's 'format'): not removed, "
                         f"nothing in it touched; remove it yourself if it is yours")
    if strange:
        raise StoreError(f"{p} holds {', '.join(f'{n} ({kind})' for n, kind in strange[:3])}, which a store never "
                         f"makes: not removed, and nothing a link points to is touched. Remove "
                         f"{'it' if len(strange) == 1 else 'them'} yourself (os.unlink; shutil.rmtree for a folder) if that is right, then call "
                         f"remove_store again")
    with contextlib.ExitStack() as held:
        for name in tree["files"]:
            if name.startswith(".lock-rank"):
                lp = p / name
                if held_here(lp) is not None:
                    forget(lp)  # this process's own earlier writer (a re-run cell): its lock goes with the files
                held.callback(_locked(lp, f"store {p}").release)
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            _remove_tree(fd, tree, "")
        finally:
            os.close(fd)
        try:
            os.rmdir(p)
        except OSError as e:
            raise StoreError(f"{p} was emptied of the store but not removed ({e.strerror}: something was added "
                             f"meanwhile, and only what the store wrote is removed)") from None
    return True


def shard_samples(samples: list, rank: int, world_size: int) -> list:
    """The slice of ``samples`` that ``rank`` of ``world_size`` captures (round-robin, disjoint)."""
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} outside world size {world_size}")
    return list(samples)[rank::world_size]
