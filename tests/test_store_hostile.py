"""A hostile store (issue #60): a store someone shared, with symbolic links out of it, FIFOs and devices under its
names, names no file can have, and hand-appended index lines. The store never reads or writes outside its folder,
never hangs or fills memory, never reads a record as another's, never loses a record a sound line names, and says
why in one line (a :class:`~unicache_lib.core.errors.UnicacheError`).

docs/FAULTS.md's "Hostile input" table lists these cases;
tests/test_store_faults.py::test_fault_table_counts_come_from_the_tests checks its counts against the cases below."""
import json
import os
import shutil
from contextlib import contextmanager

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from unicache_lib.core.errors import InputError, StoreError, UnicacheError
from unicache_lib.core.untrusted import open_inside, read_inside, write_inside
from unicache_lib.locks import describe
from unicache_lib.store import Store, remove_store

from .deadline import deadline
from .test_store_faults import check_intact, rec

K0, K1 = "0|language|0|-1", "1|language|0|-1"
HOLDER = '{"pid": 1, "host": "the outside file"}'




def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and isinstance(e, UnicacheError), msg
    return msg


def two_samples(path, together=False):
    """A sound store: samples 0 and 1 at layer 0, one chunk each (or one chunk, one file, slots 0 and 1)."""
    s = Store(path, meta={"model": "m"})
    if together:
        s.write([rec(0, 0), rec(1, 0)])
    else:
        s.write([rec(0, 0)])
        s.write([rec(1, 0)])
    s.close()
    return path / "index-rank00000.jsonl"


def files_of(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# ---- 1. symbolic links out of the store: never followed, never written through --------------------------------------
@pytest.mark.parametrize("op", ["repair", "resumed write", "drop", "remove_store"])
def test_a_lock_file_linked_outside_is_never_written_through(tmp_path, op):
    """The lock file replaced by a symlink to a file outside: each of these used to overwrite that file with
    {"pid": ..., "host": ...}. Now refused in one line naming the link; the outside file keeps its bytes."""
    path = tmp_path / "s"
    two_samples(path)
    outside = tmp_path / "precious.txt"
    outside.write_text("mine")
    lock = path / ".lock-rank00000"
    lock.unlink()
    lock.symlink_to(outside)
    calls = {"repair": lambda: Store(path).repair(), "resumed write": lambda: Store(path).write([rec(2, 0)]),
             "drop": lambda: Store(path).drop([K0]), "remove_store": lambda: remove_store(path)}
    with pytest.raises(StoreError) as e:
        calls[op]()
    assert ".lock-rank00000" in one_line(e.value) and "symbolic link" in str(e.value)
    assert outside.read_text() == "mine" and lock.is_symlink()
    assert check_intact(Store(path)) == {"0", "1"}
    assert any(".lock-rank00000 is a symbolic link to" in p for p in Store(path).verify())
    lock.unlink()  # the advice, followed
    calls[op]()
    assert outside.read_text() == "mine"


@pytest.mark.parametrize("op", ["repair", "resumed write", "drop", "remove_store", "index append"])
def test_a_lock_or_index_hard_linked_to_a_file_outside_is_never_written_through(tmp_path, op):
    """U6-U8 (#60 round IV): a hard link passes every lstat check (a regular file in the folder). `.lock-rank00000`
    hard-linked to a file outside: repair() and a resumed write overwrote it with the holder's JSON; the index
    hard-linked: a write appended its line to the outside file. Now a file the store opens for writing must have one
    name (core.untrusted.open_inside / stat_inside, locks.acquire): refused in one line, the outside file keeps its
    bytes, verify() names the link; removing the name (the advice) lets the operation run."""
    path = tmp_path / "s"
    log = two_samples(path)
    outside = tmp_path / "precious.txt"
    if op == "index append":
        outside.write_bytes(log.read_bytes())
        name = log
    else:
        outside.write_text("mine")
        name = path / ".lock-rank00000"
    before = outside.read_bytes()
    name.unlink()
    os.link(outside, name)
    calls = {"repair": lambda: Store(path).repair(), "resumed write": lambda: Store(path).write([rec(2, 0)]),
             "drop": lambda: Store(path).drop([K0]), "remove_store": lambda: remove_store(path),
             "index append": lambda: Store(path).write([rec(2, 0)])}
    with pytest.raises(UnicacheError) as e:
        calls[op]()
    assert name.name in one_line(e.value) and "hard link" in str(e.value), str(e.value)
    assert outside.read_bytes() == before
    assert any(name.name in p and "hard link" in p for p in Store(path).verify())
    if op == "index append":
        name.unlink()
        shutil.copyfile(outside, name)  # the advice: a copy, not a link
    else:
        name.unlink()
    calls[op]()
    assert outside.read_bytes() == before


@pytest.mark.parametrize("op", ["verify and repair", "write"])
def test_a_rank_folder_linked_outside_is_never_followed(tmp_path, op):
    """rank00001 a symlink to a folder outside: verify() used to list that folder's contents as leftovers and repair()
    delete them; a write at rank 1 put its chunk there. Now the link is named, never followed, and nothing outside is
    read, deleted or written."""
    path = tmp_path / "s"
    two_samples(path)
    outside = tmp_path / "theirs"
    (outside / "chunk000000").mkdir(parents=True)
    (outside / "chunk000000" / "keep.npz").write_bytes(b"theirs")
    (outside / ".x.tmp").write_bytes(b"theirs")
    (path / "rank00001").symlink_to(outside)
    if op == "write":
        with pytest.raises(StoreError) as e:
            Store(path, rank=1).write([rec(5, 0)])
        assert "rank00001" in one_line(e.value) and "symbolic link" in str(e.value)
    else:
        (problem,) = Store(path).verify()
        assert problem.startswith("rank00001 is a symbolic link to") and "never followed" in problem
        assert Store(path).repair() == []
        assert Store(path).verify() == [problem]  # left alone, still named
    assert files_of(outside) == [".x.tmp", "chunk000000/keep.npz"]
    assert check_intact(Store(path)) == {"0", "1"}


# ---- 2. index lines that name another line's record: refused, reported, never losing a sound record ---------------
def _append(log, line):
    log.write_text(log.read_text() + json.dumps(line, separators=(",", ":")) + "\n")


def _forged(log, line_no=0, slot=None, sha=None, key="7|language|0|-1"):
    """A copy of line ``line_no`` whose (first) entry is record ``key``, with ``slot`` / ``sha`` changed if given."""
    head, recs = json.loads(log.read_text().splitlines()[line_no])
    e = dict(recs[0], key=key, sample=key.split("|")[0])
    e.update({k: v for k, v in (("slot", slot), ("sha256", sha)) if v is not None})
    head = dict(head, keys=[key])
    return [head, [e]]


@pytest.mark.parametrize("chunk_in_head", [True, False], ids=["head-names-chunk", "older-head"])
def test_a_new_key_with_a_wrong_slot_never_costs_a_sound_record(tmp_path, chunk_in_head):
    """The lost case: a hand-appended line naming a new key in sample 0's file with a slot that file does not hold made
    repair() call the whole file damaged, drop sample 0 and rename its file. Now only the forged record is dropped."""
    log = two_samples(tmp_path / "s")
    line = _forged(log, slot=7)
    if not chunk_in_head:
        line[0].pop("chunk")
    _append(log, line)
    st_ = Store(tmp_path / "s")
    problems = st_.verify()
    assert len(problems) == 1 and "7|language|0|-1" in problems[0] and "line 3 of index-rank00000.jsonl" in problems[0]
    with pytest.raises(StoreError, match="names slot 7 of .*, which holds 1 record"):  # (the file says what it holds)
        st_.read(sample="7")
    assert len(st_.read(sample="0")) == 1 and len(st_.read(sample="1")) == 1
    before = files_of(tmp_path / "s" / "rank00000")
    assert st_.repair() == ["7|language|0|-1"]
    assert files_of(tmp_path / "s" / "rank00000") == before  # no file renamed
    assert check_intact(Store(tmp_path / "s")) == {"0", "1"} and Store(tmp_path / "s").verify() == []


@pytest.mark.parametrize("sha", ["same", "wrong"])
def test_an_alias_of_another_samples_slot_is_never_read_as_it(tmp_path, sha):
    """The silent case: a hand-appended line naming sample 0's file and slot under key 7 (with sample 0's checksum or a
    wrong one) read back as sample 0's data under key 7, and verify() reported nothing."""
    log = two_samples(tmp_path / "s")
    _append(log, _forged(log, sha=None if sha == "same" else "0" * 64))
    s = Store(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        s.read(sample="7")
    if sha == "same":  # the file says its slot 0 holds record 0|language|0|-1
        assert "record 7|language|0|-1 (line 3 of index-rank00000.jsonl)" in one_line(e.value)
        assert "alias" in str(e.value) and "never read" in str(e.value)
    else:  # not even the file the entry gives
        assert "checksum mismatch" in one_line(e.value) and "record 7|language|0|-1" in str(e.value)
    (problem,) = s.verify()
    assert "7|language|0|-1" in problem and "alias" in problem
    got = s.read(sample="0")  # the sound records stay readable, exactly
    assert len(got) == 1 and torch.equal(got[0].data["entropy"], rec(0, 0).data["entropy"])
    assert s.repair() == ["7|language|0|-1"] and check_intact(s) == {"0", "1"} and s.verify() == []


def test_a_wrong_checksum_in_a_sound_line_costs_that_record_only(tmp_path):
    """One file holding samples 0 and 1 (slots 0, 1); sample 1's entry given a wrong SHA-256 by hand: used to read
    back unchecked (the file was checked against the first entry only). Now refused and dropped alone; the file
    stays."""
    log = two_samples(tmp_path / "s", together=True)
    head, recs = json.loads(log.read_text())
    recs[1]["sha256"] = "0" * 64
    log.write_text(json.dumps([head, recs]) + "\n")
    s = Store(tmp_path / "s")
    assert len(s.read(sample="0")) == 1
    with pytest.raises(StoreError, match=r"checksum mismatch.*record 1\|language\|0\|-1"):
        s.read(sample="1")
    (problem,) = s.verify()
    assert "record 1|language|0|-1 (line 1 of index-rank00000.jsonl) gives a checksum" in problem
    assert "file stays" in problem
    before = files_of(tmp_path / "s")
    assert s.repair() == [K1] and files_of(tmp_path / "s") == before
    assert check_intact(s) == {"0"} and s.missing(["0", "1"], [0]) == ["1"]


def test_a_line_naming_another_ranks_chunk_is_refused(tmp_path):
    path = tmp_path / "s"
    two_samples(path)
    log1 = path / "index-rank00001.jsonl"
    head, recs = json.loads((path / "index-rank00000.jsonl").read_text().splitlines()[0])
    recs[0].update(key="9|language|0|-1", sample="9")
    log1.write_text(json.dumps([dict(head, keys=["9|language|0|-1"]), recs]) + "\n")
    with pytest.raises(StoreError, match="outside rank00001/"):
        Store(path).read(sample="9")
    assert Store(path).repair() == ["9|language|0|-1"] and check_intact(Store(path)) == {"0", "1"}


# ---- 3. FIFOs, devices, names no file can have, loops: one line each, no hang ----------------------------------------
@pytest.mark.parametrize("where", ["index", "meta.json", "chunk file"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_under_a_store_name_is_refused_before_it_is_opened(tmp_path, where, kind):
    """A FIFO named as the index or meta.json used to hang the reader; a symlink to /dev/zero filled memory."""
    path = tmp_path / "s"
    log = two_samples(path)
    target = {"index": log, "meta.json": path / "meta.json",
              "chunk file": path / json.loads(log.read_text().splitlines()[0])[1][0]["file"]}[where]
    target.unlink()
    os.mkfifo(target) if kind == "fifo" else target.symlink_to("/dev/zero")
    with deadline():
        with pytest.raises(StoreError) as e:
            s = Store(path)
            s.read_meta() if where == "meta.json" else s.read(sample="0")
        msg = one_line(e.value)
        assert target.name in msg and ("FIFO" in msg if kind == "fifo" else "/dev/zero" in msg and "outside" in msg)
        if where == "chunk file":  # damaged, dropped by repair, the FIFO or link left where it is
            assert Store(path).repair() == [K0] and check_intact(Store(path)) == {"1"}
            assert os.path.lexists(target)
        else:
            with pytest.raises(StoreError):
                Store(path, meta={"model": "m"}).write([rec(3, 0)])  # a resumed write neither hangs nor writes


@pytest.mark.parametrize("name, says", [("rank00000/chunk000000/L0000\x00.npz", "NUL byte"),
                                        ("rank00000/chunk000000/" + "L" * 300 + ".npz", "too long"),
                                        ("rank00000/chunk000000/loop.npz", "symbolic link loop")])
def test_names_that_cannot_exist_and_loops_get_their_own_message(tmp_path, name, says):
    """NUL bytes and symlink loops used to be "points outside", a long name a raw ENAMETOOLONG."""
    path = tmp_path / "s"
    log = two_samples(path)
    a = path / "rank00000" / "chunk000000"
    (a / "loop.npz").symlink_to(a / "loop2.npz")
    (a / "loop2.npz").symlink_to(a / "loop.npz")
    head, recs = json.loads(log.read_text().splitlines()[0])
    recs[0]["file"] = name
    lines = log.read_text().splitlines()
    lines[0] = json.dumps([head, recs])
    log.write_text("\n".join(lines) + "\n")
    s = Store(path)
    with pytest.raises(StoreError) as e:
        s.read(sample="0")
    assert says in one_line(e.value) and "points outside" not in str(e.value)
    assert s.repair() == [K0] and check_intact(s) == {"1"} and (a / "loop.npz").is_symlink()


@pytest.mark.parametrize("folder, says", [("a\x00b", "NUL byte"), ("x" * 300, "too long")])
def test_a_store_folder_no_file_system_can_hold_is_named(tmp_path, folder, says):
    for call in (lambda: Store(tmp_path / folder), lambda: remove_store(tmp_path / folder)):
        with pytest.raises(InputError) as e:
            call()
        assert says in one_line(e.value)


def test_a_line_with_u2028_inside_a_string_reads_exactly(tmp_path):
    """Valid JSONL may hold U+2028 / U+0085 raw inside a string (json.dumps(..., ensure_ascii=False)); lines end at
    "\\n" only, so such a line reads exactly as written."""
    path = tmp_path / "s"
    s = Store(path)
    odd = "a\u2028b\u0085c\u2029d"
    r = rec(0, 0)
    r.sample, r.meta = odd, {"note": odd}
    s.write([r, rec(1, 0)])
    log = path / "index-rank00000.jsonl"
    raw = json.dumps(json.loads(log.read_text()), ensure_ascii=False, separators=(",", ":")) + "\n"
    assert "\u2028" in raw
    log.write_bytes(raw.encode())
    (got,) = Store(path).read(sample=odd)
    assert got.sample == odd and got.meta == {"note": odd} and torch.equal(got.data["entropy"], r.data["entropy"])
    assert Store(path).verify() == []


def test_a_lock_holder_is_described_in_one_line_whatever_it_wrote():
    assert "\n" not in describe({"pid": "1\n2", "host": "h\nx", "since": "yesterday", "cmd": "a\nb"})
    assert describe({"since": 1e300}).startswith("pid ? on host ? since an unknown time")


def test_the_open_helpers_refuse_what_the_store_refuses(tmp_path):
    """unicache_lib.core.untrusted's open_inside / read_inside / write_inside: the general rule the store uses."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out.txt").write_text("outside")
    (tmp_path / "in" / "ok.txt").write_text("ok")
    (tmp_path / "in" / "link").symlink_to("ok.txt")
    (tmp_path / "in" / "out").symlink_to(tmp_path / "out.txt")
    os.mkfifo(tmp_path / "in" / "fifo")
    assert read_inside(tmp_path / "in", "link") == b"ok"  # a read may follow a link that stays inside
    for rel, says in [("out", "points outside"), ("fifo", "FIFO"), ("../out.txt", "points outside"),
                      ("nope", "missing"), ("a\x00", "NUL")]:
        with deadline(), pytest.raises(InputError, match=says):
            read_inside(tmp_path / "in", rel)
    with pytest.raises(InputError, match="links are not followed"):
        read_inside(tmp_path / "in", "link", links=False)
    for rel in ("link", "out"):  # nothing is written through a link, even one inside
        with pytest.raises(InputError, match="symbolic link"):
            write_inside(tmp_path / "in", rel, b"x")
        with pytest.raises(InputError, match="symbolic link"):
            open_inside(tmp_path / "in", rel, os.O_WRONLY | os.O_APPEND)
    assert (tmp_path / "out.txt").read_text() == "outside" and (tmp_path / "in" / "ok.txt").read_text() == "ok"
    write_inside(tmp_path / "in", "new/deep/f.txt", b"made")
    assert (tmp_path / "in" / "new" / "deep" / "f.txt").read_bytes() == b"made"


# ---- 4. property: every index line loads exactly as written or is refused with the library's error ----------------
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
_text = st.text(max_size=6) | st.sampled_from(["\u2028", "a\u0085b", "\x00", "../x", "/abs", "L" * 300, "rank00000"])
_value = st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False) | _text | \
    st.lists(st.integers(0, 2), max_size=3) | st.dictionaries(_text, st.integers(), max_size=2)
_FIELDS = ["key", "sample", "part", "layer", "step", "file", "slot", "arrays", "mode", "heads", "seq_len", "spans",
           "query_stride", "key_stride", "sha256", "meta"]


@pytest.fixture(scope="module")
def sound_pair(tmp_path_factory):
    """A sound store (samples 0 and 1, one file with slots 0 and 1), and the line a later write of sample 2 commits
    with its chunk folder (copied in when an example appends that line)."""
    path = tmp_path_factory.mktemp("pair") / "s"
    s = Store(path)
    s.write([rec(0, 0), rec(1, 0)])
    s.write([rec(2, 0)])
    s.close()
    lines = (path / "index-rank00000.jsonl").read_text().splitlines(keepends=True)
    (path / "index-rank00000.jsonl").write_text(lines[0])
    return path, lines[1]


@PROPERTY
@given(base=st.sampled_from(["sample 2's line", "line 1 again"]), edits=st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(_FIELDS), _value), max_size=2),
       head_edit=st.sampled_from([None, "drop chunk", "chunk of line 1", "keys", "mode"]),
       ascii=st.booleans(), torn=st.integers(0, 3))
def test_property_index_lines_load_exactly_or_are_refused(tmp_path_factory, sound_pair, base, edits, head_edit,
                                                          ascii, torn):
    """A line appended to a sound index: sample 2's own line, or line 1 written again, with fields of its entries
    replaced by generated values (texts with U+2028, NUL, '..', 300 characters; numbers; lists), its head edited, raw
    non-ASCII, a torn tail. Whatever reads, reads exactly as the line says and exactly the data written under that
    record's own key; anything else is refused with one of the library's errors."""
    sound, line2 = sound_pair
    path = tmp_path_factory.mktemp("p") / "s"
    shutil.copytree(sound, path)
    log = path / "index-rank00000.jsonl"
    head, recs = json.loads(line2 if base == "sample 2's line" else log.read_text())
    for i, field, value in edits:
        if i < len(recs):
            recs[i][field] = value
    if head_edit == "drop chunk":
        head.pop("chunk")
    elif head_edit == "chunk of line 1":
        head["chunk"] = "rank00000/chunk000000"
    elif head_edit == "keys":
        head["keys"] = head["keys"][::-1]
    elif head_edit == "mode":
        head["mode"] = "full"
    text = json.dumps([head, recs], ensure_ascii=ascii, separators=(",", ":"))
    log.write_bytes(log.read_bytes() + text.encode("utf-8", "surrogatepass") + b"\n" + b"[{"[:torn])
    written = {f"{s}|language|0|-1": rec(s, 0) for s in (0, 1, 2)}
    try:
        s = Store(path)
        got = s.read()
        entries = {e["key"]: e for e in s.index()}
    except UnicacheError as e:
        assert "\n" not in str(e)
        event("refused")
        return
    event(f"read {len(got)} records")
    on_disk = {e["key"]: e for _, es in (json.loads(x) for x in log.read_bytes().split(b"\n")[:-1]) for e in es}
    assert entries == {k: on_disk[k] for k in entries}  # every entry as the line wrote it
    for r in got:
        key = f"{r.sample}|{r.part}|{r.layer}|{r.step}"
        assert key in written, key  # no record under a key nobody wrote
        want = written[key]
        assert all(torch.equal(r.data[k], want.data[k]) for k in want.data), r.key  # nothing invented


# ---- 5. (#60, second round) bounded reads, chunk ownership by content, remove_store by exact names, bound records ----
def _lines(log):
    return [json.loads(x) for x in log.read_text().split("\n") if x]


def _put(log, lines):
    log.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


@contextmanager
def peak_memory(limit_mib: int):
    """Fail when the body allocates more than ``limit_mib`` MiB at its peak (Python and numpy allocations)."""
    import tracemalloc

    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit_mib << 20, f"peak {peak >> 20} MiB"


@pytest.mark.parametrize("where", ["index tail", "index of zero lines", "chunk file", "chunk file, older entry",
                                   "meta.json"])
def test_reads_are_bounded_by_what_the_format_holds(tmp_path, monkeypatch, where):
    """S9: the index, a chunk file and meta.json were read whole, so a sparse file (`truncate -s 100G`) filled memory.
    Now every read is bounded: an index line (or unfinished tail) by MAX_LINE_BYTES, a chunk file by the size its entry
    gives (an older entry: hashed block by block before it is read), meta.json by MAX_META_BYTES; each refused in one
    line, and the advice works."""
    from unicache_lib import store as store_mod

    path = tmp_path / "s"
    log = two_samples(path)
    entry = _lines(log)[0][1][0]
    chunk = path / entry["file"]
    monkeypatch.setattr(store_mod, "MAX_LINE_BYTES", 1 << 20)  # (the bounds made small: the test reads little)
    monkeypatch.setattr(store_mod, "_READ_WHOLE", 1 << 20)
    end = log.stat().st_size
    if where == "index tail":
        os.truncate(log, end + (100 << 30))
    elif where == "index of zero lines":  # a line end every 512 KiB of zeros: each line short enough, none a line
        with open(log, "r+b") as f:
            for i in range(1, 200):
                f.seek(end + i * (512 << 10))
                f.write(b"\n")
    elif where == "meta.json":
        os.truncate(path / "meta.json", 100 << 30)
    else:
        if where == "chunk file, older entry":  # an entry that gives no size: the file is hashed, never held
            lines = _lines(log)
            for e in lines[0][1]:
                e.pop("bytes")
            _put(log, lines)
        os.truncate(chunk, chunk.stat().st_size + (16 << 20))
    with deadline(), peak_memory(8), pytest.raises(StoreError) as e:
        s = Store(path)
        s.read_meta() if where == "meta.json" else s.read(sample="0")
    msg = one_line(e.value)
    if where == "index tail":
        assert "run past 1 MiB without a line end" in msg and f"os.truncate('{log}', {end})" in msg
        os.truncate(log, end)  # the advice, followed: every line before it stays
        assert check_intact(Store(path)) == {"0", "1"}
    elif where == "index of zero lines":
        assert "line 3 of index" in msg and "is corrupt" in msg
    elif where == "meta.json":
        assert "meta.json" in msg and "more than the 1 MiB such a file can hold: it is never read" in msg
    else:
        assert (f"not the {entry['bytes']} the entry" if where == "chunk file" else "checksum mismatch") in msg
        with peak_memory(8):
            (problem,) = Store(path).verify()
        assert problem.startswith(f"damaged file {entry['file']}")
        assert Store(path).repair() == [K0] and check_intact(Store(path)) == {"1"}
    big = tmp_path / "big"  # past the real bounds (16 GiB a chunk file): refused from the size alone
    two_samples(big)
    os.truncate(big / entry["file"], 100 << 30)
    with deadline(), peak_memory(8), pytest.raises(StoreError, match="100 GiB .* more than the 16 GiB"):
        Store(big).read(sample="0")


def test_a_write_never_makes_what_a_reader_refuses(tmp_path, monkeypatch):
    """The writer keeps to the same bounds: a meta.json over MAX_META_BYTES, an index line over MAX_LINE_BYTES are
    refused before anything is written."""
    from unicache_lib import store as store_mod

    with pytest.raises(StoreError) as e:
        Store(tmp_path / "m", meta={"model": "m", "notes": "x" * (2 << 20)}).write([rec(0, 0)])
    assert "meta.json may hold" in one_line(e.value) and not (tmp_path / "m" / "meta.json").exists()
    monkeypatch.setattr(store_mod, "MAX_LINE_BYTES", 2000)
    s = Store(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        s.write([rec(i, 0) for i in range(20)])
    assert "write fewer records at once" in one_line(e.value) and s.keys() == set()
    assert not list((tmp_path / "s").rglob("*.npz"))  # no chunk file written either
    s.write([rec(0, 0)])
    assert check_intact(Store(tmp_path / "s")) == {"0"}


@pytest.mark.parametrize("before", ["line 1", "line 2"])
def test_a_line_placed_before_the_owner_line_never_takes_its_chunk(tmp_path, before):
    """S2 / S2b (lost): a hand-made line copying line 1 (or 2) under the key 'evil', placed BEFORE it, was the first to
    name the chunk and so its owner: 'evil' read sample 0's data, sample 0 was refused as an alias, and repair() dropped
    sample 0 and kept 'evil'. Ownership is no longer decided by order: every chunk file records which record each of
    its slots holds, so 'evil' is refused (an alias of the record the file holds), the genuine record reads exactly,
    verify() names the forged line, repair() drops it alone."""
    log = two_samples(tmp_path / "s")
    n = int(before[-1]) - 1
    lines = _lines(log)
    head, recs = json.loads(json.dumps(lines[n]))
    head["keys"] = ["evil|language|0|-1"]
    recs[0].update(key="evil|language|0|-1", sample="evil")
    _put(log, lines[:n] + [[head, recs]] + lines[n:])
    s = Store(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        s.read(sample="evil")
    assert f"(line {n + 1} of index-rank00000.jsonl)" in one_line(e.value) and "alias" in str(e.value)
    (got,) = s.read(sample=str(n))
    assert torch.equal(got.data["entropy"], rec(n, 0).data["entropy"])
    (problem,) = s.verify()
    assert problem.startswith("record evil|language|0|-1") and f"holds record {n}|language|0|-1" in problem
    before_files = files_of(tmp_path / "s" / "rank00000")
    assert s.repair() == ["evil|language|0|-1"] and files_of(tmp_path / "s" / "rank00000") == before_files
    assert check_intact(Store(tmp_path / "s")) == {"0", "1"} and Store(tmp_path / "s").verify() == []


def _as_older(path):
    """Rewrite a store as one written before chunk files recorded their records: no __records__ in the files, no
    "bytes" in the entries (their checksums made anew)."""
    import hashlib
    import io

    import numpy as np

    log = path / "index-rank00000.jsonl"
    lines = _lines(log)
    for f in {e["file"] for _, recs in lines for e in recs}:
        with np.load(path / f) as z:
            arrays = {k: z[k] for k in z.files if k != "__records__"}
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        (path / f).write_bytes(buf.getvalue())
        for _, recs in lines:
            for e in recs:
                if e["file"] == f:
                    e.pop("bytes")
                    e["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    _put(log, lines)
    return log


@pytest.mark.parametrize("edit", ["none", "line placed before", "seq_len", "spans"])
def test_an_older_store_still_reads_and_is_never_guessed_at(tmp_path, edit):
    """A store written before chunk files recorded their records reads as before. There, two lines naming one chunk
    cannot be told apart by content: neither is read, verify() names both, repair() refuses and deletes nothing (it
    used to give the chunk to the first line); once the forged line is deleted everything reads. An entry whose seq_len
    or spans cannot describe its arrays is refused (a capture writes spans covering seq_len positions)."""
    path = tmp_path / "s"
    two_samples(path)
    log = _as_older(path)
    lines = _lines(log)
    if edit == "line placed before":
        head, recs = json.loads(json.dumps(lines[0]))
        head["keys"] = ["evil|language|0|-1"]
        recs[0].update(key="evil|language|0|-1", sample="evil")
        _put(log, [[head, recs]] + lines)
    elif edit != "none":
        lines[0][1][0].update({"seq_len": 500} if edit == "seq_len" else {"spans": {"runs": [[1, 1], [0, 1]]}})
        _put(log, lines)
    s = Store(path)
    if edit == "none":
        assert check_intact(s) == {"0", "1"} and s.verify() == []
        s.write([rec(2, 0)])  # a resumed capture adds records of the new kind beside them
        assert check_intact(Store(path)) == {"0", "1", "2"} and Store(path).verify() == []
        return
    for sample in (["evil", "0"] if edit == "line placed before" else ["0"]):
        with pytest.raises(StoreError) as e:
            s.read(sample=sample)
        assert (("do not say which line wrote it" if edit == "line placed before" else "a capture never writes")
                in one_line(e.value))
    assert len(s.read(sample="1")) == 1
    problems = s.verify()
    if edit == "line placed before":
        assert len(problems) == 2 and all("do not say which line wrote it" in p for p in problems)
        raw = log.read_bytes()
        with pytest.raises(StoreError, match="repair\\(\\) deletes nothing"):
            s.repair()
        assert log.read_bytes() == raw
        _put(log, lines)  # the forged line deleted, as the message says
        assert check_intact(Store(path)) == {"0", "1"} and Store(path).verify() == []
    else:
        assert len(problems) == 1 and "a capture never writes" in problems[0]
        assert s.repair() == [K0] and check_intact(Store(path)) == {"1"}


@pytest.mark.parametrize("swap", ["slot", "file+sha256"])
def test_swapped_slots_or_files_within_a_line_are_refused(tmp_path, swap):
    """S1 / S1b (silent): swapping the slot (or the file and its checksum) of two entries of one line read each record
    as the other, and verify() said nothing (the checksum is per file). Now each file records the record of each slot:
    both are refused when read, verify() names both, repair() drops them and keeps the sound file."""
    path = tmp_path / "s"
    s = Store(path, meta={"model": "m"})
    s.write([rec(0, 0), rec(1, 0)] if swap == "slot" else [rec(0, 0), rec(0, 1)])
    s.write([rec(5, 0)])
    s.close()
    log = path / "index-rank00000.jsonl"
    lines = _lines(log)
    a, b = lines[0][1]
    fields = ("slot",) if swap == "slot" else ("file", "sha256", "bytes")
    for k in fields:
        a[k], b[k] = b[k], a[k]
    _put(log, lines)
    s = Store(path)
    for e in (a, b):
        with pytest.raises(StoreError) as err:
            s.read(sample=e["sample"], layer=e["layer"])
        assert f"record {e['key']}" in one_line(err.value) and "alias" in str(err.value)
    problems = s.verify()
    assert len(problems) == 2 and all("alias of that record" in p for p in problems)
    before = files_of(path)
    assert sorted(s.repair()) == sorted([a["key"], b["key"]]) and files_of(path) == before
    assert check_intact(Store(path)) == {"5"} and Store(path).verify() == []


@pytest.mark.parametrize("edit", ["spans swapped", "seq_len and spans"])
def test_edited_spans_or_seq_len_are_refused(tmp_path, edit):
    """S17 / S17b (silent): spans edited from [[1,5],[0,4]] to [[0,5],[1,4]] read back with image and text swapped;
    seq_len 500 with spans of 2 positions on a [4, 9] array read back as is; verify() said nothing. Now the entry must
    say what the file recorded for its slot."""
    log = two_samples(tmp_path / "s")
    lines = _lines(log)
    e = lines[0][1][0]
    e.update({"spans": {"runs": [[0, 5], [1, 4]]}} if edit == "spans swapped"
             else {"seq_len": 500, "spans": {"runs": [[1, 1], [0, 1]]}})
    _put(log, lines)
    s = Store(tmp_path / "s")
    with pytest.raises(StoreError) as err:
        s.read(sample="0")
    assert "gives spans" in one_line(err.value) or "gives seq_len" in str(err.value)
    (problem,) = s.verify()
    assert K0 in problem and "recorded for it when it was written" in problem
    assert s.repair() == [K0] and check_intact(s) == {"1"} and s.missing(["0", "1"], [0]) == ["0"]


def test_drop_refuses_a_bare_string(tmp_path):
    """S13 (silent): Store.drop("0|language|0|-1") iterated the characters, dropped nothing and returned []."""
    two_samples(tmp_path / "s")
    s = Store(tmp_path / "s")
    for bad in (K0, K0.encode(), 7, [K0, 7]):
        with pytest.raises(UnicacheError) as e:
            s.drop(bad)
        assert "drop takes" in one_line(e.value)
    assert s.keys() == {K0, K1}
    assert s.drop([K0]) == [K0] and s.keys() == {K1}


@pytest.mark.parametrize("extra, shown", [
    ("rankings/thesis.csv", "rankings"), ("index-rank-notes.txt", "index-rank-notes.txt"),
    ("rank00000/my_notes.txt", "rank00000/my_notes.txt"),
    ("rank00000/chunk000000/notes.txt", "rank00000/chunk000000/notes.txt"),
    ("rank00000/chunk000000/sub/L0000_language.npz", "rank00000/chunk000000/sub"), ("rank0/x.npz", "rank0")])
def test_remove_store_removes_only_what_a_store_wrote(tmp_path, extra, shown):
    """S11 / S12 / S12b (lost): remove_store deleted a folder whose top-level names only started with 'rank' or
    'index-rank' (a user's rankings/ with a thesis CSV) and never looked below the top level (a note in rank00000/).
    Now every name at every depth must be one a store gives its own files; anything else is refused in one line and
    the folder is left exactly as it was."""
    path = tmp_path / "s"
    if not extra.startswith("rankings"):
        two_samples(path)
    (path / extra).parent.mkdir(parents=True, exist_ok=True)
    (path / extra).write_text("mine")
    before = files_of(path)
    with pytest.raises(StoreError) as e:
        remove_store(path)
    assert f"holds more than a store ({shown}: names a store never writes)" in one_line(e.value)
    assert files_of(path) == before and (path / extra).read_text() == "mine"


def test_remove_store_removes_a_store_with_its_own_leftovers(tmp_path):
    """What a store writes (its lock files, an orphaned chunk, temporary files, *.damaged, an index set aside as .bad)
    goes with it; an empty folder too."""
    path = tmp_path / "s"
    log = two_samples(path)
    (path / "rank00000" / "chunk000007").mkdir()
    (path / "rank00000" / "chunk000007" / "L0003_language.npz").write_bytes(b"half")
    (path / "rank00000" / "chunk000007" / ".L0003_language.npz.a1b2c3d4.tmp").write_bytes(b"half")
    (path / ".meta.json.0f0f0f0f.tmp").write_text("{")
    (path / "rank00000" / "chunk000000" / "L0000_language.npz.damaged").write_bytes(b"bad")
    shutil.copy(log, path / "index-rank00001.jsonl.bad")
    assert remove_store(path) and not path.exists()
    (tmp_path / "empty").mkdir()
    assert remove_store(tmp_path / "empty") and not (tmp_path / "empty").exists()


@pytest.mark.parametrize("line", ["nested 100,000 deep", "no records of another mode"])
def test_odd_lines_are_one_line_errors_or_harmless(tmp_path, line):
    """S19: a line nested 100,000 deep raised a raw RecursionError, now a StoreError naming the line. S20: a
    hand-added line listing no records but mode 'full' blocked every resumed stats capture; a line without records
    holds no mode."""
    path = tmp_path / "s"
    log = two_samples(path)
    if line.startswith("nested"):
        log.write_text(log.read_text() + '[{"keys":' + "[" * 100_000 + "]" * 100_000 + "}]\n")
        with pytest.raises(StoreError) as e:
            Store(path).keys()
        assert "line 3 of index" in one_line(e.value)
    else:
        _append(log, [{"keys": [], "mode": "full", "chunk": "rank00000/chunk000009"}, []])
        Store(path).write([rec(2, 0)])
        assert check_intact(Store(path)) == {"0", "1", "2"}


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "sparse 100 GiB", "a link out"])
def test_the_stats_store_meta_is_read_bounded_and_never_through_a_link(tmp_path, kind):
    """#60, fourth round: capture.runner.stats_store_or_capture read a store's meta.json with read_text(), without a
    bound: a FIFO there hung it, a link to /dev/zero filled memory. It now reads through core.untrusted.read_inside
    (a regular file inside the store, at most store.MAX_META_BYTES): each refused in one line, nothing captured."""
    from unicache_lib.capture.runner import stats_store_or_capture

    store = tmp_path / "stats"
    store.mkdir()
    meta = store / "meta.json"
    if kind == "fifo":
        os.mkfifo(meta)
    elif kind == "/dev/zero":
        meta.symlink_to("/dev/zero")
    elif kind == "a link out":
        (tmp_path / "elsewhere.json").write_text('{"model": "tiny-llava"}')
        meta.symlink_to(tmp_path / "elsewhere.json")
    else:
        with open(meta, "wb") as f:
            f.truncate(100 << 30)
    fallback = tmp_path / "fallback"
    with deadline(), pytest.raises(InputError) as e:
        stats_store_or_capture(store, fallback, model="never loaded", processor=None)
    msg = one_line(e.value)
    assert "meta.json" in msg and {"fifo": "FIFO", "/dev/zero": "link to /dev/zero", "a link out": "symbolic link",
                                   "sparse 100 GiB": "100 GiB"}[kind] in msg, msg
    assert not fallback.exists()
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "meta.json").write_text('{"model": "tiny-llava", "sample_seed": 0}')
    assert stats_store_or_capture(ok, fallback, sample_seed=0) == (ok, False)


@pytest.mark.parametrize("dtype,value", [(torch.int64, 2**40 + 1), (torch.int32, 3), (torch.complex64, 1 + 2j)])
def test_a_record_whose_data_a_float_cast_would_change_is_refused(tmp_path, dtype, value):
    """S17/S18 (#60 round IV): an int64 tensor [2**40 + 1] read back as float32 1099511627776.0, a complex [1+2j] as
    1.0: Store._write cast every array with t.float(). A store holds float32 (or bool) data: other dtypes are refused
    in one line, nothing written; a float64 or bool array is stored as before. Not a list of Records: one line too."""
    s = Store(tmp_path / "s", meta={"model": "m"})
    r = rec(0, 0)
    r.data["extra"] = torch.tensor([value], dtype=dtype)
    with pytest.raises(UnicacheError) as e:
        s.write([r])
    assert str(dtype) in one_line(e.value) and "float32" in str(e.value)
    assert not (tmp_path / "s" / "index-rank00000.jsonl").exists()
    r.data["extra"] = torch.tensor([0.5], dtype=torch.float64)
    s.write([r])
    for bad in (r, [{"key": 1}]):
        with pytest.raises(UnicacheError, match="list of Records"):
            s.write(bad)


# ---- round 12: names that only start like the store's, a user's meta.json, what a write would change -----------
def test_repair_and_verify_leave_names_that_only_start_like_the_stores(tmp_path):
    """Round 12's N8: repair() deleted a user's rankings/chunk_by_entropy/ (notes inside) and any hidden *.tmp file
    of the store's folder or a rank folder, judging names by their first letters. Now only the store's exact names
    (remove_store's) are leftovers; a chunk folder holding a user's file is not an orphan."""
    path = tmp_path / "s"
    Store(path, meta={"model": "m"}).write([rec(0, 0)])
    mine = {"rankings/chunk_by_entropy/my_notes.txt": b"notes", ".my_draft.tmp": b"draft",
            "rank00000/.keep.tmp": b"keep", "rank00000/chunk000009/notes.txt": b"a note in a chunk-named folder"}
    for rel, data in mine.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    (path / "rank00000" / "chunk000000" / ".L0000_language.npz.a1b2c3d4.tmp").write_bytes(b"half")  # the store's
    problems = Store(path).verify()
    assert len(problems) == 1 and ".L0000_language.npz.a1b2c3d4.tmp" in problems[0], problems
    assert Store(path).repair() == [] and Store(path).verify() == []
    assert {rel: (path / rel).read_bytes() for rel in mine} == mine  # every file of the user's kept
    assert check_intact(Store(path)) == {"0"}


@pytest.mark.parametrize("files", [{"meta.json": '{"my": "dataset description"}'},
                                   {"meta.json": "{}", "index-rank00000.json": "[]"},
                                   {"meta.json": '{"format": "coco"}'},  # round 13's L1: a format of its own
                                   {"meta.json": '{"format": 1}', "rank00000/": ""}])  # and an empty rank folder
def test_remove_store_refuses_a_folder_no_store_wrote(tmp_path, files):
    """Round 12's N4: a folder holding only a user's meta.json (or with an index-rank00000.json) was deleted, since
    those are names a store gives."""
    path = tmp_path / "mine"
    path.mkdir()
    for name, text in files.items():
        (path / name).mkdir() if name.endswith("/") else (path / name).write_text(text)
    with pytest.raises(StoreError, match="no store wrote") as e:
        remove_store(path)
    one_line(e.value)
    assert {p.name + "/" * p.is_dir(): "" if p.is_dir() else p.read_text() for p in path.iterdir()} == files
    Store(tmp_path / "s", meta={"model": "m"}).write([rec(0, 0)])
    (tmp_path / "s" / "meta.json").write_text('{"model": "m"}')  # rewritten as a store's refusal advises: still a store
    assert remove_store(tmp_path / "s") and not (tmp_path / "s").exists()


@pytest.mark.parametrize("case", ["float64 beyond float32", "float64 below float32's least", "an array named 0",
                                  "a meta key 1", "another sample seed"])
def test_a_write_that_would_store_other_values_or_skip_samples_is_refused(tmp_path, case):
    """Round 12's N2, N9 and poor 1, 4: a float64 1e300 was stored as inf and 1e-50 as 0; an array named 0 was written,
    after which read(), verify() and repair() of the whole store raised; a meta key 1 read back as "1"; a resumed
    capture of the standard set of another seed skipped every sample (the two sets share their ids)."""
    import dataclasses

    st = Store(tmp_path / "s", meta={"model": "m", "sample_seed": 2024})
    st.write([rec(0, 0)])
    r = rec(1, 0)
    bad = {"float64 beyond float32": dataclasses.replace(r, data={"x": torch.tensor([1e300, 1.0], dtype=torch.float64)}),
           "float64 below float32's least": dataclasses.replace(r, data={"x": torch.tensor([1e-50], dtype=torch.float64)}),
           "an array named 0": dataclasses.replace(r, data={0: torch.zeros(2)}),
           "a meta key 1": dataclasses.replace(r, meta={"grid": {1: "one"}})}.get(case)
    msg = {"float64 beyond float32": "float32 cannot hold", "float64 below float32's least": "float32 cannot hold",
           "an array named 0": "array name 0 is not a printable text", "a meta key 1": "a key that is not a text",
           "another sample seed": "sample_seed=2024, this capture is sample_seed=5"}[case]
    with pytest.raises(UnicacheError, match=msg) as e:
        (Store(tmp_path / "s", meta={"model": "m", "sample_seed": 5}) if bad is None else st).write([bad or r])
    one_line(e.value)
    assert check_intact(Store(tmp_path / "s")) == {"0"}  # nothing written
    st.write([dataclasses.replace(r, data={"x": torch.tensor([1e30, 1e-30], dtype=torch.float64)})])  # the fix: in range


def test_a_store_keeps_its_folder_when_the_working_folder_changes(tmp_path, monkeypatch):
    """Round 12's poor 3: Store("relative"), then os.chdir: the next write went to <new folder>/relative, under the
    lock of the old one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    st = Store("s", meta={"model": "m"})
    st.write([rec(0, 0)])
    monkeypatch.chdir(tmp_path / "b")
    st.write([rec(1, 0)])
    assert not (tmp_path / "b" / "s").exists() and len(Store(tmp_path / "a" / "s").index()) == 2


def test_an_index_set_aside_as_advised_keeps_its_chunks_and_a_users_meta_is_never_adopted(tmp_path):
    """Round 14's LN1: renaming a damaged index to .bad, as the refusal advises, made every chunk it named an
    "orphan" that repair() deleted (a sound record's too). LN2: Store.write took a user's own meta.json as the store's,
    and remove_store then deleted it with the store."""
    path = tmp_path / "s"
    Store(path, meta={"model": "m"}).write([rec(0, 0)])
    Store(path).write([rec(1, 0)])
    (path / "index-rank00000.jsonl").rename(path / "index-rank00000.jsonl.bad")
    assert not any("orphan" in p for p in Store(path).verify())
    Store(path).repair()
    assert len(list((path / "rank00000").iterdir())) == 2  # both chunks kept for a person to look at
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "meta.json").write_text('{"my": "dataset description"}')
    with pytest.raises(StoreError, match="is not a store's") as e:
        Store(mine, meta={"model": "m"}).write([rec(0, 0)])
    one_line(e.value)
    assert [p.name for p in mine.iterdir()] == ["meta.json"]
