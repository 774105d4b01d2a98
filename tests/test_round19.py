"""Round 19 of #60's adversarial testing (/work/team/adversarial_60_round19.md): each lost or silent case it found,
as a test that fails on the code it was found in."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from unicache_lib.store import Store

from .test_store_faults import rec
from .conftest import benchmark

ROOT = Path(__file__).resolve().parents[1]


def _chunks(p: Path) -> list[str]:
    return sorted(q.relative_to(p).as_posix() for q in p.glob("rank*/chunk*"))


def test_two_indexes_out_then_the_older_back_as_advised_keeps_the_newer_chunks(tmp_path):
    """LN12: index A moved out, its samples captured again under B, B moved out too, then A moved back as verify
    advises ("move its index back as index-rank00000.jsonl"): B's complete chunks hold records A names (below them),
    and repair() deleted them as interrupted writes. A chunk is a cut-off write only when its records are written again
    above it: B's are kept, and moving B back beside A (as .jsonl.bad) reads nothing twice."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    os.replace(p / "index-rank00000.jsonl", tmp_path / "A.jsonl")
    Store(p).write([rec(0, 0)])
    os.replace(p / "index-rank00000.jsonl", tmp_path / "B.jsonl")
    assert any("move its index back as index-rank00000.jsonl" in x for x in Store(p).verify())
    os.replace(tmp_path / "A.jsonl", p / "index-rank00000.jsonl")  # the advice
    assert not [x for x in Store(p).verify() if "interrupted" in x]
    Store(p).repair()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001"]
    os.replace(tmp_path / "B.jsonl", p / "index-rank00000.jsonl.bad")
    assert Store(p).verify() == []


@pytest.mark.parametrize("extra", ["notes.txt", "L0000_language.npz.damaged"])
def test_a_leftover_chunk_holding_another_file_is_reported(tmp_path, extra):
    """SN32: a cut-off write's leftover (its records written again above it) that also held a user's file, or
    repair's *.damaged, was neither removed nor reported: verify() returned []. It is kept, and verify names it."""
    import unicache_lib.store as store_mod

    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    st.write([rec(0, 0)])

    def power_cut(path, data):
        raise KeyboardInterrupt("power cut")

    real = store_mod._append_line
    store_mod._append_line = power_cut
    try:
        with pytest.raises(KeyboardInterrupt):
            st.write([rec(1, 0)])
    finally:
        store_mod._append_line = real
    st.write([rec(1, 0)])  # captured again: chunk000002
    (p / "rank00000" / "chunk000001" / extra).write_bytes(b"mine")
    problems = Store(p).verify()
    assert len(problems) == 1 and problems[0].startswith("chunk rank00000/chunk000001 is not named by any index")
    Store(p).repair()
    assert (p / "rank00000" / "chunk000001" / extra).read_bytes() == b"mine"


def test_a_first_write_cut_off_then_captured_again_is_removed(tmp_path):
    """Round 19's poor case 1: a store's first write cut off before its index line, then captured again, was kept for
    ever (it could not be told from a set-aside index's chunk; verify said repair() would remove it, which it never
    did). A committed chunk now carries a marker written after its index line, so a chunk without one is a cut-off
    write: once its records are captured again, repair() removes it and verify() is empty."""
    import unicache_lib.store as store_mod

    p = tmp_path / "s"
    st = Store(p, meta={"model": "m"})
    real = store_mod._append_line
    store_mod._append_line = lambda path, data: (_ for _ in ()).throw(KeyboardInterrupt("power cut"))
    try:
        with pytest.raises(KeyboardInterrupt):
            st.write([rec(0, 0)])
    finally:
        store_mod._append_line = real
    assert [x for x in Store(p).verify() if "chunk000000 holds a write cut off before its index line" in x]
    st.write([rec(0, 0)])
    st.repair()
    assert Store(p).verify() == [] and _chunks(p) == ["rank00000/chunk000001"]


@pytest.mark.parametrize("n", [5, 8], ids=["larger", "much-larger"])
def test_a_decisive_run_of_another_size_never_replaces_the_committed_results(monkeypatch, capsys, tmp_path, n):
    """LN13: evaluate.py --merge of a run larger than the committed one (at its budgets) replaced the committed CSVs:
    the check was n >= FULL. Only the committed size writes there; another says so and writes under --out."""
    E = benchmark("evaluate")
    committed = tmp_path / "committed"
    committed.mkdir()
    monkeypatch.setattr(E, "RESULTS", committed)
    monkeypatch.setattr(E, "FULL", 4)
    E.run_shard(n, 0, 1, tmp_path / "rows", peers=False, budgets=(0.1, 0.25), progress=False)
    assert E.main(["--merge", "--out", str(tmp_path / "rows")]) == 0
    assert f"{n} questions at budgets" in capsys.readouterr().out
    assert not list(committed.iterdir()) and (tmp_path / "rows" / "results" / "evaluate_eviction.csv").is_file()


def test_a_reuse_merge_without_its_timing_run_never_replaces_the_committed_results(monkeypatch, capsys, tmp_path):
    """LN14: evaluate_reuse.py --merge at the committed size without a --timing run replaced evaluate_reuse*.csv,
    its wall-clock rows unmeasured (0 rounds). Without the timing it writes under --out and says so."""
    import pandas as pd

    E = benchmark("evaluate_reuse")

    class Stop(Exception):
        pass

    R = pd.DataFrame({"generator": ["tiny-mmdit"]})
    R.attrs.update(n=E.FULL, world=1, seconds=1.0)
    monkeypatch.setattr(E, "merge", lambda out: R)
    monkeypatch.setattr(E, "read_timing", lambda out, gens: None)
    monkeypatch.setattr(E, "decide", lambda *a: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        E.main(["--merge", "--out", str(tmp_path / "rows")])
    assert f"{E.FULL} prompts, 0 timing rounds: not the committed run's" in capsys.readouterr().out
    monkeypatch.setattr(E, "read_timing", lambda out, gens: {"repeats": 1, "timing": {}})  # round 20's LN15: too few
    with pytest.raises(Stop):
        E.main(["--merge", "--out", str(tmp_path / "rows")])
    assert f"{E.FULL} prompts, 1 timing rounds: not the committed run's" in capsys.readouterr().out


def test_a_store_dtype_written_without_its_prefix_is_read_as_that_dtype(samples, tmp_path):
    """Round 18/19's poor case: a meta dtype of "bfloat16" (no "torch." prefix, a hand-edited meta) with a bf16 model
    was refused with advice to load the model in the dtype it already had. It is read as torch.bfloat16."""
    import json

    import torch

    from unicache_lib.capture.runner import capture_samples, stats_store_or_capture
    from unicache_lib.runtime.loaders import load_understanding

    half = load_understanding("tiny-llava", attn_implementation="eager", dtype=torch.bfloat16)
    p = tmp_path / "s"
    capture_samples(*half, samples[:1], Store(p), layers=[0], progress=False)
    meta = json.loads((p / "meta.json").read_text())
    (p / "meta.json").write_text(json.dumps({**meta, "dtype": "bfloat16"}))
    assert stats_store_or_capture(p, tmp_path / "fb", "tiny-llava", model=half[0], processor=half[1]) == (p, False)


def test_a_restored_copy_of_an_older_index_never_costs_the_newer_indexs_chunks(tmp_path):
    """Round 20's LN16: an index copied aside, more captured, the live index moved out, the older copy put back, then
    the newer one's sample captured again: the newer chunk's records were "written again above it", so repair()
    deleted it as an interrupted write. A chunk records the index file it was written for (its inode); a restored copy
    is another file, so the newer chunk is kept, and the newer index moved back beside it reads it."""
    import shutil

    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    shutil.copy(p / "index-rank00000.jsonl", tmp_path / "backup.jsonl")
    Store(p).write([rec(1, 0)])  # chunk000001, the newer index's
    os.replace(p / "index-rank00000.jsonl", tmp_path / "newer.jsonl")
    shutil.copy(tmp_path / "backup.jsonl", p / "index-rank00000.jsonl")  # nothing live is overwritten
    Store(p).write([rec(1, 0)])  # sample 1 captured again: chunk000002
    assert not [x for x in Store(p).verify() if "interrupted" in x]
    Store(p).repair()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001", "rank00000/chunk000002"]
    os.replace(p / "index-rank00000.jsonl", tmp_path / "restored.jsonl")
    os.replace(tmp_path / "newer.jsonl", p / "index-rank00000.jsonl")
    assert {r.sample for r in Store(p).read()} == {"0", "1"}


@pytest.mark.parametrize("name", ["verdicts.csv", "README-section.md", "settled.csv", "settle-section.md"])
def test_replicate_never_replaces_a_users_file_in_its_out_folder(monkeypatch, capsys, tmp_path, name):
    """Round 20's LN17: `replicate --out DIR` overwrote the user's own verdicts.csv / README-section.md / settled.csv /
    settle-section.md there. A file of those names it did not write is refused before any run; its own are replaced."""
    import json

    import unicache_lib.replicate as R

    boards = {nb: json.loads((ROOT / "data" / "results" / f"{nb}.json").read_text()) for nb in R.NOTEBOOKS}
    monkeypatch.setattr(R, "run_seed", lambda *a, **k: boards)
    monkeypatch.setattr(R, "settle", lambda out, quick: R.pd.read_csv(R.SETTLED_CSV))
    out = tmp_path / "r"
    out.mkdir()
    (out / name).write_text("mine")
    argv = ["--quick", "--out", str(out)] + (["--settle"] if name.startswith("settle") else [])
    with pytest.raises(SystemExit):
        R.main(argv)
    assert name in capsys.readouterr().err and (out / name).read_text() == "mine"
    (out / name).unlink()
    R.main(argv)
    R.main(argv)  # its own file, written by the run before: replaced
    assert (out / name).read_text() != "mine"


@pytest.mark.parametrize("argv, says", [(["--readme", "missing.md"], "is not a file"), (["--csv", "."], "is a folder"),
                                        (["--seeds", "3", "3"], "names a seed twice")])
def test_replicate_refuses_a_bad_page_table_or_seed_before_any_run(monkeypatch, capsys, tmp_path, argv, says):
    """Round 20's poor cases: a --readme that does not exist or a --csv naming a folder crashed after every notebook
    run (hours); --seeds 3 3 ran seed 3 twice. Each is refused in one line first."""
    import unicache_lib.replicate as R

    monkeypatch.setattr(R, "run_seed", lambda *a, **k: pytest.fail("ran before refusing"))
    with pytest.raises(SystemExit):
        R.main(argv + ["--out", str(tmp_path / "r")])
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("how", ["cp over the live one", "rm, then cp"])
def test_a_committed_chunk_is_never_a_leftover_whatever_index_is_put_back(tmp_path, how):
    """Round 21's LN18: the older index put back with cp over the live one (its inode kept) or after rm (an inode
    reused), then the newer one's sample captured again: round 20's check (the index file's inode) took the newer
    chunk for a cut-off write and repair() deleted it. A chunk whose index line was written carries a 'committed'
    marker, and a committed chunk is never a leftover."""
    import shutil

    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    shutil.copy(p / "index-rank00000.jsonl", tmp_path / "older.jsonl")
    Store(p).write([rec(1, 0)])  # chunk000001, committed
    shutil.copy(p / "index-rank00000.jsonl", tmp_path / "newer.jsonl")
    if how.startswith("rm"):
        os.unlink(p / "index-rank00000.jsonl")
    shutil.copyfile(tmp_path / "older.jsonl", p / "index-rank00000.jsonl")
    Store(p).write([rec(1, 0)])  # captured again: chunk000002
    Store(p).repair()
    assert (p / "rank00000" / "chunk000001" / "committed").exists()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001", "rank00000/chunk000002"]


def test_replicate_never_writes_into_a_folder_of_a_users_nor_over_a_file_saved_during_its_run(monkeypatch, capsys,
                                                                                               tmp_path):
    """Round 21's LN19: `replicate --out DIR` wrote its notebooks over the user's files under DIR/shipped/ and
    DIR/seed-N/; LN20: a verdicts.csv the user saved into --out during the hours-long run was overwritten. --out must
    be new, empty or an earlier replicate run's (its marker), and each table or section is checked again as written."""
    import json

    from unicache_lib.core.errors import InputError
    import unicache_lib.replicate as R

    out = tmp_path / "r"
    (out / "shipped").mkdir(parents=True)
    (out / "shipped" / "02_understanding_maps.ipynb").write_text("my notebook")
    monkeypatch.setattr(R, "run_seed", lambda *a, **k: pytest.fail("ran before refusing"))
    with pytest.raises(SystemExit):
        R.main(["--quick", "--out", str(out)])
    assert "holds files replicate did not write" in capsys.readouterr().err
    assert (out / "shipped" / "02_understanding_maps.ipynb").read_text() == "my notebook"
    boards = {nb: json.loads((ROOT / "data" / "results" / f"{nb}.json").read_text()) for nb in R.NOTEBOOKS}

    def run_seed(*a, **k):  # the user saves a table of their own into --out while the notebooks run
        (tmp_path / "new" / "verdicts.csv").write_text("mine")
        return boards

    monkeypatch.setattr(R, "run_seed", run_seed)
    with pytest.raises(InputError, match="verdicts.csv"):
        R.main(["--quick", "--out", str(tmp_path / "new")])
    assert (tmp_path / "new" / "verdicts.csv").read_text() == "mine"
