import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from unicache_lib import store as store_mod
from unicache_lib.capture.record import Record
from unicache_lib.core.errors import InputTypeError
from unicache_lib.core.modality import Spans
from unicache_lib.store import Store, StoreError, shard_samples


def rec(sample, layer, step=-1, seed=0, mode="stats"):
    g = torch.Generator().manual_seed(seed * 100 + layer)
    data = {"entropy": torch.rand(4, 9, generator=g), "head_sim": torch.rand(4, 4, generator=g)}
    return Record(sample=str(sample), layer=layer, part="language", mode=mode, data=data,
                  spans=Spans.from_kinds([1] * 5 + [0] * 4), step=step, seq_len=9, heads=4)


def log_lines(path, rank=0) -> list:
    """The lines of a rank's index log, parsed: ``[head, entries]`` each."""
    return [json.loads(line) for line in (path / f"index-rank{rank:05d}.jsonl").read_text().splitlines()]


def same(a: Record, b: Record):
    assert a.key == b.key and a.spans == b.spans and a.seq_len == b.seq_len and a.mode == b.mode
    assert sorted(a.data) == sorted(b.data)
    for k in a.data:
        assert torch.equal(a.data[k], b.data[k])


def test_roundtrip_exact(tmp_path):
    st = Store(tmp_path / "s", meta={"model": "m"})
    recs = [rec(s, l, seed=s) for s in range(3) for l in range(2)]
    assert st.write(recs) == 6
    back = st.read()
    assert len(back) == 6
    for a, b in zip(recs, back):
        same(a, b)
    assert [r.sample for r in st.read(layer=1)] == ["0", "1", "2"]
    meta = st.read_meta()
    assert meta["model"] == "m" and meta["library_version"]
    # one compressed file per layer per chunk
    assert sorted(p.name for p in (tmp_path / "s").rglob("*.npz")) == ["L0000_language.npz", "L0001_language.npz"]
    assert st.verify() == []


def test_never_overwrites(tmp_path):
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    before = st.read()
    with pytest.raises(StoreError, match="already stored"):
        st.write([rec(1, 0), rec(0, 0, seed=9)])
    assert len(st.read()) == 1  # the failed write added nothing (not even sample 1)
    same(before[0], st.read()[0])
    with pytest.raises(StoreError, match="holds model"):
        Store(tmp_path / "s", meta={"model": "other"}).write([rec(5, 0)])


def _read_all_then_finish(path, then: str):
    """Both records read (and nothing reported) from an index whose last line was edited, then the store finished
    by ``repair()`` or by a resumed write of sample 7; returns the reader that read it before."""
    reader = Store(path)
    assert sorted(r.sample for r in reader.read()) == ["0", "1"] and reader.verify() == []
    if then == "repair":
        assert Store(path).repair() == []
    else:
        w = Store(path)
        w.write([rec(7, 0)])
        w.close()
    return reader


@pytest.mark.parametrize("cut", ["before the index line", "inside the index line"])
def test_interrupted_write_leaves_previous_store(tmp_path, monkeypatch, cut):
    st = Store(tmp_path / "s")
    st.write([rec(0, 0), rec(0, 1)])

    def power_cut(path, data):  # the process dies before or while appending the chunk's line
        if cut.startswith("inside"):
            with open(path, "ab") as f:
                f.write(data[: len(data) // 2])
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(store_mod, "_append_line", power_cut)
    with pytest.raises(KeyboardInterrupt):
        st.write([rec(1, 0), rec(1, 1)])
    monkeypatch.undo()
    assert {r.sample for r in st.read()} == {"0"}  # previous content intact and readable
    assert {r.sample for r in Store(tmp_path / "s").read()} == {"0"}  # also for a reader opening it now
    problems = st.verify()  # its chunk holds sample 1's records, which no index names: kept until they are written again
    assert "chunk rank00000/chunk000001 holds a write cut off before its index line (1|language|0|-1, 1|language|1|-1: " \
        "2 records), or the chunk of an index moved out of the store: kept until the same capture writes its records " \
        "again, then repair() removes it (move a moved-out index back first)" in problems, problems
    assert any("unfinished line" in p for p in problems) == cut.startswith("inside")
    # resume: the missing sample is written to a fresh chunk, the orphan is never reused, a torn line is cut off
    assert st.missing(["0", "1"], [0, 1]) == ["1"]
    st.write([rec(1, 0), rec(1, 1)])
    assert {r.sample for r in st.read()} == {"0", "1"}
    assert [len(h["keys"]) for h, _ in log_lines(tmp_path / "s")] == [2, 2]  # every line whole
    assert not list((tmp_path / "s").rglob("*.tmp"))
    st.repair()
    assert st.verify() == [] and {r.sample for r in Store(tmp_path / "s").read()} == {"0", "1"}


@pytest.mark.parametrize("then", ["resumed write", "repair"])
def test_whole_last_line_without_newline_is_a_record(tmp_path, then):
    """#60 N2: a last line that is whole (it parses, its chunk checks out) but lacks its newline (an editor that strips
    it) is a record: read, never cut; a resumed write or repair() adds the newline, and the chunk stays."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.write([rec(1, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    reader = _read_all_then_finish(tmp_path / "s", then)
    assert p.read_bytes().endswith(b"\n") and b"]]\n[" in p.read_bytes()  # the newline added, nothing cut
    assert (tmp_path / "s" / "rank00000" / "chunk000001").is_dir()
    want = ["0", "1"] + (["7"] if then != "repair" else [])
    assert sorted(r.sample for r in reader.read()) == want  # the earlier reader takes the newline in its stride
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == want and Store(tmp_path / "s").verify() == []
    # a half line is still a torn write (cut), and a whole one whose chunk fails its checksum is damage, reported
    p.write_bytes(p.read_bytes() + p.read_bytes().splitlines(keepends=True)[0][:40])
    assert any("unfinished line" in x for x in Store(tmp_path / "s").verify())
    Store(tmp_path / "s").repair()
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    f = sorted((tmp_path / "s" / "rank00000").rglob("*.npz"))[-1]
    f.write_bytes(f.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(StoreError, match="corrupt|checksum|SHA-256"):
        Store(tmp_path / "s").read()


TAILS = {"space": lambda b: b.rstrip(b"\n") + b" ",  # ST1
         "crlf file, last newline gone": lambda b: b.replace(b"\n", b"\r\n").rstrip(b"\n"),  # ST2: ends "]\r"
         "cr": lambda b: b.rstrip(b"\n") + b"\r",  # ST21
         "spaces, tab, cr": lambda b: b.rstrip(b"\n") + b" \t \r"}


@pytest.mark.parametrize("then", ["resumed write", "repair"])
@pytest.mark.parametrize("tail", list(TAILS))
def test_whole_last_line_with_trailing_whitespace_is_a_record(tmp_path, tail, then):
    """#60 ST1/ST2/ST21: a whole last line followed by JSON whitespace (spaces, a tab, a CR) and no newline is a record:
    read, never cut; a resumed write or repair() normalises the tail (drops the whitespace, adds the newline)."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.write([rec(1, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    p.write_bytes(TAILS[tail](p.read_bytes()))
    reader = _read_all_then_finish(tmp_path / "s", then)
    b = p.read_bytes()
    assert b.endswith(b"]]\n") and b.count(b"\n") == (3 if then != "repair" else 2)  # normalised, nothing cut
    assert b" \n" not in b and b"\t" not in b and b.count(b"\r") == (1 if "crlf" in tail else 0)
    assert (tmp_path / "s" / "rank00000" / "chunk000001").is_dir()
    want = ["0", "1"] + (["7"] if then != "repair" else [])
    assert sorted(r.sample for r in reader.read()) == want  # the earlier reader follows the rewritten tail
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == want and Store(tmp_path / "s").verify() == []


def test_reader_keeps_an_open_line_when_spaces_are_appended(tmp_path):
    """#60 ST15: a reader that read the last line as whole and open (no newline) still sees its record after spaces
    are appended to it (they were taken for a torn tail: read() returned [] without a word)."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    reader = Store(tmp_path / "s")
    assert [r.sample for r in reader.read()] == ["0"]
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    assert [r.sample for r in reader.read()] == ["0"]
    with open(p, "ab") as f:
        f.write(b"  ")
    assert [r.sample for r in reader.read()] == ["0"] and reader.verify() == []
    with open(p, "ab") as f:
        f.write(b"\r\n")
    assert [r.sample for r in reader.read()] == ["0"] and reader.verify() == []


@pytest.mark.parametrize("newline", [True, False])
def test_index_with_a_byte_order_mark_is_refused_never_cut(tmp_path, newline):
    """#60 ST4/ST5: an index saved with a UTF-8 byte-order mark (Notepad: a BOM and, often, no final newline) is
    refused in one line naming the file and how to remove the mark; read, a resumed write and repair() change
    nothing (it read as [] and the next write truncated it to 0 bytes)."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes()[:None if newline else -1])
    before = p.read_bytes()
    for act in (lambda s: s.read(), lambda s: s.write([rec(7, 0)]), lambda s: s.repair(), lambda s: s.verify()):
        with pytest.raises(StoreError, match=r"line 1 of index .*index-rank00000\.jsonl starts with a UTF-8 "
                                             r"byte-order mark.*Remove those 3 bytes") as e:
            act(Store(tmp_path / "s"))
        assert "\n" not in str(e.value)
    assert p.read_bytes() == before and (tmp_path / "s" / "rank00000" / "chunk000000").is_dir()
    cmd = re.search(r'python -c "(.*)"', str(e.value))[1]  # the advice, followed
    subprocess.run([sys.executable, "-c", cmd], check=True)
    assert [r.sample for r in Store(tmp_path / "s").read()] == ["0"] and Store(tmp_path / "s").verify() == []


@pytest.mark.parametrize("where", ["between lines", "at the end"])
def test_blank_lines_in_an_index_are_skipped(tmp_path, where):
    """#60 ST6/ST11: a blank line (an editor's) holds nothing: it is skipped, the records around it read, line numbers
    in messages still count it (the store was unreadable: "line 3 ... is corrupt")."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.write([rec(1, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    a, b = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(a + b"\n" + b if where == "between lines" else a + b + b" \r\n")
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == ["0", "1"] and Store(tmp_path / "s").verify() == []
    w = Store(tmp_path / "s")
    w.write([rec(7, 0)])
    w.close()
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == ["0", "1", "7"]
    with open(p, "ab") as f:
        f.write(b"not json\n")
    with pytest.raises(StoreError, match="line 5 of index"):
        Store(tmp_path / "s").read()


def test_missing_and_corrupt_files_are_reported(tmp_path):
    st = Store(tmp_path / "s")
    st.write([rec(0, 0), rec(0, 1)])
    f = next((tmp_path / "s").rglob("L0001_language.npz"))
    f.write_bytes(f.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(StoreError, match="corrupt"):
        st.read(layer=1)
    assert len(st.read(layer=0)) == 1  # the sound file still reads
    f.unlink()
    with pytest.raises(StoreError, match="missing"):
        st.read(layer=1)
    (tmp_path / "s" / "index-rank00000.jsonl").write_text("{not json\n")
    with pytest.raises(StoreError, match="corrupt"):
        st.read()
    with pytest.raises(StoreError, match="no store"):
        Store(tmp_path / "nothing").read()


def test_ranks_merge_and_refuse_duplicates(tmp_path):
    samples = [str(i) for i in range(7)]
    parts = [shard_samples(samples, r, 3) for r in range(3)]
    assert sorted(sum(parts, [])) == samples and all(set(a).isdisjoint(b) for a in parts for b in parts if a is not b)
    for r, mine in enumerate(parts):
        Store(tmp_path / "s", rank=r).write([rec(s, 0) for s in mine])
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == samples
    with pytest.raises(StoreError, match="already stored"):  # a later writer sees every rank's keys
        Store(tmp_path / "s", rank=5).write([rec(0, 0)])
    # two ranks running at the same time cannot see each other: the reader catches the duplicate
    Store(tmp_path / "t", rank=5).write([rec(0, 0)])
    shutil.copytree(tmp_path / "t" / "rank00005", tmp_path / "s" / "rank00005")
    shutil.copy(tmp_path / "t" / "index-rank00005.jsonl", tmp_path / "s")
    with pytest.raises(StoreError, match="two ranks captured the same sample"):
        Store(tmp_path / "s").read()
    with pytest.raises(ValueError):
        shard_samples(samples, 3, 3)


def test_diffusion_steps_are_separate_records(tmp_path):
    st = Store(tmp_path / "s")
    st.write([rec(0, 0, step=t) for t in range(3)])
    assert [r.step for r in st.read(step=2)] == [2]
    assert [{e["step"] for e in entries} for _, entries in log_lines(tmp_path / "s")] == [{0, 1, 2}]


def test_resume_refuses_another_mode_dtype_or_model_and_names_the_fix(tmp_path):
    st = Store(tmp_path / "s", meta={"model": "m", "dtype": "torch.float32"})
    st.write([rec(0, 0)])
    st.close()
    with pytest.raises(StoreError, match=r"holds mode='stats' records, this capture is mode='full'.*new folder"):
        Store(tmp_path / "s", meta={"model": "m", "dtype": "torch.float32"}).write([rec(1, 0, mode="full")])
    with pytest.raises(StoreError, match=r"dtype='torch.float32', this capture is dtype='torch.bfloat16'.*remove_store"):
        Store(tmp_path / "s", meta={"model": "m", "dtype": "torch.bfloat16"}).write([rec(1, 0)])
    with pytest.raises(StoreError, match="holds model='m'"):
        Store(tmp_path / "s", meta={"model": "other"}).check_resume()
    assert Store(tmp_path / "s").read_meta()["dtype"] == "torch.float32" and len(Store(tmp_path / "s").read()) == 1
    # the fix the message names: a new folder takes the other mode
    assert Store(tmp_path / "s-full", meta={"model": "m"}).write([rec(1, 0, mode="full")]) == 1


def test_resumed_capture_in_another_mode_is_refused_before_skipping_anything(tmp_path, llava, samples):
    from unicache_lib.capture.runner import capture_samples

    model, processor = llava
    st = Store(tmp_path / "s", meta={"model": "random-llava"})
    capture_samples(model, processor, samples[:1], store=st, mode="stats", layers=[0], progress=False)
    with pytest.raises(StoreError, match="this capture is mode='full'"):  # it would have skipped sample 0 as done
        capture_samples(model, processor, samples[:1], store=st, mode="full", layers=[0], progress=False)


def _counting(monkeypatch):
    """Bytes read from index files and lines whose records were parsed, from now on."""
    seen = {"bytes": 0, "lines": 0}
    blocks, entries = store_mod._index_blocks, store_mod._Log.entries

    def counted_read(path, offset):
        for block in blocks(path, offset):
            seen["bytes"] += len(block)
            yield block

    def counted_entries(log, n):
        seen["lines"] += 1
        return entries(log, n)

    monkeypatch.setattr(store_mod, "_index_blocks", counted_read)
    monkeypatch.setattr(store_mod._Log, "entries", counted_entries)
    return seen


def test_a_write_and_a_one_sample_read_do_not_read_the_whole_index(tmp_path, monkeypatch):
    """Work counted, not timed: once a Store has read the index, a write reads only the line the last write appended,
    and reading one sample parses only the lines that hold it, however many chunks the store holds."""
    path = tmp_path / "s"
    st, reader = Store(path), Store(path)
    for s in range(200):
        st.write([rec(s, li) for li in range(3)])
    log = path / "index-rank00000.jsonl"
    line = len(log.read_bytes()) // 200
    assert len(reader.read(sample="7")) == 3  # the reader's first look reads the whole index once
    seen = _counting(monkeypatch)
    for s in range(200, 210):
        st.write([rec(s, li) for li in range(3)])
    assert seen["bytes"] < 10 * 2 * line and seen["lines"] == 0  # each write: about one line, no records parsed
    seen.update(bytes=0, lines=0)
    assert [r.layer for r in reader.read(sample="205")] == [0, 1, 2]
    assert seen["bytes"] < 11 * line and seen["lines"] == 1  # the ten new lines, and the one line of the sample
    seen.update(bytes=0, lines=0)
    assert reader.missing([str(s) for s in range(212)], [0, 1, 2]) == ["210", "211"] and seen["bytes"] < 100
    # a drop is one line too, and readers follow it
    assert st.drop(["3|language|1|-1"]) == ["3|language|1|-1"] and seen["bytes"] < 2 * line
    assert [r.layer for r in reader.read(sample="3")] == [0, 2]
    seen.update(bytes=0, lines=0)
    assert len(Store(path).read(sample="3")) == 2 and seen["bytes"] == log.stat().st_size and seen["lines"] == 1


@pytest.mark.parametrize("then", ["read", "write", "repair"])
def test_an_index_whose_lines_end_in_cr_only_is_refused_never_cut(tmp_path, then):
    """#60 round 4's NST9: an index converted to CR-only line ends (an old Mac's) used to read as [] and be cut by a
    resumed write, its chunks deleted by repair(); it is refused in one line naming the conversion back, untouched,
    and after that conversion every record reads again."""
    import subprocess
    import sys

    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.write([rec(1, 0)])
    st.close()
    p = tmp_path / "s" / "index-rank00000.jsonl"
    p.write_bytes(p.read_bytes().replace(b"\n", b"\r"))
    before = p.read_bytes()
    with pytest.raises(StoreError, match="carriage return only") as e:
        {"read": lambda: Store(tmp_path / "s").read(), "write": lambda: Store(tmp_path / "s").write([rec(7, 0)]),
         "repair": lambda: Store(tmp_path / "s").repair()}[then]()
    assert p.read_bytes() == before and (tmp_path / "s" / "rank00000" / "chunk000001").is_dir()
    code = str(e.value).split('python -c "', 1)[1].rstrip('"')  # the fix the message names, run as printed
    subprocess.run([sys.executable, "-c", code], check=True)
    assert sorted(r.sample for r in Store(tmp_path / "s").read()) == ["0", "1"]


@pytest.mark.parametrize("bad", [{"layer": "0"}, {"step": "1"}, {"layer": True}, {"part": 0}, {"sample": ["0", "1"]},
                                 {"sample": ("0",)}, {"sample": 0.0}, {"sample": False}], ids=str)
def test_read_refuses_a_filter_of_the_wrong_type(tmp_path, bad):
    """#60 round 5's NS2: read(layer="0") matched nothing and returned [] without a word while two records exist;
    round 6's S1: the same for read(sample=["0", "1"]), a list made into its text."""
    import numpy as np

    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(0, 0), rec(1, 0)])
    with pytest.raises(InputTypeError, match=rf"read\({next(iter(bad))}="):
        st.read(**bad)
    assert len(st.read(layer=0)) == len(st.read(layer=np.int64(0))) == 2
    assert [r.sample for r in st.read(sample="1")] == [r.sample for r in st.read(sample=1)] == ["1"]  # the fix it names


def test_a_store_dropped_while_another_takes_its_lock_does_not_deadlock(tmp_path, monkeypatch):
    """A Store collected by the garbage collector while this thread is inside locks.acquire (its mkdir allocates) ran
    __del__ -> close -> WriterLock.release, which waited forever on the non-reentrant guard acquire held: the hostile
    tests hung in futex_wait. The guard is re-entrant now."""
    import pathlib
    import sys

    from tests.deadline import deadline

    old = Store(tmp_path / "a", meta={"model": "m"})
    old.write([rec(0, 0)])  # holds its writer lock
    real_mkdir, dropped = pathlib.Path.mkdir, []

    def mkdir_that_collects(self, *a, **k):
        if not dropped and sys._getframe(1).f_code.co_name == "acquire":  # inside locks.acquire, holding its guard:
            # what the collector does at an unlucky moment: the last reference goes, __del__ runs here
            dropped.append(True)
            old.close()  # (what __del__ runs; __del__ itself would swallow the timeout)
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir_that_collects)
    with deadline(20):
        new = Store(tmp_path / "b", meta={"model": "m"})
        new.write([rec(0, 0)])
    assert dropped and [r.sample for r in new.read()] == ["0"]
    new.close()


@pytest.mark.parametrize("call", ['missing("12", [0])', 'missing(["12"], "0")', 'missing(12, [0])', 'missing(["12"], [0.7])',
                                  'missing(["12"], [0], step=None)', 'missing(["12"], [float("nan")])',
                                  'missing(["1"], [-1])', 'missing(["1"], [0], step=-2)'])  # round 11's poor 4
def test_missing_refuses_a_text_or_a_number_for_a_list(tmp_path, call):
    """Round 7's SC3: missing("12", [0]) read the text as samples "1" and "2", found both captured and returned [],
    so sample 12 was never captured."""
    st = Store(tmp_path / "s", meta={"model": "m"})
    st.write([rec(1, 0), rec(2, 0)])
    with pytest.raises(InputTypeError, match="missing t"):  # round 8's SM5: int(0.7) asked about layer 0
        eval(f"st.{call}")
    assert st.missing(["12"], [0]) == ["12"] and st.missing(["1", "2"], [0]) == []  # the fix it names
    assert st.missing(["1", "12"], 0) == ["12"]  # one layer number is that layer
