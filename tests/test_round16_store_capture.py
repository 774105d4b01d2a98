"""Round 16 of #60: the store and capture cases (LN5, SN20, SN24, SN26, SN22, SN21)."""
import os

import pytest

from unicache_lib.store import Store

from .test_store_faults import rec


def test_a_set_aside_index_is_never_advised_over_a_live_one(tmp_path):
    """Round 16's LN5: with an index set aside and a newer capture's index live, verify() advised "move its index back
    as index-rank00000.jsonl" (which overwrites the newer index), and once the newer index was itself set aside,
    repair() deleted its chunks as interrupted writes. Now the advice names the free .jsonl.bad and never a move over
    the live index, and repair() keeps the chunks any set-aside index names."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    Store(p).write([rec(1, 0)])
    os.rename(p / "index-rank00000.jsonl", p / "index-rank00000.jsonl.bak")
    Store(p).write([rec(2, 0)])
    Store(p).write([rec(3, 0)])  # a newer capture: its own index, chunks 2 and 3
    advice = [x for x in Store(p).verify() if "not named by any index" in x]
    assert len(advice) == 2 and all("move its index back" not in x and "never move" in x and ".jsonl.bad" in x
                                    for x in advice), advice
    os.rename(p / "index-rank00000.jsonl", p / "index-rank00000.jsonl.new")  # the newer index set aside in turn
    os.rename(p / "index-rank00000.jsonl.bak", p / "index-rank00000.jsonl")  # and the older one back
    advice = [x for x in Store(p).verify() if "not named by any index" in x]
    assert [x.split()[1] for x in advice] == ["rank00000/chunk000002", "rank00000/chunk000003"], advice
    assert all("never move another over it" in x for x in advice) and not any("orphan" in x for x in advice)
    Store(p).repair()
    assert sorted(q.name for q in (p / "rank00000").iterdir()) == [f"chunk{i:06d}" for i in range(4)]
    assert {r.sample for r in Store(p).read()} == {"0", "1"}
