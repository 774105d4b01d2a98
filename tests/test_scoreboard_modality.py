import math

import pytest
import torch

from unicache_lib import intervals as I
from unicache_lib.analysis.anchors import batching_overlap, top_anchors
from unicache_lib.core.modality import SpanError, Spans, spans_from_input_ids
from unicache_lib.core.similarity import cosine, jaccard
from unicache_lib.scoreboard import Scoreboard


def test_rules_come_before_measurements():
    b = Scoreboard()
    with pytest.raises(KeyError, match="write the verdict rule"):
        b.measure("M1", 0.1, (0.0, 0.2), 3, "samples")
    b.rule("M1", "holds if > 0", above=0.0)
    b.rule("M2", "holds if < 1", below=1.0)
    b.measure("M1", 0.5, (0.4, 0.6), 3, "samples")
    with pytest.raises(RuntimeError, match="before its measurement"):
        b.rule("M1", "changed my mind", above=1.0)
    with pytest.raises(RuntimeError, match="no \\(complete\\) measurement"):
        b.table()
    b.measure("M2", None, note="needs two sample sets")
    t = b.table()
    assert list(t.index) == ["M1", "M2"] and t.loc["M1", "verdict"] == "holds"
    assert t.loc["M2", "verdict"] == "not measurable here" and "two sample sets" in t.loc["M2", "note"]
    with pytest.raises(KeyError, match="unknown claim"):
        b.rule("Z9", "", above=0)
    with pytest.raises(ValueError, match="exactly one of"):
        b.rule("M3", "no threshold")
    with pytest.raises(ValueError, match="outside its interval"):
        b.rule("M3", "x", above=0.0)
        b.measure("M3", 2.0, (0.0, 1.0), 5, "samples")
    with pytest.raises(ValueError, match="interval=\\(lo, hi\\), n and unit"):
        b.measure("M3", 0.5)
    with pytest.raises(ValueError, match="say in note"):
        b.measure("M3", None)


def test_verdicts_are_decided_on_the_interval():
    b = Scoreboard()
    b.rule("U1", "share > 0.5", above=0.5)
    b.rule("U5", "ratio > 2", above=2.0)
    b.rule("U6", "ratio > 1.2", above=1.2)
    b.rule("U13", "share in [0.2, 0.5]", between=(0.2, 0.5))
    b.rule("M1", "signed bias beyond 1e-4", outside=(-1e-4, 1e-4))
    b.measure("M1", -3e-4, (-4e-4, -2e-4), 20, "samples")
    b.measure("U1", 0.52, (0.48, 0.56), 100, "questions")            # straddles: inconclusive
    b.measure("U5", 1.5, (1.2, 1.8), 20, "samples")                   # wholly below: does not hold
    b.measure("U6", I.Interval(1.5, 1.3, 1.7, 10, "samples", 0.1))   # wholly above: holds
    b.measure("U13", 0.6, (0.55, 0.65), 20, "samples")                # outside the band
    v = b.verdicts()
    assert v == {"U1": "inconclusive", "U5": "does not hold", "U6": "holds", "U13": "does not hold", "M1": "holds"}
    t = b.table()
    assert "would settle it" in t.loc["U1", "note"] and t.loc["U1", "unit"] == "questions"
    assert t.loc["U6", "interval (95%)"] == "[1.3, 1.7]" and t.loc["U6", "n"] == "10"
    assert list(t.columns) == ["statement", "measured", "value", "interval (95%)", "n", "unit", "rule", "verdict", "note"]
    b.rule("E2", "share > 0.97", above=0.97)
    b.measure("E2", 0.97001, (0.93, 1.0), 150, "questions")  # on the threshold: no n worth quoting
    assert "no practical n settles it" in b.table().loc["E2", "note"]


def test_two_criteria_partly_and_inconclusive():
    b = Scoreboard()
    b.rule("P1", "(a) drop at 10% < 1 pt, (b) extra drop at 20% > 0.5 pt", criteria={"a": {"below": 0.01}, "b": {"above": 0.005}})
    with pytest.raises(KeyError, match="criteria"):
        b.measure("P1", 0.0, (0.0, 0.0), 10, "questions")
    b.measure("P1", 0.0, (-0.002, 0.004), 1000, "questions", criterion="a")
    b.measure("P1", 0.001, (-0.003, 0.004), 1000, "questions", criterion="b")
    assert b.verdicts()["P1"] == "partly"  # (a) holds, (b) does not
    c = Scoreboard()
    c.rule("P1", "same", criteria={"a": {"below": 0.01}, "b": {"above": 0.005}})
    c.measure("P1", 0.009, (0.002, 0.016), 1000, "questions", criterion="a")
    c.measure("P1", 0.04, (0.03, 0.05), 1000, "questions", criterion="b")
    assert c.verdicts()["P1"] == "inconclusive" and c.table().loc["P1", "note"].startswith("(a) interval straddles 0.01")


def test_random_weights_and_unstable_notes(tmp_path):
    import json

    b = Scoreboard(random_weights=True, unstable={"U1"})
    b.rule("U1", "share > 0.5", above=0.5)
    b.measure("U1", 0.9, (0.8, 0.95), 5, "samples")
    t = b.table()
    assert t.loc["U1", "verdict"] == "not meaningful (random weights)" and t.loc["U1", "value"] == "0.9"
    assert "unstable across sample sets" in t.loc["U1", "note"]
    b.save(tmp_path / "s.json")
    row = json.loads((tmp_path / "s.json").read_text())[0]
    assert (row["value"], row["lo"], row["hi"], row["n"], row["unit"]) == (0.9, 0.8, 0.95, 5, "samples")
    assert row["criteria"][0]["verdict"] == "holds"  # the interval's own decision, kept for the record


def test_spans_from_ids_and_errors():
    ids = torch.tensor([[2, 9, 4, 4, 4, 7, 8]])
    sp = spans_from_input_ids(ids, 4, expected_image_tokens=3)
    assert sp.n_image == 3 and sp.image_range() == (2, 5) and list(sp.text_index) == [0, 1, 5, 6]
    assert Spans.from_json(sp.to_json()) == sp
    with pytest.raises(SpanError, match="found 3 image tokens .* expects 4"):
        spans_from_input_ids(ids, 4, expected_image_tokens=4)
    with pytest.raises(SpanError, match="per sample"):
        spans_from_input_ids(torch.cat([ids, ids]), 4)
    with pytest.raises(SpanError, match="not one contiguous block"):
        Spans.from_kinds([1, 0, 1]).image_range()
    j = Spans.joint(3, 2)
    assert j.kinds == (1, 1, 1, 0, 0)


def test_similarity_and_anchor_helpers():
    assert jaccard([1, 2, 3], [2, 3, 4]) == pytest.approx(0.5) and jaccard([], []) == 1.0
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])).item() == 0.0
    assert list(top_anchors(torch.tensor([0.1, 0.5, 0.2, 0.9]), 2)) == [3, 1]
    # identical samples: averaging changes nothing; disjoint anchors: averaging keeps little
    same = batching_overlap([torch.tensor([0.0, 1, 0, 2])] * 3, 2)
    assert same["mean_jaccard"] == 1.0
    a = torch.zeros(8)
    rows = []
    for i in range(4):
        r = a.clone()
        r[2 * i], r[2 * i + 1] = 1.0 + i * 0.01, 1.0
        rows.append(r)
    diff = batching_overlap(rows, 2)
    assert diff["mean_jaccard"] < 0.5 and not math.isnan(diff["mean_jaccard"])


def test_show_is_one_line_per_claim_with_the_details_folded(monkeypatch):
    """issue #62: ``board.show()`` is short: one plain-text line per claim (id, verdict, value [interval], n), the
    statement, the rule, each criterion's decision and the notes folded into a ``<details>`` in the HTML, whole there
    (a 200-character rule, a long measurement) and escaped with the project's helper (quotes included); the plain
    text holds none of them and no line wider than 110 characters, nothing cut ("..." or an ellipsis)."""
    import unicache_lib.scoreboard as S

    words = ("share of the text's image reads on the top ten percent of image positions, mean over layers and heads, "
             "decided on the bootstrap interval over samples; chance is one tenth; holds above one half, else it does not")
    long_rule = words[:200].rstrip()
    long_rule += "x" * (200 - len(long_rule))
    assert len(long_rule) == 200
    b = Scoreboard()
    b.rule("U1", long_rule, above=0.5)
    b.measure("U1", 0.52, (0.48, 0.56), 100, "questions", shown="measured <b>" * 15)
    b.rule("A3", "four criteria", criteria={k: {"above": 0.0} for k in "abcd"})
    for k in "abcd":
        b.measure("A3", 1.23456, (-0.0123456, 2.34567), 100, "captions", criterion=k)
    b.rule("U3", "a rule", above=0.5)
    b.measure("U3", None, note="not measurable here: no grid")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    b.show()
    assert len(shown) == 1
    text, html = repr(shown[0]), shown[0]._repr_html_()
    lines = text.splitlines()
    assert lines[0] == "U1 · inconclusive        · 0.52 [0.48, 0.56] · n = 100 questions"
    # four criteria that do not fit one line continue on an indented one, broken between criteria
    assert lines[1].startswith("A3 · inconclusive        · (a) 1.235 [-0.01235, 2.346]; (b) 1.235")
    assert lines[2].startswith(" " * 27 + "(") and lines[2].endswith("· n = 100 captions")
    assert lines[3] == "U3 · not measurable here" and len(lines) == 5 and "criteria_lines" in lines[4]
    assert max(len(line) for line in lines) <= 110 and "..." not in text and "\u2026" not in text
    assert long_rule not in text and S.CLAIMS["U1"] not in text and "measured" not in text and "settle" not in text
    # the HTML: one row per claim, everything else folded into <details>, whole and escaped
    assert html.count("<tr>") == 1 + 3 and html.count("<details>") == 3
    assert long_rule.replace("'", "&#x27;") in html and S.CLAIMS["U1"] in html and "would settle it" in html
    assert "measured &lt;b&gt;" * 15 in html and "<b>measured" not in html.replace("<b>measured</b>", "")
    assert "(a) &gt; 0: inconclusive" in html and "not measurable here: no grid" in html


def test_scoreboard_text_never_cuts_a_value():
    """A claim whose criteria are counted in different units names each count beside its criterion; a random-weight
    board pads every verdict alike; no value is cut however many criteria a claim has."""
    b = Scoreboard(random_weights=True)
    b.rule("R1", "two criteria", criteria={"a": {"above": 2.0}, "b": {"above": 42.0}})
    b.measure("R1", 2.3, interval=(2.2, 2.4), n=20, unit="timing rounds", criterion="a")
    b.measure("R1", 40.4, interval=(40.1, 40.7), n=1600, unit="prompts", criterion="b")
    text = repr(b.view())
    assert text.startswith("R1 · not meaningful (random weights) · (a) 2.3 [2.2, 2.4] (n = 20 timing rounds);")
    flat = " ".join(text.split())
    assert "(a) 2.3 [2.2, 2.4] (n = 20 timing rounds); (b) 40.4 [40.1, 40.7] (n = 1600 prompts)" in flat
    # a criterion too long for a line of its own is broken between words, never cut
    unit = "caption thirds (53 positive, 487 negative, resampled apart) " * 2
    b.rule("A6", "long unit", criteria={"a": {"below": 0.0}, "b": {"above": 0.6}})
    b.measure("A6", 0.26, interval=(0.18, 0.33), n=100, unit="captions", criterion="a")
    b.measure("A6", 0.58, interval=(0.50, 0.67), n=540, unit=unit.strip(), criterion="b")
    text = repr(b.view())
    assert max(len(line) for line in text.splitlines()) <= 110 and " ".join(unit.split()) in " ".join(text.split())


def test_wrapped_table_shows_every_cell_whole():
    import re

    import pandas as pd

    from unicache_lib.tables import WrappedTable

    advice = "keep the first positions of the cache whatever the budget, " * 4  # 240 characters
    t = WrappedTable(pd.DataFrame({"measurement": ["sink share"], "value here": ["0.33"], "what to do": [advice]}))
    text, html = repr(t), t._repr_html_()
    lines = text.splitlines()
    assert lines[:2] == ["sink share", "  value here: 0.33"] and lines[2].startswith("  what to do: keep the first")
    assert all(line.startswith("    ") for line in lines[3:]) and len(lines) == 5  # continuation lines indented
    assert re.sub(r"\s+", " ", advice).strip() in re.sub(r"\s+", " ", text)  # wrapping only adds line breaks
    assert max(len(line) for line in lines) <= 110 and advice in html and "pre-wrap" in html
    with pytest.raises(ValueError, match="at least one column"):
        WrappedTable(pd.DataFrame())
