"""Round 18 of #60's adversarial testing (/work/team/adversarial_60_round18.md): each lost or silent case it found,
as a test that fails on the code it was found in."""
from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from unicache_lib.store import Store

from .test_store_faults import rec
from .conftest import benchmark

ROOT = Path(__file__).resolve().parents[1]


def _chunks(p: Path) -> list[str]:
    return sorted(q.relative_to(p).as_posix() for q in p.glob("rank*/chunk*"))


@pytest.mark.parametrize("rank", [0, 1], ids=["same-rank", "other-rank"])
def test_a_set_aside_indexs_chunks_survive_a_recapture_of_its_samples(tmp_path, rank):
    """LN9: an index kept outside the store (an archive), its samples captured again: round 17's rule (an unnamed chunk
    whose records the live index names is a cut-off write) called the archive's chunks orphans and repair() deleted
    them, also for another rank's archive. An unnamed chunk is a leftover only when numbered above a chunk its own
    rank's index names and every record it holds is one that index names."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}, rank=rank).write([rec(0, 0)])
    os.rename(p / f"index-rank{rank:05d}.jsonl", tmp_path / "archive.jsonl")
    Store(p).write([rec(0, 0)])  # the same sample captured again, by rank 0
    before = _chunks(p)
    assert all("interrupted" not in x for x in Store(p).verify())
    Store(p).repair()
    assert _chunks(p) == before and len(before) == 2
    os.rename(tmp_path / "archive.jsonl", p / f"index-rank{rank:05d}.jsonl.bad")  # kept aside, as verify advises
    assert Store(p).verify() == []


def test_a_chunk_whose_files_hold_no_record_list_is_never_removed(tmp_path):
    """LN10: a store written before chunk files recorded their records (no __records__), its index moved out:
    repair() took the unreadable files as holding nothing and deleted every chunk. What a chunk holds is then not
    known, and it is kept."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    Store(p).write([rec(1, 0)])
    for f in p.glob("rank00000/chunk*/*.npz"):  # as an older version wrote them
        z = dict(__import__("numpy").load(f))
        z.pop("__records__")
        buf = io.BytesIO()
        __import__("numpy").savez_compressed(buf, **z)
        f.write_bytes(buf.getvalue())
        assert "__records__.npy" not in zipfile.ZipFile(f).namelist()
    os.rename(p / "index-rank00000.jsonl", tmp_path / "old.jsonl")
    Store(p).write([rec(2, 0)])
    Store(p).repair()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001", "rank00000/chunk000002"]


def test_replicate_settle_writes_the_page_it_is_given(monkeypatch, capsys, tmp_path):
    """LN11: `replicate --settle --readme mine.md` ignored --readme and rewrote docs/VERDICTS.md's settle section."""
    import unicache_lib.replicate as R

    monkeypatch.setattr(R, "settle", lambda out, quick: R.pd.read_csv(R.SETTLED_CSV))  # the committed settling run
    page = ROOT / "docs" / "VERDICTS.md"
    before = page.read_bytes()
    mine = tmp_path / "mine.md"
    mine.write_text("# my verdicts\n")
    R.main(["--settle", "--readme", str(mine), "--csv", str(tmp_path / "settled.csv"), "--out", str(tmp_path / "r")])
    assert page.read_bytes() == before
    assert R.SETTLE_BEGIN in mine.read_text() and (tmp_path / "settled.csv").is_file()


def test_text_encoders_of_a_raw_diffusers_pipeline_are_all_of_them(tmp_path):
    """SN31: text_encoders(pipe) of a raw SD3 pipeline gave only text_encoder, so a store accepted a capture whose T5
    changed. A raw pipeline now gives the same encoders as the loaded generator that wraps it."""
    from unicache_lib.capture.gen_runner import text_encoders
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.zoo.builders.tiny_pipelines import build_tiny

    build_tiny("sd3", tmp_path / "sd3")
    gen = load_generator(str(tmp_path / "sd3"))
    encs = text_encoders(gen.pipe)
    assert len(encs) == 3 and [id(m) for m in encs] == [id(m) for m in text_encoders(gen)]
    assert encs[2] is gen.pipe.text_encoder_3


def test_an_offloaded_generator_is_refused_in_one_line():
    """Round 18's poor case: a generator whose transformer accelerate offloaded (weights on the meta device) failed in
    sample() and DiffusionCapture with a raw "Tensor.item() cannot be called on meta tensors"; both now refuse it in
    one line naming the fix, as the understanding path does."""
    accelerate = pytest.importorskip("accelerate")
    import torch

    from unicache_lib.capture.diffusion import DiffusionCapture
    from unicache_lib.core.errors import InputError
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample

    gen = load_generator("tiny-mmdit")
    accelerate.cpu_offload(gen.transformer, execution_device=torch.device("cpu"))
    for call in (lambda: sample(gen, ["a red circle"], steps=1), lambda: DiffusionCapture(gen.transformer, ["p0"])):
        with pytest.raises(InputError, match="meta device .* load the model whole onto one device"):
            call()


def test_a_full_size_decisive_run_at_other_budgets_never_replaces_the_committed_results(monkeypatch, capsys, tmp_path):
    """Round 18's uncounted case: `benchmarks/evaluate.py --merge` chose the committed folder by question count alone,
    so a full-size run at other --budgets replaced the CSVs notebook 05 reads. Other budgets than the committed run's
    now write under --out and say so; the committed budgets still write the committed folder."""
    import shutil

    E = benchmark("evaluate")
    committed = tmp_path / "committed"
    committed.mkdir()
    monkeypatch.setattr(E, "RESULTS", committed)
    monkeypatch.setattr(E, "FULL", 4)
    E.run_shard(4, 0, 1, tmp_path / "rows", peers=False, budgets=(0.1, 0.25), progress=False)
    for budgets, where in (((0.1, 0.5), tmp_path / "rows" / "results"), ((0.1, 0.25), committed)):
        (committed / "evaluate_shares.csv").write_text("method,budget\n" + "".join(f"key_coverage,{b}\n" for b in budgets))
        assert E.main(["--merge", "--out", str(tmp_path / "rows")]) == 0
        said = capsys.readouterr().out
        assert ("not the committed run's 4 at its budgets" in said) == (where != committed), said
        assert (where / "evaluate_eviction.csv").is_file()
        shutil.rmtree(tmp_path / "rows" / "results", ignore_errors=True)


def test_an_older_index_moved_over_the_live_one_loses_no_chunk(tmp_path):
    """Round 16's residual (LN5's hand-made form, left open until now): an older index moved by hand over the live one
    (what verify() advises against), the same samples in both: the newer capture's chunks, numbered above the older
    index's and holding records it names below them, were "interrupted writes" and repair() deleted them. A chunk is a
    cut-off write only when its records are written again *above* it, so they are kept; the older values read back."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    os.replace(p / "index-rank00000.jsonl", tmp_path / "older.jsonl")
    Store(p).write([rec(0, 0)])  # the same sample captured again: chunk000001
    os.replace(tmp_path / "older.jsonl", p / "index-rank00000.jsonl")  # by hand, over the live index
    assert not [x for x in Store(p).verify() if "interrupted" in x]
    Store(p).repair()
    assert _chunks(p) == ["rank00000/chunk000000", "rank00000/chunk000001"]
    assert {r.sample for r in Store(p).read()} == {"0"}


@pytest.mark.parametrize("argv", [["--settle", "--csv", "X"], ["--seeds", "1", "2", "--csv", "X"],
                                  ["--quick", "--settle", "--readme", "MINE"], ["--settle", "--seeds", "3", "4"]],
                         ids=["settle-csv", "seeds-csv", "quick-settle-readme", "settle-seeds"])
def test_replicate_writes_the_committed_page_only_for_the_committed_run(monkeypatch, capsys, tmp_path, argv):
    """Round 19's poor cases: `--settle --csv X` (or the committed seeds with --csv) rewrote docs/VERDICTS.md while the
    table went to X; `--quick --settle --readme X` ignored --readme; `--settle --seeds 3 4` ignored the seeds. The page
    is written where --readme says, the committed one only when neither --csv nor --readme names another place, and
    --seeds with --settle is refused in one line."""
    import unicache_lib.replicate as R

    boards = {nb: json.loads((ROOT / "data" / "results" / f"{nb}.json").read_text()) for nb in R.NOTEBOOKS}
    monkeypatch.setattr(R, "run_seed", lambda *a, **k: boards)
    monkeypatch.setattr(R, "settle", lambda out, quick: R.pd.read_csv(R.SETTLED_CSV))
    files = [R.VERDICTS_CSV, R.SETTLED_CSV, ROOT / "docs" / "VERDICTS.md"]
    before = [f.read_bytes() for f in files]
    (tmp_path / "MINE").write_text("# mine\n")
    argv = [str(tmp_path / x) if x in ("X", "MINE") else x for x in argv] + ["--out", str(tmp_path / "r")]
    if "--seeds" in argv and "--settle" in argv:
        with pytest.raises(SystemExit):
            R.main(argv)
        assert "--seeds does not apply" in capsys.readouterr().err
    else:
        R.main(argv)
        assert "--readme" not in argv or R.SETTLE_BEGIN in (tmp_path / "MINE").read_text()
    assert [f.read_bytes() for f in files] == before
