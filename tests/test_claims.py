"""Every claim is one entry of unicache_lib/claims.py, and what shows it elsewhere is made from that entry."""
import json
import re
from pathlib import Path

import pytest

from unicache_lib import claims
from unicache_lib.core.errors import InputError, UnknownNameError
from unicache_lib.scoreboard import CLAIMS, Scoreboard

ROOT = Path(__file__).resolve().parents[1]


def test_the_scoreboard_statements_are_the_registry():
    assert CLAIMS is claims.CLAIMS and set(CLAIMS) == set(claims.REGISTRY)
    assert all(CLAIMS[c.id] == c.statement for c in claims.REGISTRY.values())
    # every lesson rules on at least one claim and every claim on exactly one lesson
    assert sorted(c.notebook for c in claims.REGISTRY.values()) == sorted(
        nb for nb in claims.LESSONS for _ in claims.of(nb))
    assert all(claims.of(nb) for nb in claims.LESSONS)


def test_rules_name_what_they_need_and_refuse_to_go_unfilled():
    with pytest.raises(InputError, match="pass k=... to declare it"):
        claims.rules_of("01_capture")
    with pytest.raises(InputError, match="pass u3_bar=... to declare it"):
        claims.rules_of("02_understanding_maps", top_k=5)
    rules = claims.rules_of("02_understanding_maps", top_k=5, u3_bar=0.42)
    assert rules["U3"][1]["a"] == {"above": 0.42} and "top-5 anchor" in rules["U3"][0]
    with pytest.raises(UnknownNameError, match="lessons with claims"):
        claims.of("09_nothing")
    with pytest.raises(InputError, match="is none of"):
        claims.Claim("X1", "s", "w", "99_x", "r", {"": {"above": 0}})


def test_a_new_claim_is_one_entry(monkeypatch):
    """A claim added to the registry is declared, shown in its lesson's table and listed in LAYOUT's ids with no other
    edit (the test adds one the way a fork would, then takes it out)."""
    new = claims.Claim("P9", "Target: pruning never hurts.", "whether to prune at all", "04_head_pruning",
                       "accuracy drop below 0.001", {"": {"below": 0.001}})
    monkeypatch.setattr(claims, "_ALL", [*claims._ALL, new])
    monkeypatch.setitem(claims.REGISTRY, "P9", new)
    monkeypatch.setitem(claims.CLAIMS, "P9", new.statement)
    board = Scoreboard()
    board.declare(claims.rules_of("04_head_pruning"))
    assert set(board.rows) == {"P1", "P2", "P3", "P9"}
    assert "| P9 | *Workbench target:* pruning never hurts. | whether to prune at all |" in \
        claims.claims_table("04_head_pruning")
    assert claims.ids_text("04_head_pruning") == "claims P1–P3 and targets P9"


def test_ids_text_shortens_runs_only():
    assert claims._runs(["U1", "U2a", "U2b", "U3", "U4", "U5", "U6", "U8", "U9"]) == "U1, U2a, U2b, U3–U6, U8, U9"
    assert claims._runs(["A1", "A3"]) == "A1, A3"


@pytest.mark.parametrize("nb", claims.LESSONS)
def test_each_lesson_shows_its_claims_from_the_registry(nb):
    """The notebook displays claims_table for itself (its output is the table made now: the committed notebook was run
    on the current registry) and types no claims table of its own in its markdown."""
    book = json.loads((ROOT / "notebooks" / f"{nb}.ipynb").read_text())
    cells = book["cells"]
    shown = [c for c in cells if c["cell_type"] == "code" and f'claims_table("{nb}")' in "".join(c["source"])]
    assert len(shown) == 1, f"{nb}: display claims_table({nb!r}) once, beside the scoreboard"
    md = [o["data"]["text/markdown"] for o in shown[0].get("outputs", []) if "text/markdown" in o.get("data", {})]
    md = ["".join(m) if isinstance(m, list) else m for m in md]  # a stored output is a string or a list of lines
    assert md and "".join(md) == str(claims.claims_table(nb)), f"{nb}: re-execute it (make notebooks NB={nb[:2]})"
    typed = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and re.search(r"^\| id \|", "".join(c["source"]), re.M)]
    assert not typed, f"{nb}: cells {typed} type a claims table by hand"
