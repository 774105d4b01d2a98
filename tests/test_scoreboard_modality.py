import math

import pytest
import torch

from unicache_lib.analysis.anchors import batching_overlap, top_anchors
from unicache_lib.modality import SpanError, Spans, spans_from_input_ids
from unicache_lib.scoreboard import Scoreboard, criteria_met
from unicache_lib.similarity import cosine, jaccard


def test_rules_come_before_measurements():
    b = Scoreboard()
    with pytest.raises(KeyError, match="write the verdict rule"):
        b.measure("M1", 0.1, 3)
    b.rule("M1", "holds if > 0", lambda v: "holds" if v > 0 else "does not hold")
    b.rule("M2", "holds if < 1", lambda v: "holds" if v < 1 else "does not hold")
    b.measure("M1", 0.5, 3)
    with pytest.raises(RuntimeError, match="before its measurement"):
        b.rule("M1", "changed my mind", lambda v: "holds")
    with pytest.raises(RuntimeError, match="no measurement"):
        b.table()
    b.measure("M2", float("nan"), 0)
    t = b.table()
    assert list(t.index) == ["M1", "M2"] and t.loc["M1", "verdict"] == "holds"
    assert t.loc["M2", "verdict"] == "not measurable here"
    with pytest.raises(KeyError, match="unknown claim"):
        b.rule("Z9", "", lambda v: "holds")
    bad = Scoreboard()
    bad.rule("M3", "typo", lambda v: "yes")
    bad.measure("M3", 1.0, 1)
    with pytest.raises(ValueError, match="not one of"):
        bad.table()


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


def test_criteria_met():
    assert [criteria_met(v) for v in (2, 1, 0)] == ["holds", "partly", "does not hold"]
