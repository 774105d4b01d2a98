"""Round 22 of #60's adversarial testing (/work/team/adversarial_60_round22.md): each lost case it found, and the
poor ones fixed beside them, as a test that fails on the code it was found in."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_lib.core.errors import InputError
from unicache_lib.store import Store

from .test_store_faults import rec
from .conftest import benchmark

ROOT = Path(__file__).resolve().parents[1]


def _chunks(p: Path) -> list[str]:
    return sorted(q.relative_to(p).as_posix() for q in p.glob("rank*/chunk*"))


def _other(sample: int, layer: int):
    """The record of ``rec``'s key with other values (another picture under the same id)."""
    r = rec(sample, layer)
    r.data = {k: v * 2 for k, v in r.data.items()}
    return r


def _cut_off(st: Store, records) -> None:
    """A write of ``records`` cut off before its index line (a power cut)."""
    import unicache_lib.store as store_mod

    real, store_mod._append_line = store_mod._append_line, lambda path, data: (_ for _ in ()).throw(
        KeyboardInterrupt("power cut"))
    try:
        with pytest.raises(KeyboardInterrupt):
            st.write(records)
    finally:
        store_mod._append_line = real


@pytest.mark.parametrize("how", ["marker deleted", "killed before the marker"])
def test_a_committed_chunk_without_its_marker_is_kept_when_other_values_are_captured_under_its_keys(tmp_path, how):
    """NM1: a committed chunk whose 'committed' marker is gone (``find STORE -empty -delete``, or a kill between the
    index line and the marker), its index moved out of the store, the same ids captured with other pictures: repair()
    took the chunk for a cut-off write written again and deleted it, and the old index put back found its records
    gone. An uncommitted chunk is now removed only when every record it holds is live as the same record (recorded
    alike, arrays equal bit for bit), so nothing is lost; verify says what the kept chunk holds."""
    import unicache_lib.store as store_mod

    p = tmp_path / "s"
    if how == "marker deleted":
        Store(p, meta={"model": "m"}).write([rec(0, 0), rec(0, 1)])
        os.unlink(p / "rank00000" / "chunk000000" / "committed")
    else:
        real, store_mod.write_inside = store_mod.write_inside, lambda root, rel, *a, **k: (
            (_ for _ in ()).throw(KeyboardInterrupt("killed")) if rel.endswith("/committed") else real(root, rel, *a, **k))
        try:
            with pytest.raises(KeyboardInterrupt):
                Store(p, meta={"model": "m"}).write([rec(0, 0), rec(0, 1)])
        finally:
            store_mod.write_inside = real
    assert not (p / "rank00000" / "chunk000000" / "committed").exists()
    os.rename(p / "index-rank00000.jsonl", tmp_path / "old.jsonl")  # moved out of the store
    Store(p).write([_other(0, 0), _other(0, 1)])  # the same ids, other values
    problems = Store(p).verify()
    assert len(problems) == 1 and problems[0].startswith(
        "chunk rank00000/chunk000000 holds records (0|language|0|-1, 0|language|1|-1: 2 records) the index holds with "
        "other values or cannot read"), problems
    Store(p).repair()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001"]
    shutil.copyfile(tmp_path / "old.jsonl", p / "index-rank00000.jsonl")  # the old index put back
    got = {(r.sample, r.layer): r.data for r in Store(p).read()}
    assert all(got[("0", i)].keys() == rec(0, i).data.keys() for i in (0, 1))
    import torch
    assert all(torch.equal(got[("0", i)][k], rec(0, i).data[k]) for i in (0, 1) for k in got[("0", i)])


def test_a_cut_off_write_captured_again_with_the_same_values_is_still_removed(tmp_path):
    """The other side of NM1's rule: a cut-off write, captured again as the same records, is a duplicate repair()
    removes (verify() then empty); captured again with other values, it is kept and said."""
    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    st.write([rec(0, 0)])
    _cut_off(st, [rec(1, 0), rec(2, 0)])
    st.write([rec(1, 0), _other(2, 0)])  # one the same, one other: kept
    st.repair()
    assert "rank00000/chunk000001" in _chunks(p)
    _cut_off(st, [rec(3, 0)])
    st.write([rec(3, 0)])
    st.repair()
    assert "rank00000/chunk000003" not in _chunks(p) and "rank00000/chunk000004" in _chunks(p)
    assert [x for x in Store(p).verify() if "chunk000001" in x and "other values" in x]


def test_a_cut_off_write_captured_again_on_another_rank_is_removed(tmp_path):
    """R1 (poor): a write cut off on rank 0 and captured again on rank 1 (a distributed re-run) was kept for ever while
    verify said repair() would remove it: the same records live on any rank make it a duplicate."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    _cut_off(Store(p), [rec(1, 0)])
    Store(p, rank=1).write([rec(1, 0)])
    Store(p).repair()
    assert Store(p).verify() == [] and _chunks(p) == ["rank00000/chunk000000", "rank00001/chunk000000"]


def test_a_cut_off_chunk_whose_rewrite_is_damaged_is_kept_and_verify_says_so(tmp_path):
    """A (poor): a cut-off chunk holds A, A captured again in a chunk whose file is then damaged: verify said the
    cut-off chunk (the only sound copy) was an orphan repair() removes. It is kept, and verify says so."""
    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    _cut_off(st, [rec(0, 0)])
    st.write([rec(0, 0)])
    f = p / "rank00000" / "chunk000001" / "L0000_language.npz"
    f.write_bytes(f.read_bytes()[:-40] + b"\0" * 40)
    assert not [x for x in Store(p).verify() if x.startswith("orphaned chunk rank00000/chunk000000")]
    Store(p).repair()
    assert "rank00000/chunk000000" in _chunks(p)


def test_a_marker_that_cannot_be_written_fails_no_committed_write(tmp_path, monkeypatch):
    """M1 (poor): the committed marker's write failing (a full disk) after the index line made write() raise OSError
    though its records were committed. The line is the commit: the write returns, its records read back."""
    import errno

    import unicache_lib.store as store_mod

    real = store_mod.write_inside
    monkeypatch.setattr(store_mod, "write_inside", lambda root, rel, *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")) if rel.endswith("/committed") else real(root, rel, *a, **k))
    assert Store(tmp_path / "s", meta={"model": "m"}).write([rec(0, 0)]) == 1
    assert [r.sample for r in Store(tmp_path / "s").read()] == ["0"] and Store(tmp_path / "s").verify() == []


def test_a_store_alive_at_interpreter_exit_says_nothing(tmp_path):
    """DEL (poor): a Store alive when the interpreter exits printed 'Exception ignored in Store.__del__' (contextlib
    already gone)."""
    code = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport unicache_lib.store as S\nfrom unicache_lib.store "
            f"import Store\nfrom tests.test_store_faults import rec\nst = Store({str(tmp_path / 's')!r}, meta="
            f"{{'model': 'm'}})\nst.write([rec(0, 0)])\nst.close()\n")  # (round 22's script, as it was)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Exception ignored" not in out.stderr, out.stderr


def test_a_kept_committed_chunk_is_named_with_its_records(tmp_path):
    """LN18's verify (poor): a committed chunk no index names was said to be kept without the records it holds, and
    the advice to capture its samples again stayed after they were."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    shutil.copy(p / "index-rank00000.jsonl", tmp_path / "older.jsonl")
    Store(p).write([rec(1, 0)])  # chunk000001, committed
    shutil.copyfile(tmp_path / "older.jsonl", p / "index-rank00000.jsonl")
    (kept,) = Store(p).verify()
    assert kept.startswith("chunk rank00000/chunk000001 (1|language|0|-1: 1 records) is not named by any index") \
        and "capture its samples again" in kept
    Store(p).write([rec(1, 0)])
    (kept,) = Store(p).verify()
    assert "its records are all live again" in kept and "capture its samples again" not in kept


def _fake_notebooks(monkeypatch, R):
    """replicate's notebook runs in a second: jupytext's build writes the source, papermill's run copies it and
    writes the committed scoreboard where the notebook would."""
    import json
    import types

    def build(cmd, check):
        Path(cmd[cmd.index("--output") + 1]).write_text(Path(cmd[-1]).read_text())

    def execute_notebook(src, dst, parameters, **k):
        Path(dst).write_text(Path(src).read_text() + json.dumps(parameters))
        nb = Path(src).stem
        (Path(parameters["OUT_DIR"])).mkdir(parents=True, exist_ok=True)
        (Path(parameters["OUT_DIR"]) / "scoreboard.json").write_text(
            (ROOT / "data" / "results" / f"{nb}.json").read_text())

    monkeypatch.setattr(R.subprocess, "run", build)
    monkeypatch.setitem(sys.modules, "papermill", types.SimpleNamespace(execute_notebook=execute_notebook))


def test_replicate_never_writes_its_notebooks_over_a_users_file_whatever_the_marker_says(monkeypatch, capsys, tmp_path):
    """RP1: a folder of a user's notebooks with a marker claiming replicate wrote it (copied, forged) passed the folder
    check, and replicate wrote its notebooks over the user's; RP7 (poor): a notebook of replicate's the user edited
    afterwards was replaced. Every notebook replicate writes is now recorded with its SHA-256 and checked before it is
    written again: only one whose content is what replicate wrote is replaced."""
    import json

    from unicache_lib.paths import OUTPUT_MARKER
    import unicache_lib.replicate as R

    _fake_notebooks(monkeypatch, R)
    out = tmp_path / "r"
    (out / "shipped").mkdir(parents=True)
    (out / "shipped" / "02_understanding_maps.ipynb").write_text("my notebook")
    (out / OUTPUT_MARKER).write_text(json.dumps({"written_by": "replicate", "files": []}))
    with pytest.raises(SystemExit):
        R.main(["--quick", "--out", str(out)])
    assert "02_understanding_maps.ipynb is there already" in capsys.readouterr().err  # one line, exit status 2
    assert (out / "shipped" / "02_understanding_maps.ipynb").read_text() == "my notebook"
    R.main(["--quick", "--out", str(tmp_path / "own")])
    R.main(["--quick", "--out", str(tmp_path / "own")])  # its own notebooks, as it wrote them: replaced
    done = tmp_path / "own" / "seed-1" / "05_kv_eviction.executed.ipynb"
    done.write_text(done.read_text() + "my notes")
    with pytest.raises(SystemExit):
        R.main(["--quick", "--out", str(tmp_path / "own")])
    assert "05_kv_eviction.executed.ipynb is there already and is not a file replicate wrote as it is now" in \
        capsys.readouterr().err and done.read_text().endswith("my notes")


def test_a_refused_replicate_run_leaves_no_folder_behind(monkeypatch, capsys, tmp_path):
    """RP6b: a run refused for its arguments (--readme naming no file, the shipped seed) had already created --out and
    marked it replicate's, so a file the user saved there next was taken as replicate's own. Nothing is made first."""
    import unicache_lib.replicate as R

    monkeypatch.setattr(R, "run_seed", lambda *a, **k: pytest.fail("ran before refusing"))
    for argv in (["--readme", str(tmp_path / "missing.md")], ["--seeds", str(R.sample_set.SEED)]):
        with pytest.raises(SystemExit):
            R.main(argv + ["--out", str(tmp_path / "r")])
        assert not (tmp_path / "r").exists()


def test_a_chunk_write_makes_its_files_durable_before_its_index_line(tmp_path, monkeypatch):
    """Round 22's note (durability): a chunk file's rename was not made durable (its folder never fsync'd), so after a
    power cut the fsync'd index line could name a file the disk never kept. Each rename's folder, and a new folder's
    parent, is synced before the line is appended."""
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    chunk, index = str(p / "rank00000" / "chunk000000"), str(p / "index-rank00000.jsonl")
    assert str(p / "rank00000") in synced[:synced.index(index)]  # the chunk folder's name, in its rank folder
    assert chunk in synced[synced.index(next(s for s in synced if s.startswith(chunk + "/"))):synced.index(index)]


# ---- round 23 (/work/team/adversarial_60_round23.md)

@pytest.mark.parametrize("where", ["seed-1", "shipped/02_understanding_maps"])
def test_replicate_never_writes_through_a_link_under_its_out_folder(monkeypatch, capsys, tmp_path, where):
    """RQ5 / RQ5b (unsafe): in a folder replicate wrote, a seed's folder or a notebook's output folder replaced by a
    link to a user's folder elsewhere: the next run wrote its notebooks and outputs there. Every folder it writes
    under --out is opened without following a link, and a link is refused in one line."""
    import unicache_lib.replicate as R

    _fake_notebooks(monkeypatch, R)
    out, theirs = tmp_path / "own", tmp_path / "theirs"
    R.main(["--quick", "--out", str(out)])
    theirs.mkdir()
    (theirs / "scoreboard.json").write_text("mine")
    shutil.rmtree(out / where)
    (out / where).symlink_to(theirs)
    with pytest.raises(SystemExit):
        R.main(["--quick", "--out", str(out)])
    assert "symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(theirs)) == ["scoreboard.json"] and (theirs / "scoreboard.json").read_text() == "mine"


def test_replicate_refuses_a_users_file_in_a_notebooks_output_folder_before_it_runs(monkeypatch, capsys, tmp_path):
    """RQ1 / RQ2: a user's scoreboard.json in a notebook's output folder under --out (a forged replicate marker above
    it, or a seed's folder of a genuine one) was overwritten where the notebook's own check cell was not run. replicate
    applies that check (new, empty or a notebook's folder) before each notebook runs."""
    import unicache_lib.replicate as R

    _fake_notebooks(monkeypatch, R)
    out = tmp_path / "own"
    R.main(["--quick", "--out", str(out)])
    (out / "seed-4" / "02_understanding_maps").mkdir(parents=True)
    (out / "seed-4" / "02_understanding_maps" / "scoreboard.json").write_text("mine")
    with pytest.raises(SystemExit):
        R.main(["--quick", "--seeds", "4", "--out", str(out)])
    assert "holds files no notebook wrote" in capsys.readouterr().err
    assert (out / "seed-4" / "02_understanding_maps" / "scoreboard.json").read_text() == "mine"


def test_a_leftover_chunk_naming_a_key_twice_is_kept(tmp_path):
    """I6 (silent, crafted): a leftover chunk recording one key twice, once with the live values and once with values
    found nowhere else, was removed (one entry per key compared). Such a chunk is not known: it is kept."""
    import numpy as np

    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    _cut_off(st, [_other(0, 0)])
    st.write([rec(0, 0)])
    live = p / "rank00000" / "chunk000001" / "L0000_language.npz"
    shutil.copy(live, p / "rank00000" / "chunk000000" / "L0001_language.npz")  # a copy of the live file beside it
    assert np.load(p / "rank00000" / "chunk000000" / "L0000_language.npz")["r0__entropy"].sum() != \
        np.load(live)["r0__entropy"].sum()
    assert st._held("rank00000/chunk000000") is None  # whichever of its files is listed first: not known
    st.repair()
    assert "rank00000/chunk000000" in _chunks(p)


def test_verify_lists_problems_when_two_ranks_name_one_key(tmp_path):
    """T1 (poor): with two ranks listing the same key, verify() raised (it asked every live key through keys(), which
    refuses them) instead of naming the conflict."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    Store(p, rank=1).write([rec(1, 0)])
    shutil.copy(p / "index-rank00000.jsonl", p / "index-rank00002.jsonl")  # rank 2's index names rank 0's key
    problems = Store(p).verify()
    assert len(problems) == 1 and "is in both index-rank00000.jsonl and index-rank00002.jsonl" in problems[0] \
        and "delete the line that should not be there" in problems[0], problems


def test_a_kept_chunk_whose_keys_are_live_with_other_values_is_not_called_a_copy(tmp_path):
    """V1 (poor): verify said 'its records are all live again … remove the folder yourself' of a kept chunk whose
    values differ from the live ones (keys alone compared): it now says the values differ, and calls a chunk a copy
    only when its values are the live ones."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    shutil.copy(p / "index-rank00000.jsonl", tmp_path / "older.jsonl")
    Store(p).write([rec(1, 0)])  # chunk000001, committed
    shutil.copyfile(tmp_path / "older.jsonl", p / "index-rank00000.jsonl")
    Store(p).write([_other(1, 0)])
    (kept,) = Store(p).verify()
    assert "its keys are live again, with other values" in kept and "a copy" not in kept


def test_repair_reads_each_live_file_once_for_a_leftover_of_many_records(tmp_path, monkeypatch):
    """Q1 (poor): deciding whether a leftover chunk is a copy read the live chunk file again for every record it holds
    (28 s for 400 records); each live file is now read once."""
    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    _cut_off(st, [rec(i, 0) for i in range(40)])
    st.write([rec(i, 0) for i in range(40)])
    reads, real = [], Store._content
    monkeypatch.setattr(Store, "_content", lambda self, rel, ents: reads.append(rel) or real(self, rel, ents))
    st.repair()
    # once for the damage check, once to compare: not once per record
    assert _chunks(p) == ["rank00000/chunk000001"] and reads.count("rank00000/chunk000001/L0000_language.npz") <= 2


# ---- round 24 (/work/team/adversarial_60_round24.md)

@pytest.mark.parametrize("link", ["store", "focus_per_layer.png", "hard link", "entropy_phases.csv"])
def test_a_notebooks_output_folder_with_a_link_inside_is_refused(tmp_path, link):
    """L1 / L2 (unsafe): a notebook's marked OUT_DIR holding a link (OUT_DIR/store to a user's folder of stores, a
    figure's name to a user's file) passed the check cell, and the notebook's remove_store, plots.save and to_csv went
    through it: the user's store elsewhere deleted, their files replaced (round 25: a hard link too; a FIFO hung
    to_csv). A link, hard link or FIFO anywhere inside is now refused in the check cell (and by replicate, which applies it), and removing the link, as the message says, lets the run go on."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.paths import notebook_output

    out, theirs = tmp_path / "out", tmp_path / "theirs"
    notebook_output(out)  # an earlier run's folder
    (out / "figures").mkdir()
    theirs.mkdir()
    (theirs / "mine.png").write_bytes(b"mine")
    if link == "hard link":  # (cp -al of a user's file: a notebook's to_csv would rewrite both names)
        os.link(theirs / "mine.png", out / "figures" / link)
    elif link.endswith(".csv"):  # a FIFO: to_csv would hang
        os.mkfifo(out / "figures" / link)
    else:
        (out / "figures" / link).symlink_to(theirs if link == "store" else theirs / "mine.png")
    with pytest.raises(InputError, match=r"holds (a symbolic link, )?'.*figures/" + link.replace(".", r"\.")
                       + r"'(,| ).*remove it \(os.unlink\)"):
        notebook_output(out)
    assert (theirs / "mine.png").read_bytes() == b"mine"
    os.unlink(out / "figures" / link)
    assert notebook_output(out) == out


def test_replicate_refuses_a_link_inside_a_notebooks_output_folder(monkeypatch, capsys, tmp_path):
    """L1 through replicate: its own notebook output folder with a link inside (to a user's stores) is refused before
    the notebook runs, and nothing the link points to is touched."""
    import unicache_lib.replicate as R

    _fake_notebooks(monkeypatch, R)
    out, theirs = tmp_path / "own", tmp_path / "theirs"
    R.main(["--quick", "--out", str(out)])
    (theirs / "tiny-sd").mkdir(parents=True)
    (theirs / "tiny-sd" / "meta.json").write_text("{}")
    (out / "shipped" / "03_diffusion_steps" / "store").symlink_to(theirs)
    with pytest.raises(SystemExit):
        R.main(["--quick", "--out", str(out)])
    assert "holds a symbolic link" in capsys.readouterr().err and (theirs / "tiny-sd" / "meta.json").exists()


# ---- round 26 (/work/team/adversarial_60_round26.md)

def test_a_benchmark_result_never_touches_a_file_beside_it_nor_one_it_did_not_write(tmp_path):
    """PP1 (lost): prefill_parts.py --out DIR/r.txt wrote DIR/r.tmp first, replacing a user's file of that name, which
    no option named; BE1: batch_eviction.py (and five more) --out docs/GLOSSARY.md or a user's file replaced it. Every
    benchmark with a file --out now writes through one rule (evaluate.write_result): a temporary name of its own, and
    outside the project's result folders the output check (never a repository folder, never over a file it did not
    write; its own is replaced)."""
    from unicache_lib.core.errors import InputError

    E = benchmark("evaluate")
    (tmp_path / "r.tmp").write_text("mine")
    E.write_result(tmp_path / "r.txt", b"one\n", "prefill_parts.py")
    E.write_result(tmp_path / "r.txt", b"two\n", "prefill_parts.py")  # its own: replaced
    assert (tmp_path / "r.tmp").read_text() == "mine" and (tmp_path / "r.txt").read_text() == "two\n"
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="notes.txt is there already"):
        E.write_result(tmp_path / "home" / "notes.txt", b"x", "batch_eviction.py")
    with pytest.raises(InputError):
        E.write_result(ROOT / "docs" / "GLOSSARY.md", b"x", "batch_eviction.py")
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("target", ["docs/GLOSSARY.md", "a file of the user's"])
def test_a_benchmark_refuses_a_bad_out_before_it_measures(tmp_path, capsys, target):
    """BE1: the refusal comes before the measuring (minutes), in one line, exit status 2."""
    import argparse

    E = benchmark("evaluate")
    path = ROOT / target if target.startswith("docs") else tmp_path / "mine.txt"
    if not path.exists():
        path.write_text("mine")
    before = path.read_bytes()
    ap = argparse.ArgumentParser(prog="batch_eviction.py")
    ap.add_argument("--out", type=Path, default=None)
    with pytest.raises(SystemExit):
        E.committed_or_outputs(ap, ap.parse_args(["--out", str(path)]), tmp_path / "committed.txt")
    assert "error: --out" in capsys.readouterr().err and path.read_bytes() == before


@pytest.mark.parametrize("tool", ["batch_eviction", "merge_eviction", "prefill_cover", "prefill_parts",
                                  "stats_stride_error", "store_scale", "tune_step_skip"])
def test_every_benchmark_with_a_file_out_writes_through_the_one_rule(tool):
    """The seven tools whose --out names a file write it only through evaluate.write_result (no write_text, to_csv
    or rename of their own)."""
    src = (ROOT / "benchmarks" / f"{tool}.py").read_text()
    assert "write_result(" in src and not any(w in src for w in (".write_text(", ".to_csv(out", "_atomic_write_bytes",
                                                                   "with_suffix(\".tmp\")"))


# ---- round 27 (/work/team/adversarial_60_round27.md)

def test_replicate_never_rewrites_a_hard_linked_kept_copy_of_its_table(monkeypatch, tmp_path):
    """RL1 (unsafe): replicate rewrote its own verdicts.csv under --out in place, so a copy kept with ln (or a cp -al
    backup) took the next run's table. Its files are written to a temporary name and renamed over theirs."""
    import unicache_lib.replicate as R

    _fake_notebooks(monkeypatch, R)
    out = tmp_path / "own"
    R.main(["--quick", "--out", str(out)])
    os.link(out / "verdicts.csv", tmp_path / "kept.csv")
    R.main(["--quick", "--out", str(out)])
    assert os.stat(out / "verdicts.csv").st_ino != os.stat(tmp_path / "kept.csv").st_ino
    assert os.stat(tmp_path / "kept.csv").st_nlink == 1


def test_gpu_rehearsal_refuses_a_folder_of_a_users_before_anything(tmp_path, capsys):
    """GR1 (lost): benchmarks/gpu_rehearsal.py --out checked nothing; with --cpu-smoke a user's
    DIR/models/llava-1.5-7b/config.json was replaced by the stand-in's. --out must be new, empty or its own, refused in
    one line before anything is built."""
    G = benchmark("gpu_rehearsal")
    mine = tmp_path / "d" / "models" / "llava-1.5-7b" / "config.json"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    with pytest.raises(SystemExit):
        G.main(["--cpu-smoke", "--out", str(tmp_path / "d")])
    assert "holds files gpu_rehearsal.py did not write" in capsys.readouterr().err and mine.read_text() == "mine"


def _rows():
    return [{"model": "m", "imitates": "M", "notebook": "01_capture", "wall_s": 1.0, "peak_rss_mb": 10, "device": "cpu",
             "dtype": "float32", "image_tokens": 4, "layers": 2, "verdicts": "x", "build_s": 0.1}]


def test_rehearsal_takes_only_a_new_empty_or_own_folder_and_writes_its_table_by_a_name_of_its_own(tmp_path,
                                                                                                 monkeypatch, capsys):
    """RH1 (lost): `python -m unicache_lib.rehearsal --out DIR --no-readme` checked DIR without its names and wrote
    DIR/rehearsal.csv through DIR/rehearsal.tmp: a user's files of both names were replaced. Its --out is now new, empty
    or rehearsal's own (refused in one line before anything is built), and the table goes through a temporary name of
    its own, renamed over the old one (a hard-linked kept copy keeps the old table)."""
    from unicache_lib import rehearsal

    built = []
    monkeypatch.setattr(rehearsal, "rehearse", lambda *a, **k: built.append(a) or _rows())
    mine = tmp_path / "d"
    mine.mkdir()
    for name in ("rehearsal.csv", "rehearsal.tmp"):
        (mine / name).write_text("mine")
    with pytest.raises(SystemExit) as e:
        rehearsal.main(["--out", str(mine), "--no-readme", "--notebooks", "01_capture"])
    assert e.value.code == 2 and not built and "holds files rehearsal did not write" in capsys.readouterr().err
    assert [(mine / n).read_text() for n in ("rehearsal.csv", "rehearsal.tmp")] == ["mine", "mine"]
    own = tmp_path / "own"
    rehearsal.main(["--out", str(own), "--no-readme", "--notebooks", "01_capture"])
    os.link(own / "rehearsal.csv", tmp_path / "kept.csv")
    (own / "rehearsal.tmp").write_text("mine")  # a file of that name in its own folder is not its to replace
    monkeypatch.setattr(rehearsal, "rehearse", lambda *a, **k: [{**_rows()[0], "wall_s": 2.0}])
    rehearsal.main(["--out", str(own), "--no-readme", "--notebooks", "01_capture"])  # its own folder: taken again
    assert ",2.0," in (own / "rehearsal.csv").read_text() and ",1.0," in (tmp_path / "kept.csv").read_text()
    assert (own / "rehearsal.tmp").read_text() == "mine"


def test_a_stand_in_builder_takes_only_a_new_empty_or_stand_in_folder(tmp_path, monkeypatch, capsys):
    """SB1 (lost): `python -m unicache_lib.zoo.builders.standins --out DIR --only qwen2-vl-2b` (and gen_standins, the
    same command line) saved into DIR/<name>/ in place: a user's config.json there was replaced. DIR is now new, empty
    or a folder of stand-ins (marked "standins"), refused in one line before anything is built; an unknown name in
    --only is refused by argparse."""
    from unicache_lib.zoo.builders import gen_standins, standins

    mine = tmp_path / "d" / "qwen2-vl-2b" / "config.json"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    built = []
    for mod, name in ((standins, "qwen2-vl-2b"), (gen_standins, "flux-dev")):
        monkeypatch.setattr(mod, "build", lambda n, out, seed=0, **k: built.append(n) or out / n)
        with pytest.raises(SystemExit) as e:
            mod.main(["--out", str(tmp_path / "d"), "--only", name])
        assert e.value.code == 2 and "holds files standins did not write" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            mod.main(["--out", str(tmp_path / "new"), "--only", "no-such-model"])
    assert not built and mine.read_text() == "mine" and not (tmp_path / "new").exists()


@pytest.mark.parametrize("case", ["a forged marker", "a card the builders did not record"])
def test_a_stand_in_is_saved_over_a_model_folder_only_when_a_builder_recorded_it(tmp_path, capsys, case):
    """SB1's neighbour: in a folder marked as the builders' (a forged or copied marker, or a user's model moved into
    one), a model folder is replaced only when its model card (which holds the weights' checksums) is recorded in the
    marker with the content it holds: a user's model (no card, or a card of its own) is refused in one line before
    anything is built; a stand-in a builder saved is rebuilt in place."""
    from unicache_lib.paths import OUTPUT_MARKER
    from unicache_lib.zoo.builders import standins

    d = tmp_path / "models"
    spec = standins.tiny("LLaVA-1.5")
    first = standins.build("llava-1.5-7b", d, spec=spec)
    assert standins.build("llava-1.5-7b", d, spec=spec) == first  # its own, recorded: rebuilt
    theirs = d / "qwen2-vl-2b"
    theirs.mkdir()
    (theirs / "config.json").write_text("mine")
    if case == "a forged marker":
        (d / OUTPUT_MARKER).write_text('{"written_by": "standins", "files": ["qwen2-vl-2b/config.json"]}')
    else:
        (theirs / "model_card.json").write_text('{"stand_in": true}')
    with pytest.raises(SystemExit) as e:
        standins.main(["--out", str(d), "--only", "qwen2-vl-2b"])
    assert e.value.code == 2 and (theirs / "config.json").read_text() == "mine"
    assert "qwen2-vl-2b" in capsys.readouterr().err
    with pytest.raises(InputError):
        standins.build("qwen2-vl-2b", d, spec=spec)
    assert (theirs / "config.json").read_text() == "mine"


def test_a_file_out_through_a_linked_folder_or_with_a_literal_tilde_is_written_where_it_was_checked(tmp_path,
                                                                                                    monkeypatch):
    """Round 27 (poor): a file --out in a folder reached through a link passed the early check, then failed after the
    measuring (its path taken relative to the resolved folder); a literal '~' was expanded by the check, not by the
    write. Both now write the file the check approved."""
    E = benchmark("evaluate")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "via")
    E.write_result(tmp_path / "via" / "r.txt", b"one\n", "prefill_parts.py")
    assert (tmp_path / "real" / "r.txt").read_text() == "one\n"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    E.write_result(Path("~/r.txt"), b"two\n", "prefill_parts.py")
    assert (tmp_path / "home" / "r.txt").read_text() == "two\n" and not Path("~").exists()


@pytest.mark.parametrize("tool", ["store_scale", "tune_step_skip"])
def test_store_scale_and_tune_step_skip_refuse_a_bad_out_before_they_measure(tool, tmp_path):
    """Round 27 (poor): store_scale.py and tune_step_skip.py refused a bad --out only after measuring (minutes). Now
    in one line before (here: a size that would take hours, and the grid; the refusal comes at once)."""
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    extra = ["--sizes", "100000000"] if tool == "store_scale" else []
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{tool}.py"), *extra, "--out", str(mine)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "error: --out" in p.stderr and "mine.txt is there already" in p.stderr, p.stderr
    assert mine.read_text() == "mine"


@pytest.mark.parametrize("where", ["own result folder", "a folder the user named"])
def test_a_benchmark_result_is_never_written_through_a_link_at_a_predictable_temporary_name(tmp_path, monkeypatch,
                                                                                             where):
    """Round 27 B4 (noted): write_owned wrote its temporary `.NAME.<pid>.tmp` with write_bytes, following a link planted
    at that name (a file outside the folder took the result). Both of write_result's branches now write through
    write_inside: a random temporary name, created O_EXCL | O_NOFOLLOW."""
    E = benchmark("evaluate")
    folder = tmp_path / "results"
    folder.mkdir()
    if where == "own result folder":
        monkeypatch.setattr(E, "RESULTS", folder)
    far = tmp_path / "far.txt"
    far.write_text("mine")
    os.symlink(far, folder / f".r.txt.{os.getpid()}.tmp")
    E.write_result(folder / "r.txt", b"result\n", "batch_eviction.py")
    assert far.read_text() == "mine" and (folder / "r.txt").read_text() == "result\n"


def test_an_unmarked_folder_under_outputs_is_refused_with_the_way_on_and_the_way_works(tmp_path, monkeypatch, capsys):
    """A folder under a repository's outputs/ that an earlier version of a tool made (before it marked its folders) is
    refused like any other, and the message says to delete it and run again; doing so works. A folder elsewhere is
    never told to be deleted (it may be yours)."""
    import shlex

    import unicache_lib.paths as P

    monkeypatch.setattr(P, "repository_roots", lambda *extra: [tmp_path])
    old = tmp_path / "outputs" / "rehearsal"
    old.mkdir(parents=True)
    (old / "rehearsal.csv").write_text("an earlier run's")
    with pytest.raises(SystemExit):
        P.claim_output_folder(old, "rehearsal")
    err = capsys.readouterr().err
    assert f"delete it (rm -r {shlex.quote(str(old))}) and run again" in err
    shutil.rmtree(old)  # as the message says
    assert P.claim_output_folder(old, "rehearsal") == old.resolve()
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        P.claim_output_folder(elsewhere, "rehearsal")
    assert "rm -r" not in capsys.readouterr().err


# ---- round 28 (/work/team/adversarial_60_round28.md)

def _mine_folder(tmp_path) -> tuple[Path, dict]:
    """A user's folder of models outside any tool's folder, and what it holds."""
    mine = tmp_path / "mine"
    (mine / "qwen2-vl-2b").mkdir(parents=True)
    (mine / "qwen2-vl-2b" / "config.json").write_text("my config")
    (mine / "llava-1.5-7b").mkdir()
    (mine / "llava-1.5-7b" / "config.json").write_text("my config")
    return mine, {p.relative_to(mine).as_posix(): p.read_bytes() for p in mine.rglob("*") if p.is_file()}


def _held(mine: Path) -> dict:
    return {p.relative_to(mine).as_posix(): p.read_bytes() for p in mine.rglob("*") if p.is_file()}


def test_the_rehearsal_never_builds_nor_runs_through_a_link_in_its_own_folder(tmp_path, monkeypatch, capsys):
    """RM1 (unsafe): in --out the rehearsal had marked, the user made `models` a link to their own models folder; the
    next run saved the stand-in through it (their config.json and weights replaced) and planted a marker there. Every
    folder below --out is now opened with no link on the way (models/, generation/, each model's run folders),
    refused in one line, exit status 2, before anything is built or run."""
    from unicache_lib import rehearsal

    monkeypatch.setattr(rehearsal, "rehearse", lambda *a, **k: _rows())
    out = tmp_path / "o"
    rehearsal.main(["--out", str(out), "--no-readme", "--notebooks", "01_capture"])  # its own from now on
    monkeypatch.undo()
    mine, before = _mine_folder(tmp_path)
    ran = []
    monkeypatch.setattr(rehearsal, "_isolated", lambda *a: ran.append(a) or {})
    for link, args in (("models", []), ("generation", ["--side", "generation"]), ("qwen2-vl-2b", [])):
        os.symlink(mine, out / link)
        with pytest.raises(SystemExit) as e:
            rehearsal.main(["--out", str(out), "--no-readme", "--models", "qwen2-vl-2b", "--notebooks", "01_capture",
                            *args] if not args else ["--out", str(out), "--no-readme", "--models", "flux-dev",
                                                     "--notebooks", "06_step_reuse", *args])
        assert e.value.code == 2 and "symbolic link" in capsys.readouterr().err, link
        os.unlink(out / link)
        assert _held(mine) == before and not ran
    assert not os.path.lexists(mine / ".unicache-output")


def test_a_stand_in_is_never_saved_through_a_link_at_its_folder(tmp_path, capsys):
    """SL1 (unsafe): in a folder of stand-ins, the user replaced `qwen2-vl-2b` by a link to their real model folder;
    the next build saved through it. A model folder that is a link is refused (the command line in one line), and so
    is a link at a stand-in's own folder that the marker recorded."""
    from unicache_lib.zoo.builders import standins

    d = tmp_path / "models"
    spec = standins.tiny("LLaVA-1.5")
    standins.build("llava-1.5-7b", d, spec=spec)
    mine, before = _mine_folder(tmp_path)
    os.symlink(mine / "qwen2-vl-2b", d / "qwen2-vl-2b")
    with pytest.raises(SystemExit) as e:
        standins.main(["--out", str(d), "--only", "qwen2-vl-2b"])
    assert e.value.code == 2 and "symbolic link" in capsys.readouterr().err
    shutil.move(d / "llava-1.5-7b", mine / "built")  # a recorded stand-in, now reached through a link
    os.symlink(mine / "built", d / "llava-1.5-7b")
    before = _held(mine)
    with pytest.raises(InputError, match="symbolic link"):
        standins.build("llava-1.5-7b", d, spec=spec)
    assert _held(mine) == before


def test_gpu_rehearsal_never_builds_through_a_link_in_its_own_folder(tmp_path, capsys):
    """GL1 (unsafe): gpu_rehearsal's own --out with `models` made a link to a user's folder: the stand-in was saved
    through it. Its folders below --out are opened with no link on the way, refused in one line before anything is
    built."""
    G = benchmark("gpu_rehearsal")
    out = tmp_path / "o"
    mine, before = _mine_folder(tmp_path)
    from unicache_lib.paths import record_output_files

    record_output_files(out, "gpu_rehearsal.py", {})  # an earlier run's folder
    for link in ("models", "runs"):
        os.symlink(mine, out / link)
        with pytest.raises(SystemExit):
            G.main(["--cpu-smoke", "--out", str(out)])
        assert "symbolic link" in capsys.readouterr().err, link
        os.unlink(out / link)
    assert _held(mine) == before


def test_the_rehearsal_never_writes_an_executed_notebook_through_a_link_or_into_a_shared_file(tmp_path, monkeypatch):
    """RM1's neighbour: papermill writes the executed notebook in place, so a link at its name (or a hard-linked kept
    copy) would take it. run_measured removes such a name first (the link, or the one name of the shared file), and
    the new notebook is a file of its own."""
    import subprocess as sp

    from unicache_lib import rehearsal

    class FakePapermill:  # writes its output path as papermill does: open(path, "w")
        def __init__(self, cmd, **k):
            self.path, self.returncode = cmd[cmd.index("python3") + 3], 0

        def communicate(self, timeout=None):
            Path(self.path).write_text("executed")
            return "", ""

    monkeypatch.setattr(sp, "Popen", FakePapermill)
    far, kept = tmp_path / "far.ipynb", tmp_path / "kept.ipynb"
    far.write_text("mine")
    (tmp_path / "o").mkdir()
    os.symlink(far, tmp_path / "o" / "a.ipynb")
    (tmp_path / "o" / "b.ipynb").write_text("earlier")
    os.link(tmp_path / "o" / "b.ipynb", kept)
    for name in ("a", "b"):
        rehearsal.run_measured("01_capture", {}, tmp_path / "o" / f"{name}.ipynb")
        assert (tmp_path / "o" / f"{name}.ipynb").read_text() == "executed"
    assert far.read_text() == "mine" and kept.read_text() == "earlier"


def test_a_shard_written_under_an_out_reached_through_a_link_or_a_tilde_lands_where_it_was_checked(tmp_path,
                                                                                                  monkeypatch):
    """EV1/EV2 (poor): evaluate.py --out L (a link to a folder), or --out '~/ev', ran the whole evaluation and then
    failed with a raw ValueError (the shard's path unresolved, the checked folder resolved). write_owned now takes the
    path's folder as resolved; a link on the way below the checked folder that leads out is refused in one line."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.paths import check_output_path

    E = benchmark("evaluate")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "L")
    given = check_output_path(tmp_path / "L", "--out", "evaluate.py")
    E.write_owned(tmp_path / "L" / "rows.csv", b"a\n", given)
    assert (tmp_path / "real" / "rows.csv").read_text() == "a\n"
    monkeypatch.setenv("HOME", str(tmp_path / "real"))
    E.write_owned(Path("~/rows2.csv"), b"b\n", check_output_path("~", "--out", "evaluate.py"))
    assert (tmp_path / "real" / "rows2.csv").read_text() == "b\n"
    (tmp_path / "far").mkdir()
    os.symlink(tmp_path / "far", tmp_path / "real" / "results")
    with pytest.raises(InputError, match="never writes through one"):
        E.write_owned(tmp_path / "L" / "results" / "x.csv", b"c\n", given)
    assert not list((tmp_path / "far").iterdir())


def test_an_unknown_user_after_a_tilde_is_taken_as_written_as_a_shell_does(tmp_path, monkeypatch):
    """CL2 (poor): --out '~nosuchuser/x' raised a raw RuntimeError from Path.expanduser. It is now kept as written (a
    folder of that name under the current one), as bash leaves it."""
    from unicache_lib.paths import output_path_refusal

    monkeypatch.chdir(tmp_path)
    p, why = output_path_refusal("~nosuchuser-unicache/x", "--out", "t")
    assert p == (tmp_path / "~nosuchuser-unicache" / "x").resolve() and why == ""


@pytest.mark.parametrize("kind", ["a link", "a folder"])
def test_a_link_or_folder_at_a_result_name_in_the_own_folders_is_refused_before_measuring(tmp_path, monkeypatch,
                                                                                           capsys, kind):
    """WR1 (poor): in benchmarks/results/ and outputs/, a link or a folder at the named file was refused only after
    measuring, as a traceback. Now in one line before."""
    import argparse

    E = benchmark("evaluate")
    monkeypatch.setattr(E, "RESULTS", tmp_path)
    target = tmp_path / "r.txt"
    if kind == "a link":
        (tmp_path / "far.txt").write_text("mine")
        os.symlink(tmp_path / "far.txt", target)
    else:
        target.mkdir()
    ap = argparse.ArgumentParser(prog="batch_eviction.py")
    ap.add_argument("--out", type=Path, default=None)
    with pytest.raises(SystemExit):
        E.check_out(ap, ap.parse_args(["--out", str(target)]))
    assert "never through a link" in capsys.readouterr().err


def test_the_rehearsal_refuses_an_unknown_model_before_it_claims_its_folder(tmp_path):
    """RB1 (poor): --models bogus raised UnknownNameError after --out had been made and marked."""
    from unicache_lib import rehearsal

    with pytest.raises(SystemExit, match="unknown model or notebook 'bogus'"):
        rehearsal.main(["--out", str(tmp_path / "o"), "--models", "bogus"])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["a link to a file of yours", "a hard-linked kept copy"])
def test_a_stand_in_is_never_rebuilt_through_a_link_or_hard_link_inside_its_folder(tmp_path, capsys, kind):
    """Round 28's neighbour: a recorded stand-in's folder with a link inside (tokenizer_config.json to a user's file) or
    a weight file kept with `ln` (a `cp -al` backup): saving writes some files in place, through the link or into
    the kept copy. A model folder holding a link, hard link, FIFO or device is refused in one line before anything is
    built (paths.odd_entry, the check notebooks' folders have)."""
    from unicache_lib.zoo.builders import standins

    d = tmp_path / "models"
    spec = standins.tiny("LLaVA-1.5")
    built = standins.build("llava-1.5-7b", d, spec=spec)
    mine = tmp_path / "mine.json"
    if kind == "a link to a file of yours":
        mine.write_text("mine")
        name = next(p.name for p in built.iterdir() if p.name.startswith("tokenizer"))
        os.unlink(built / name)
        os.symlink(mine, built / name)
    else:
        os.link(built / "model.safetensors", mine)
    before = mine.read_bytes()
    with pytest.raises(InputError, match="a stand-in is saved only over files of its own"):
        standins.build("llava-1.5-7b", d, spec=spec)
    with pytest.raises(SystemExit) as e:
        standins.main(["--out", str(d), "--only", "llava-1.5-7b"])
    assert e.value.code == 2 and "llava-1.5-7b" in capsys.readouterr().err and mine.read_bytes() == before


# ---- round 29 (/work/team/adversarial_60_round29.md)

def _fake_generation_rehearsal(monkeypatch, tmp_path):
    """rehearse's own reads and writes, with the stand-in's build and the notebook runs faked; returns the runs made."""
    import json

    from unicache_lib import rehearsal
    from unicache_lib.zoo.builders import gen_standins, standins

    def build(name, out, seed=0):
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "model_card.json").write_text(json.dumps({"imitates": "X", "image_tokens": 4, "text_tokens": 2,
                                                                "blocks": "2 blocks"}))
        return standins.record_model(out, out / name)  # as the builders record what they saved

    ran = []

    def isolated(nb, params, out_nb):
        ran.append(params["DTYPE"])
        Path(params["OUT_DIR"]).mkdir(parents=True, exist_ok=True)
        (Path(params["OUT_DIR"]) / "scoreboard.json").write_text('[{"verdict": "x"}]')
        return {"wall_s": 1.0, "peak_rss_mb": 1}

    monkeypatch.setattr(gen_standins, "build", build)
    monkeypatch.setattr(rehearsal, "_isolated", isolated)
    return rehearsal, ran


def test_a_generation_rehearsal_resumes_only_runs_at_its_own_settings_and_a_finished_run_measures_anew(
        tmp_path, monkeypatch, capsys):
    """PR1 (silent): the generation rehearsal's resume file (partial.csv) was keyed on (model, notebook) only and kept
    after a finished run, so a run at --dtype bfloat16 reported the float32 run's numbers, and any later run measured
    nothing, without a word. Rows are resumed only at the same device and dtype, the resume is said, and a finished run
    removes the file (once its table is written)."""
    R, ran = _fake_generation_rehearsal(monkeypatch, tmp_path)
    out, nb = tmp_path / "o", R.GEN_NOTEBOOKS[0]
    out.mkdir()
    (out / "partial.csv").write_text("model,imitates,notebook,wall_s,peak_rss_mb,device,dtype,reuse\n"
                                     f"pixart-sigma,X,{nb},9999.0,1,cpu,float32,\n")  # an interrupted float32 run
    rows = R.rehearse(["pixart-sigma"], [nb], out, "cpu", "bfloat16", progress=False, generation=True)
    assert ran == ["bfloat16"] and rows[0]["wall_s"] == 1.0
    (out / "partial.csv").write_text("model,imitates,notebook,wall_s,peak_rss_mb,device,dtype,reuse\n"
                                     f"pixart-sigma,X,{nb},9999.0,1,cpu,float32,\n")
    rows = R.rehearse(["pixart-sigma"], [nb], out, "cpu", "float32", progress=False, generation=True)
    assert ran == ["bfloat16"] and rows[0]["wall_s"] == 9999.0 and "resuming: 1 runs" in capsys.readouterr().out
    # (a finished run measures anew: main removes the file once the table is written, the TL1 test below)


def test_the_generation_rehearsal_never_reads_its_resume_file_through_a_link(tmp_path, monkeypatch, capsys):
    """PL1 (unsafe, read): O/generation/partial.csv made a link to a user's CSV: its rows were read and reported as
    this run's measurements. The file is read with no link on the way; a link is refused in one line."""
    R, ran = _fake_generation_rehearsal(monkeypatch, tmp_path)
    out = tmp_path / "o"
    R.claim_output_folder(out, "rehearsal")  # an earlier run's folder
    (out / "generation").mkdir()
    theirs = tmp_path / "theirs.csv"
    theirs.write_text("model,notebook,wall_s,device,dtype\npixart-sigma,03_diffusion_steps,9999.0,cpu,float32\n")
    os.symlink(theirs, out / "generation" / "partial.csv")
    with pytest.raises(SystemExit) as e:
        R.main(["--out", str(out), "--no-readme", "--side", "generation", "--models", "pixart-sigma", "--notebooks",
                R.GEN_NOTEBOOKS[0]])
    assert e.value.code == 2 and "symbolic link" in capsys.readouterr().err and not ran
    assert not (out / "rehearsal_generation.csv").exists()


def test_a_pipeline_stand_in_is_never_rebuilt_through_a_linked_component_folder(tmp_path, capsys):
    """IL2 (unsafe, round 29 on 03a7bfb; refused since 15ec8e1): a recorded pipeline stand-in whose `vae` folder the
    user linked to their real pipeline's (the usual way to share a component): the rebuild saved the random VAE
    through the link. Refused in one line before anything is built."""
    from unicache_lib.zoo.builders import gen_standins

    d = tmp_path / "models"
    built = gen_standins.build("sd3-medium", d)
    theirs = tmp_path / "real-sd3" / "vae"
    shutil.copytree(built / "vae", theirs)
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    shutil.rmtree(built / "vae")
    os.symlink(theirs, built / "vae")
    with pytest.raises(SystemExit) as e:
        gen_standins.main(["--out", str(d), "--only", "sd3-medium", "--seed", "1"])
    assert e.value.code == 2 and "symbolic link" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before


def test_the_rehearsal_checks_every_model_folder_before_it_builds_the_first(tmp_path, monkeypatch, capsys):
    """RL3 (poor): a user's model folder under the rehearsal's models/ was refused only after the earlier models'
    notebooks had run, and their rows were thrown away. Every model folder is checked before the first build."""
    R, ran = _fake_generation_rehearsal(monkeypatch, tmp_path)
    out = tmp_path / "o"
    R.claim_output_folder(out, "rehearsal")
    (out / "generation" / "models" / "flux-dev").mkdir(parents=True)
    (out / "generation" / "models" / "flux-dev" / "config.json").write_text("mine")
    with pytest.raises(SystemExit) as e:
        R.main(["--out", str(out), "--no-readme", "--side", "generation", "--models", "pixart-sigma", "flux-dev",
                "--notebooks", R.GEN_NOTEBOOKS[0]])
    assert e.value.code == 2 and "flux-dev" in capsys.readouterr().err and not ran


# ---- round 30 (/work/team/adversarial_60_round30.md)

def test_the_generation_rehearsal_keeps_its_measured_rows_until_the_table_is_written(tmp_path, monkeypatch, capsys):
    """TL1 (lost, 435a00b): rehearse removed partial.csv before main wrote the table, so a failure at the end (a link or
    folder at the table's name, a full disk) lost every measured row and a run again measured everything anew. The
    file is removed only once the table is written; the failure is one line, exit status 2, and a run again resumes."""
    R, ran = _fake_generation_rehearsal(monkeypatch, tmp_path)
    out, nb = tmp_path / "o", R.GEN_NOTEBOOKS[0]
    args = ["--out", str(out), "--no-readme", "--side", "generation", "--models", "pixart-sigma", "--notebooks", nb]
    R.claim_output_folder(out, "rehearsal")  # an earlier run's folder
    (out / "rehearsal_generation.csv").mkdir()  # something odd at the table's name
    with pytest.raises(SystemExit) as e:
        R.main(args)
    assert e.value.code == 2 and "rehearsal_generation.csv" in capsys.readouterr().err and len(ran) == 1
    assert (out / "generation" / "partial.csv").is_file()  # the measured row kept
    (out / "rehearsal_generation.csv").rmdir()
    R.main(args)  # resumes: nothing measured again, the table written, the resume file gone
    assert len(ran) == 1 and "resuming: 1 runs" in capsys.readouterr().out
    assert (out / "rehearsal_generation.csv").is_file() and not (out / "generation" / "partial.csv").exists()
