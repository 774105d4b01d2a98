"""#60 round 15's store cases (LN1b, LN3, SN9): an index set aside under any name keeps the chunks it names, a user's
meta.json holding ``"format": 1`` is never adopted, and a store whose meta no longer records its model refuses a
resume it cannot check."""
import json
import os
import shutil

import pytest

from unicache_lib.core.errors import StoreError
from unicache_lib.store import Store, remove_store

from .test_store_faults import check_intact, rec
from .test_store_hostile import one_line

LLAVA = {"model_config": "LlavaForConditionalGeneration:8d2b00445245", "dtype": "torch.float32"}  # what a capture brings
JANUS = {"model_config": "JanusForConditionalGeneration:d70062e6f09b", "dtype": "torch.float32"}


def _two_chunks(path):
    Store(path, meta={"model": "m"}).write([rec(0, 0)])
    Store(path).write([rec(1, 0)])
    return path / "index-rank00000.jsonl"


@pytest.mark.parametrize("aside", [".bak", ".old", ".BAD", ".bad.1", "-bad", "out of the folder", "a link .bad"])
def test_an_index_set_aside_under_any_name_keeps_the_chunks_it_names(tmp_path, aside):
    """Round 15's LN1b: an index moved aside as index-rank00000.jsonl.bak (or .old, .bad.1, out of the folder, ...)
    made verify() call both chunks "an interrupted write" and repair() deleted them, the sound record's too. Now only a
    chunk above one an index names is a leftover; the others are reported as not named (an index set aside?) and
    kept."""
    path = tmp_path / "s"
    log = _two_chunks(path)
    if aside == "out of the folder":
        shutil.move(log, tmp_path / "aside.jsonl")
    elif aside == "a link .bad":
        shutil.move(log, tmp_path / "aside.jsonl")
        os.symlink(tmp_path / "aside.jsonl", path / "index-rank00000.jsonl.bad")
    else:
        log.rename(path / f"index-rank00000.jsonl{aside}")
    problems = [p for p in Store(path).verify() if "chunk0" in p]
    assert len(problems) == 2 and all("not named by any index (an index set aside?)" in p and "orphan" not in p
                                      for p in problems), problems
    assert Store(path).repair() == []
    assert sorted(p.name for p in (path / "rank00000").iterdir()) == ["chunk000000", "chunk000001"]
    if aside == ".bak":  # the message's other way: kept aside as .jsonl.bad, the chunks it names are no one's business
        (path / "index-rank00000.jsonl.bak").rename(path / "index-rank00000.jsonl.bad")
        assert Store(path).verify() == []
        (path / "index-rank00000.jsonl.bad").rename(path / "index-rank00000.jsonl.bak")
    # moving the index back, as the message says, gives both records again
    src = tmp_path / "aside.jsonl" if aside in ("out of the folder", "a link .bad") else path / f"index-rank00000.jsonl{aside}"
    if aside == "a link .bad":
        (path / "index-rank00000.jsonl.bad").unlink()
    shutil.move(src, log)
    assert check_intact(Store(path)) == {"0", "1"} and Store(path).verify() == []


def test_an_interrupted_write_after_a_named_chunk_is_still_removed(tmp_path):
    """Round 15's LN1b, the other side: a chunk above every chunk the index names (what an interrupted write leaves)
    is still an orphan that repair() removes; an unnamed one below a named one (an index set aside, then a new
    capture) is kept."""
    path = tmp_path / "s"
    log = _two_chunks(path)
    log.rename(path / "index-rank00000.jsonl.bak")  # set aside; a new capture starts a new log at chunk000002
    Store(path).write([rec(0, 0)])
    (path / "rank00000" / "chunk000003").mkdir()  # an interrupted write
    problems = Store(path).verify()
    assert [p for p in problems if "orphaned" in p] == ["orphaned chunk rank00000/chunk000003 (an interrupted write); "
                                                        "it is ignored, Store.repair() removes it"]
    assert sum("not named by any index" in p for p in problems) == 2
    Store(path).repair()
    assert sorted(p.name for p in (path / "rank00000").iterdir()) == ["chunk000000", "chunk000001", "chunk000002"]


def test_a_users_meta_holding_format_1_is_never_adopted(tmp_path):
    """Round 15's LN3: Store.write took a user's meta.json holding {"format": 1, ...} (a dataset's own version
    field) for a store's, wrote an index beside it, and remove_store then deleted the user's file. Store.write now
    uses remove_store's rule (format 1 and a library_version)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    text = json.dumps({"format": 1, "notes": "my labelling notes, 3 weeks"})
    (mine / "meta.json").write_text(text)
    with pytest.raises(StoreError, match="is not a store's") as e:
        Store(mine).write([rec(0, 0)])
    assert "write the store to a folder of its own" in one_line(e.value)
    assert [p.name for p in mine.iterdir()] == ["meta.json"] and (mine / "meta.json").read_text() == text
    with pytest.raises(StoreError, match="no store wrote"):
        remove_store(mine)
    assert (mine / "meta.json").read_text() == text
    Store(tmp_path / "own").write([rec(0, 0)])  # the advice: a folder of its own
    assert check_intact(Store(tmp_path / "own")) == {"0"}


@pytest.mark.parametrize("how", ["rewritten as the corrupt-meta advice said", "lost", "overwritten by a user"])
def test_a_store_whose_meta_no_longer_records_its_model_refuses_another_models_resume(tmp_path, how):
    """Round 15's SN9: after meta.json was rewritten as {"model": "<name>"} (the corrupt-meta advice, word for word),
    lost, or overwritten, a resume of another model was taken: a capture's model_config was never compared, and a
    lost meta.json was written afresh naming the new model over the old one's records. Now each is refused."""
    path = tmp_path / "s"
    Store(path, meta=dict(LLAVA)).write([rec(0, 0)])
    if how == "lost":
        (path / "meta.json").unlink()
    else:
        (path / "meta.json").write_text(json.dumps({"model": "tiny-llava"} if how.startswith("rewritten")
                                                   else {"notes": "mine"}))
    before = (path / "meta.json").read_bytes() if how != "lost" else None
    for meta in (JANUS, {"model": "tiny-janus"}):  # a capture's Store(p), a hand-named store
        if how.startswith("rewritten") and "model" in meta:
            continue  # a named model is compared with the name kept (tested elsewhere)
        with pytest.raises(StoreError) as e:
            Store(path, meta=dict(meta)).check_resume(mode="stats")  # what a capture asks before anything is skipped
        msg = one_line(e.value)
        assert ("meta.json is missing but the store holds records: restore it, or capture into a new folder" in msg
                if how == "lost" else "names no model" in msg and "write to a new folder" in msg), msg
        with pytest.raises(StoreError):
            Store(path, meta=dict(meta)).write([rec(1, 0)])
    assert check_intact(Store(path)) == {"0"}
    assert (path / "meta.json").read_bytes() == before if before is not None else not (path / "meta.json").exists()
    # the advice: a new folder takes the capture; remove_store starts this one again; a restored meta resumes
    Store(tmp_path / "new", meta=dict(JANUS)).write([rec(1, 0)])
    assert check_intact(Store(tmp_path / "new")) == {"1"}
    if how == "lost":
        (path / "meta.json").write_text(json.dumps({"format": 1, "library_version": "0.1.0", **LLAVA}))  # restored
        Store(path, meta=dict(LLAVA)).write([rec(1, 0)])
        assert check_intact(Store(path)) == {"0", "1"}
    else:
        assert remove_store(path) and not path.exists()
        Store(path, meta=dict(JANUS)).write([rec(1, 0)])
        assert check_intact(Store(path)) == {"1"}


def test_the_corrupt_meta_advice_no_longer_defeats_the_model_check(tmp_path):
    """Round 15's SN9 (F4): a corrupt meta.json's message said 'rewrite it as {"model": "<name>"}'; followed word for
    word, the store named no model_config and took another model's resume. The advice now is to restore the file or
    capture again into a new folder, and the rewrite it used to suggest is refused."""
    path = tmp_path / "s"
    Store(path, meta=dict(LLAVA)).write([rec(0, 0)])
    good = (path / "meta.json").read_bytes()
    (path / "meta.json").write_bytes(good[:30])
    with pytest.raises(StoreError, match="is corrupt") as e:
        Store(path).read_meta()
    msg = one_line(e.value)
    assert "rewrite" not in msg and "restore it from a copy, or capture again into a new folder" in msg, msg
    (path / "meta.json").write_text("[1]")
    with pytest.raises(StoreError, match="not an object") as e:
        Store(path).read_meta()
    assert "rewrite" not in one_line(e.value) and "restore it from a copy" in str(e.value)
    (path / "meta.json").write_bytes(good)  # restored from a copy: the same model resumes, another is refused
    Store(path, meta=dict(LLAVA)).write([rec(1, 0)])
    with pytest.raises(StoreError, match="holds model_config="):
        Store(path, meta=dict(JANUS)).write([rec(2, 0)])
    assert check_intact(Store(path)) == {"0", "1"}
