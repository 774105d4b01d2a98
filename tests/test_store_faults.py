"""The store under faults, with real processes: two writers at once, SIGKILL at random points, flipped
bytes, malformed indexes. docs/FAULTS.md's fault table quotes the counts defined here (``KILL_TRIALS`` ...)."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from unicache_lib.capture.record import Record
from unicache_lib.core.modality import Spans
from unicache_lib.store import Store, StoreError, StoreLockedError, remove_store

ROOT = Path(__file__).resolve().parents[1]
KILL_TRIALS = 24      # SIGKILL at a random moment of a writing process
CONCURRENT_TRIALS = 3  # two processes writing the same store and rank
N_SAMPLES, N_LAYERS, WIDTH = 20, 4, 2048


def rec(sample: int, layer: int) -> Record:
    """A record whose content is a function of its key (so any record read back can be checked)."""
    g = torch.Generator().manual_seed(sample * 100 + layer)
    data = {"entropy": torch.rand(8, WIDTH, generator=g), "mass": torch.rand(8, 3, generator=g)}
    return Record(sample=str(sample), layer=layer, part="language", mode="stats", data=data,
                  spans=Spans.from_kinds([1] * 5 + [0] * 4), seq_len=9, heads=8)


WRITER = textwrap.dedent(f"""
    import sys, time
    sys.path.insert(0, {str(ROOT)!r})
    from tests.test_store_faults import rec, N_SAMPLES, N_LAYERS
    from unicache_lib.store import Store, StoreLockedError
    path, delay, hold = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    st = Store(path, meta={{"model": "m"}})
    todo = st.missing([str(s) for s in range(N_SAMPLES)], range(N_LAYERS)) if st.path.exists() else range(N_SAMPLES)
    try:
        for i, s in enumerate(todo):
            st.write([rec(int(s), li) for li in range(N_LAYERS)])
            print("wrote", s, flush=True)
            if i == 0 and hold != "-":  # keep the lock until the parent says go
                while not __import__("os").path.exists(hold):
                    time.sleep(0.02)
            time.sleep(delay)
    except StoreLockedError as e:
        print("REFUSED", e, file=sys.stderr, flush=True)
        sys.exit(3)
    print("done", flush=True)
""")


def writer(path, delay=0.0, hold="-"):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(delay), str(hold)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def wait_for_line(proc, prefix, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(f"writer exited ({proc.returncode}): {proc.stderr.read()}")
    raise AssertionError("writer too slow")


def check_intact(st: Store) -> set[str]:
    """Every indexed record reads back equal to what was written; returns the samples stored."""
    got = st.read()
    for r in got:
        want = rec(int(r.sample), r.layer)
        assert all(torch.equal(r.data[k], want.data[k]) for k in want.data), r.key
    return {r.sample for r in got}


@pytest.mark.parametrize("trial", range(CONCURRENT_TRIALS))
def test_second_writer_is_refused_and_nothing_is_lost(tmp_path, trial):
    path, go = tmp_path / "store", tmp_path / "go"
    a = writer(path, hold=go)
    wait_for_line(a, "wrote")  # a holds the lock now
    b = writer(path)
    _, err = b.communicate(timeout=120)
    assert b.returncode == 3, err
    assert f"pid {a.pid} on host" in err and "since" in err and "another folder" in err
    go.touch()
    out, err = a.communicate(timeout=120)
    assert a.returncode == 0 and "done" in out, err
    st = Store(path)
    assert check_intact(st) == {str(s) for s in range(N_SAMPLES)}
    assert len(st.index()) == N_SAMPLES * N_LAYERS and st.verify() == []


def test_other_ranks_write_alongside_and_locks_are_released(tmp_path):
    a, b = Store(tmp_path / "s", rank=0), Store(tmp_path / "s", rank=1)
    full = lambda s: [rec(s, li) for li in range(N_LAYERS)]  # noqa: E731
    a.write(full(0))
    b.write(full(1))  # another rank: its own lock
    same_process = Store(tmp_path / "s", rank=0)
    same_process.write(full(2))  # this process's own writer is shared, not refused
    child = writer(tmp_path / "s")  # another process, rank 0: refused while we hold it
    assert child.wait(timeout=120) == 3 and f"pid {os.getpid()}" in child.stderr.read()
    a.close(), same_process.close()
    child = writer(tmp_path / "s")  # released: the child writes the rest
    assert child.wait(timeout=120) == 0, child.stderr.read()
    assert check_intact(Store(tmp_path / "s")) == {str(s) for s in range(N_SAMPLES)}


@pytest.mark.extended
def test_sigkill_at_random_points(tmp_path):
    rng = random.Random(0)
    torn = 0
    for trial in range(KILL_TRIALS):
        path = tmp_path / f"s{trial}"
        w = writer(path)
        wait_for_line(w, "wrote")
        time.sleep(rng.uniform(0.0, 0.25))
        w.send_signal(signal.SIGKILL)
        w.wait()
        st = Store(path)
        before = check_intact(st)  # what was committed reads back exactly; nothing half-written is indexed
        assert len(before) >= 1 and st.damaged() == {}
        torn += any("orphaned" in p or "temporary" in p or "unfinished line" in p for p in st.verify())
        # the OS released the dead writer's lock: a resumed capture (this process) completes the store
        for s in st.missing([str(s) for s in range(N_SAMPLES)], range(N_LAYERS)):
            st.write([rec(int(s), li) for li in range(N_LAYERS)])
        st.repair()
        assert check_intact(st) == {str(s) for s in range(N_SAMPLES)} and st.verify() == []
        assert before <= {r.sample for r in st.read()}
        st.close()
    # report how many kills landed inside a write (the case the atomic renames are for)
    print(f"{KILL_TRIALS} kills, {torn} inside a write")


def test_flipped_byte_detected_then_repaired_by_recapture(tmp_path, llava, samples):
    from unicache_lib.capture.runner import capture_samples

    model, processor = llava
    some = samples[:4]
    st = Store(tmp_path / "s", meta={"model": "m"})
    capture_samples(model, processor, some, st, mode="stats", layers=[0, 1], progress=False)
    original = {r.key: r for r in st.read()}
    victim = next(e for e in st.index() if e["sample"] == some[2].id and e["layer"] == 1)
    f = st.path / victim["file"]
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))

    assert list(st.damaged()) == [victim["file"]]
    assert any(victim["key"] in p for p in st.verify())
    with pytest.raises(StoreError, match=r"repair\(\)"):
        st.read()
    assert len(st.read(sample=some[0].id)) == 2  # undamaged records stay readable
    # the error's advice, followed: repair, then the same capture call resumes
    dropped = st.repair()
    assert dropped == [victim["key"]] and Store(st.path).verify() == []
    assert st.missing([s.id for s in some], [0, 1]) == [some[2].id]
    again = capture_samples(model, processor, some, st, mode="stats", layers=[0, 1], progress=False)
    assert {r.sample for r in again.records} == {some[2].id}  # only the damaged sample was captured again
    back = {r.key: r for r in st.read()}
    assert back.keys() == original.keys()
    for k, r in back.items():
        for n in r.data:
            assert torch.equal(r.data[n].nan_to_num(), original[k].data[n].nan_to_num())
    assert (f.parent / (f.name + ".damaged")).exists()  # the damaged file is kept for inspection


K, K5 = "0|language|0|-1", "5|language|0|-1"  # K5: a key no line holds (a line reusing K is a conflict, below)
MALFORMED = ["{}", "[{}]", f'[{{"keys": "{K}", "mode": "stats"}}, []]',
             f'[{{"keys": ["{K5}"], "mode": "stats"}}, [{{"key": "{K5}"}}]]', "not json"]


@pytest.mark.parametrize("content", MALFORMED)
def test_malformed_index_gets_an_actionable_error(tmp_path, content):
    """A line of a rank's log (after a sound one) that is not an index line."""
    st = Store(tmp_path / "s")
    st.write([rec(0, 0), rec(1, 0)])
    other = Store(tmp_path / "s", rank=1)
    other.write([rec(2, 0)])
    log = st.path / "index-rank00000.jsonl"
    log.write_text(log.read_text() + content + "\n")
    with pytest.raises(StoreError, match="line 2 of index .*rename it to index-rank00000.jsonl.bad"):
        Store(st.path).index()
    log.rename(log.with_name(log.name + ".bad"))  # the advice, followed
    assert Store(st.path).missing(["0", "1", "2"], [0]) == ["0", "1"]
    st.write([rec(0, 0), rec(1, 0)])  # the resumed capture
    assert check_intact(Store(st.path)) == {"0", "1", "2"}


def test_not_a_folder_and_bad_meta(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreError, match="is a file, not a store folder"):
        Store(f)
    with pytest.raises(StoreError, match="is a file"):
        remove_store(f)
    st = Store(tmp_path / "s")
    st.write([rec(0, 0)])
    (st.path / "meta.json").write_text("{")
    with pytest.raises(StoreError, match="meta.json is corrupt"):
        st.read_meta()
    with pytest.raises(TypeError, match="rank"):
        Store(tmp_path / "s", rank="0")
    assert Store(tmp_path / "s", rank=np.int64(2)).rank == 2  # round 11's poor 3: numpy's ints, as missing takes


def test_remove_store_respects_other_writers(tmp_path):
    path, go = tmp_path / "store", tmp_path / "go"
    a = writer(path, hold=go)
    wait_for_line(a, "wrote")
    with pytest.raises(StoreLockedError, match=f"pid {a.pid}"):
        remove_store(path)  # e.g. `make run` while the notebook runs in JupyterLab
    go.touch()
    assert a.wait(timeout=120) == 0
    assert remove_store(path) and not path.exists()
    # this process's own writer (a re-run notebook cell) does not block it
    st = Store(path)
    st.write([rec(0, 0)])
    assert remove_store(path) and not path.exists()
    st.write([rec(1, 0)])  # the old object takes a fresh lock on the new folder
    assert {r.sample for r in Store(path).read()} == {"1"}
    # a folder that holds more than a store is never removed
    (path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="more than a store"):
        remove_store(path)
    assert (path / "notes.txt").exists()


FAULTS_PAGE = ROOT / "docs" / "FAULTS.md"
FAULT_HEADER = re.compile(r"^\| Fault \| Tried \| What was lost \| Test \|$", re.M)


def fault_table_rows(text: str) -> list[str]:
    """The body rows of the fault table, found by its heading row (not by line number or by comment markers, so the
    table can move within the page or between pages): every table line after the header and its separator, up to
    the first line that is not a table row."""
    found = list(FAULT_HEADER.finditer(text))
    assert found, "no fault table (a row '| Fault | Tried | What was lost | Test |') in docs/FAULTS.md"
    rows = []
    for m in found:  # every table with that heading row (the faults, and the hostile-input cases)
        for line in text[m.end():].lstrip("\n").splitlines():
            if not line.startswith("|"):
                break
            if not re.fullmatch(r"\|[-| :]+\|", line):
                rows.append(line)
    return rows


def test_fault_table_is_found_by_its_heading_wherever_it_sits():
    table = "| Fault | Tried | What was lost | Test |\n|---|---|---|---|\n| a | 1 | x | `t` |\n| b | 2 | y | `u` |\n"
    for before in ("", "# page\n\nintro\n\n", "\n" * 40 + "text\n\n"):
        assert fault_table_rows(before + table + "\nafter | not a row\n") == ["| a | 1 | x | `t` |", "| b | 2 | y | `u` |"]
    with pytest.raises(AssertionError, match="no fault table"):
        fault_table_rows("| Fault | Tried |\n|---|---|\n")


def test_fault_table_counts_come_from_the_tests():
    """Each row's "tried" equals the number of test cases of the tests it names (the SIGKILL test
    counts its KILL_TRIALS kills), so docs/FAULTS.md cannot drift from the tests."""
    import importlib

    def cases(fn):
        n = 1
        for m in getattr(fn, "pytestmark", []):
            if m.name == "parametrize":
                n *= len(m.args[1])
        return n

    mods = [importlib.import_module(f"tests.{m}") for m in ("test_store_faults", "test_store", "test_report", "test_loaders",
                                                               "test_inputs", "test_capture", "test_reuse", "test_params",
                                                               "test_hostile_input", "test_benchmarks", "test_presses",
                                                               "test_samples_hostile", "test_params_bounds",
                                                               "test_outputs_safe", "test_store_hostile",
                                                               "test_explorer", "test_depth", "test_new_lesson",
                                                               "test_store_round15", "test_round15_inputs", "test_capture_round15",
                                                               "test_round16_store_capture", "test_round16_inputs",
                                                               "test_round17", "test_round18", "test_round19", "test_round22")]
    funcs = {k: v for m in mods for k, v in vars(m).items() if k.startswith("test_")}
    rows = fault_table_rows(FAULTS_PAGE.read_text())
    assert len(rows) >= 10
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        names = re.findall(r"`(test_\w+)`", cells[3])
        assert names and all(n in funcs for n in names), r
        want = sum(KILL_TRIALS if n == "test_sigkill_at_random_points" else cases(funcs[n]) for n in names)
        assert int(cells[1]) == want, (r, want)


FORK_TRIALS = 20  # a writer that forks children which write the same store


def _child_writes(path, inherited, start, q):
    """In a forked child: write through the parent's Store object (``inherited``) or a new one; report the outcome."""
    try:
        st = inherited if inherited is not None else Store(path, meta={"model": "m"})
        st.write([rec(start, li) for li in range(N_LAYERS)])
        q.put(("wrote", ""))
    except (StoreError, StoreLockedError) as e:
        q.put(("refused", str(e)))
    except Exception as e:  # noqa: BLE001 - anything else is a failure the test reports
        q.put(("error", f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("inherit", [True, False], ids=["inherited-store", "new-store"])
def test_a_forked_child_is_refused_and_no_acknowledged_write_is_lost(tmp_path, inherit):
    """multiprocessing 'fork': a child of a writer, writing the same store and rank through the parent's Store or a
    new one, is refused with the reason; every write the parent acknowledged is indexed and reads back intact."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    path = tmp_path / "store"
    parent = Store(path, meta={"model": "m"})
    acknowledged = set()
    for trial in range(FORK_TRIALS):
        parent.write([rec(2 * trial, li) for li in range(N_LAYERS)])
        acknowledged.add(str(2 * trial))
        q = ctx.Queue()
        child = ctx.Process(target=_child_writes, args=(path, parent if inherit else None, 2 * trial + 1, q))
        child.start()
        outcome, msg = q.get(timeout=60)
        child.join(60)
        assert outcome == "refused", msg
        if inherit:
            assert "inherited by process" in msg and "through a fork" in msg and "rank=" in msg, msg
        else:
            assert f"pid {os.getpid()} on host" in msg, msg
    parent.close()
    st = Store(path)
    assert check_intact(st) == acknowledged and len(st.index()) == FORK_TRIALS * N_LAYERS and st.verify() == []


def test_spawned_process_is_refused_while_the_writer_lives(tmp_path):
    import multiprocessing as mp

    path = tmp_path / "store"
    parent = Store(path, meta={"model": "m"})
    parent.write([rec(0, li) for li in range(N_LAYERS)])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_child_writes, args=(path, None, 1, q))
    child.start()
    outcome, msg = q.get(timeout=120)
    child.join(60)
    assert outcome == "refused" and f"pid {os.getpid()} on host" in msg, msg
    parent.close()
    assert check_intact(Store(path)) == {"0"}


FORKING_WRITER = textwrap.dedent(f"""
    import os, sys, time
    sys.path.insert(0, {str(ROOT)!r})
    from tests.test_store_faults import rec, N_LAYERS
    from unicache_lib.store import Store
    st = Store(sys.argv[1], meta={{"model": "m"}})
    st.write([rec(0, li) for li in range(N_LAYERS)])
    pid = os.fork()
    if pid == 0:  # the child outlives its parent
        devnull = os.open(os.devnull, os.O_WRONLY)  # and lets go of the test's pipes, which would wait for it
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        time.sleep(60)
        os._exit(0)
    print("child", pid, flush=True)
    os._exit(0)  # the writer dies without closing anything
""")


def test_a_dead_writers_lock_is_free_while_its_forked_child_lives(tmp_path):
    path = tmp_path / "store"
    p = subprocess.run([sys.executable, "-c", FORKING_WRITER, str(path)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    child = int(p.stdout.split()[1])
    try:
        os.kill(child, 0)  # still alive
        st = Store(path)
        st.write([rec(1, li) for li in range(N_LAYERS)])  # the lock is free: no refusal naming the dead pid
        st.close()
        assert check_intact(Store(path)) == {"0", "1"}
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink"])
def test_an_index_entry_outside_the_store_is_damaged_and_never_touched(tmp_path, where):
    """A hand-edited index naming ../other/notes.txt, an absolute path or a symlink that leaves the store: verify lists
    it, read refuses it, repair drops it from the index and neither renames nor deletes the file outside."""
    path, other = tmp_path / "store", tmp_path / "other"
    other.mkdir()
    notes = other / "notes.txt"
    notes.write_text("not yours")
    st = Store(path, meta={"model": "m"})
    st.write([rec(0, li) for li in range(N_LAYERS)])
    st.write([rec(1, li) for li in range(N_LAYERS)])
    st.close()
    ip = path / "index-rank00000.jsonl"
    lines = [json.loads(line) for line in ip.read_text().splitlines()]
    victim = lines[0][1][0]
    if where == "dotdot":
        victim["file"] = "../other/notes.txt"
    elif where == "absolute":
        victim["file"] = str(notes)
    else:
        (path / "rank00000" / "escape.npz").symlink_to(notes)
        victim["file"] = "rank00000/escape.npz"
    ip.write_text("".join(json.dumps(line) + "\n" for line in lines))
    st = Store(path)
    assert any(victim["key"] in p for p in st.verify())
    with pytest.raises(StoreError, match="outside"):
        st.read(sample="0")
    dropped = st.repair()
    assert dropped == [victim["key"]]
    assert notes.read_text() == "not yours" and not (other / "notes.txt.damaged").exists()
    assert st.verify() == [] and check_intact(st) == {"0", "1"}  # the other records of sample 0 stay


def test_repair_keeps_the_damaged_copy_when_every_file_of_a_chunk_is_damaged(tmp_path):
    st = Store(tmp_path / "store", meta={"model": "m"})
    st.write([rec(0, 0)])  # one chunk, one file
    st.write([rec(1, 0)])
    st.close()
    f = next((tmp_path / "store" / "rank00000" / "chunk000000").glob("*.npz"))
    f.write_bytes(b"garbage")
    st = Store(tmp_path / "store")
    first = json.loads((tmp_path / "store" / "index-rank00000.jsonl").read_text().splitlines()[0])[0]["keys"][0]
    assert st.repair() == [first]
    assert (f.parent / (f.name + ".damaged")).read_bytes() == b"garbage"  # kept, as the README promises
    assert st.verify() == [] and check_intact(st) == {"1"}


def test_a_record_replaced_by_a_folder_is_damaged_not_a_crash(tmp_path):
    st = Store(tmp_path / "store", meta={"model": "m"})
    st.write([rec(0, 0)])
    st.close()
    f = next((tmp_path / "store" / "rank00000" / "chunk000000").glob("*.npz"))
    f.unlink()
    f.mkdir()
    st = Store(tmp_path / "store")
    assert any("not a file" in p or "damaged" in p for p in st.verify())
    with pytest.raises(StoreError, match="not a file"):
        st.read()
    key = st.index()[0]["key"]
    assert st.repair() == [key] and st.index() == [] and (f.parent / (f.name + ".damaged")).is_dir()  # kept
    assert st.verify() == []


def test_verify_tells_a_write_in_flight_from_an_interrupted_one(tmp_path):
    """A leftover of a rank that another live process holds is reported as a write possibly in flight (not
    damage); once that writer is gone, the same leftover is an interrupted write that repair() removes (#29)."""
    path = tmp_path / "store"
    Store(path, meta={"model": "m"}).write([rec(0, li) for li in range(N_LAYERS)])
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_store_faults import rec
        from unicache_lib.store import Store
        st = Store({str(path)!r})
        st.write([rec(1, 0)])                                    # holds rank 0's writer lock from here on
        (st.path / "rank00000" / "chunk000000" / ".L0000_language.npz.a1b2c3d4.tmp").write_bytes(b"half")  # mid-write
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "ready"
        (problem,) = Store(path).verify()
        assert "possibly a write in flight, not damage" in problem and f"pid {child.pid}" in problem
    finally:
        child.kill()
        child.wait()
    (problem,) = Store(path).verify()
    assert "left by an interrupted write" in problem
    Store(path).repair()
    assert Store(path).verify() == []
