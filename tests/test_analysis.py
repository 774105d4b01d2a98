import numpy as np
import pytest
import torch

from unicache_lib.analysis.anchors import anchor_placement, group_stability, layer_persistence, patch_kinds
from unicache_lib.analysis.localisation import selectivity
from unicache_lib.analysis.token_classes import classify_ids, token_class
from unicache_lib.scoreboard import Scoreboard


def test_layer_persistence_and_group_stability():
    reads = torch.tensor([[5.0, 4, 0, 0, 1], [5.0, 4, 0, 1, 0], [0.0, 0, 5, 4, 1]])
    J = layer_persistence(reads, 2)
    assert J[0, 1] == 1.0 and J[0, 2] == 0.0 and np.allclose(np.diag(J), 1)
    g = group_stability({"a": [0, 1], "b": [0, 1], "c": [2, 3]}, {"a": "x", "b": "x", "c": "y"})
    assert g == {"within": 1.0, "across": 0.0, "n_within": 1, "n_across": 2}


def test_patch_kinds_and_anchor_placement():
    masks = np.zeros((1, 16, 16), bool)
    masks[0, :8, :8] = True  # exactly the top-left patch of size 8
    masks[0, 8:12, 8:16] = True  # half of the bottom-right patch
    kinds = patch_kinds(masks, 8)
    assert list(kinds) == [0, 2, 2, 1]
    p = anchor_placement([0, 3], kinds)
    assert p["object"] == 0.5 and p["edge"] == 0.5 and p["background"] == 0.0
    assert p["object_chance"] == 0.25 and p["background_chance"] == 0.5


def test_selectivity_hand_cases():
    po = np.array([0, 0, 1, 1, -1, -1])
    assert selectivity([0.4, 0.4, 0.1, 0.1, 0, 0], po, 0) == pytest.approx(4.0)
    assert selectivity([0.1, 0.1, 0.1, 0.1, 0.3, 0.3], po, 1) == pytest.approx(1.0)
    assert np.isnan(selectivity([1, 1, 1, 1, 1, 1], np.array([0, 0, -1, -1, -1, -1]), 0))  # no other object
    with pytest.raises(ValueError, match="weights for"):
        selectivity([1, 2], po, 0)


def test_token_classes(tokenizer):
    assert [token_class(t) for t in ["red", "▁circle", "Ġleft", "?", "the"]] == \
        ["attribute", "object", "position", "punctuation", "function"]
    ids = tokenizer("where is the red circle ?")["input_ids"]
    assert classify_ids(tokenizer, ids) == ["special", "function", "function", "function", "attribute", "object",
                                            "punctuation"]


def test_a_layer_subset_must_cover_every_band_and_the_suggested_fix_does():
    from unicache_lib.analysis.layers import band_layers, require_bands

    assert require_bands([0, 2, 3], 4) == {"shallow": [0], "middle": [2], "deep": [3]}
    assert require_bands([0, 15, -1], 32) == {"shallow": [0], "middle": [15], "deep": [31]}
    with pytest.raises(ValueError, match=r"deep \(layers 3-3\).*LAYERS = \[0, 2, 3\]"):
        require_bands([0, 2], 4)
    for layers, n in (([0, 2], 4), ([31], 32), ([0, 1], 24)):
        with pytest.raises(ValueError) as e:
            require_bands(layers, n)
        fix = eval(str(e.value).rsplit("LAYERS = ", 1)[1])
        assert set(layers) <= set(fix) and all(require_bands(fix, n)[b] for b in band_layers(n))
    with pytest.raises(ValueError, match="outside"):
        require_bands([4], 4)
    # a model too shallow for three bands is refused with the reason, not an IndexError; the fix: 3 layers or more
    with pytest.raises(ValueError, match="has 2 layer.*at least 3 .*3 or more layers"):
        require_bands([0, 1], 2)
    assert require_bands([0, 1, 2], 3) == {"shallow": [0], "middle": [1], "deep": [2]}


def test_query_over_image_picks_one_row_on_the_image_keys():
    from unicache_lib.analysis.localisation import query_over_image
    from unicache_lib.capture.record import Record
    from unicache_lib.core.modality import Spans

    sp = Spans.joint(4, 3, image_first=True)  # positions 0-3 image, 4-6 text
    P = torch.zeros(2, 7, 7)
    P[0, 6, 1], P[0, 6, 4] = 0.5, 0.5  # head 0: query 6 reads image key 1 and text key 4
    P[1, 6, 2] = 1.0  # head 1: query 6 reads image key 2
    recs = [Record("s", li, "language", "full", {"probs": P * (li + 1) / (li + 1)}, sp) for li in (1, 0)]
    m = query_over_image(recs, "s", 6)
    assert list(m) == [0, 1]  # layer order
    np.testing.assert_allclose(m[0], [0, 0.25, 0.5, 0])  # mean over heads, image keys only
    np.testing.assert_allclose(query_over_image(recs, "s", 6, head=1)[1], [0, 0, 1, 0])
    with pytest.raises(ValueError, match="outside the 7 query rows"):
        query_over_image(recs, "s", 7)
    with pytest.raises(ValueError, match="no record of sample"):
        query_over_image(recs, "t", 6)
    stats = [Record("s", 0, "language", "stats", {"max_weight": torch.zeros(2, 7)}, sp)]
    with pytest.raises(ValueError, match="mode='full'"):
        query_over_image(stats, "s", 6)


def test_word_and_localisation_claims_are_measured_on_sample_intervals():
    import pandas as pd

    from unicache_lib.analysis.understanding_claims import measure_localisation_claims, measure_word_claims
    from unicache_lib.scoreboard import Scoreboard

    rng = np.random.default_rng(0)
    rows = [{"sample": f"s{i}", "class": c, "image_share": share + 0.02 * rng.standard_normal()}
            for i in range(8) for c, share in (("object", 0.8), ("attribute", 0.7), ("function", 0.2), ("punctuation", 0.3))]
    F = pd.DataFrame(rows)
    b = Scoreboard()
    b.rule("U5", "ratio above 2", above=2.0)
    b.rule("U6", "ratio above 1.2", above=1.2)
    measure_word_claims(b, F, F.iloc[:4], cross=False)  # the 'captions' of one sample: too few
    assert b.rows["U5"].verdict == "holds" and 2.5 < b.rows["U5"].measured[""].value < 3.5
    assert b.rows["U6"].verdict == "not measurable here" and "fewer than 2 captions" in b.rows["U6"].note
    # selectivity: the trained model prefers its object (3) where the control does not (1), in layer 1 only
    loc = pd.DataFrame([{"sample": f"s{i}", "layer": li, "selectivity": (3.0 if li == 1 else 1.0) + 0.1 * rng.random()}
                        for i in range(6) for li in (0, 1) for _ in range(2)])
    ctrl = loc.assign(selectivity=1.0)
    b.rule("U11", "(a) above 1.5, (b) ratio above 1.5", criteria={"a": {"above": 1.5}, "b": {"above": 1.5}})
    measure_localisation_claims(b, loc, ctrl)
    assert b.rows["U11"].verdict == "holds" and b.rows["U11"].shown.startswith("layer 1, 12 object questions")


def test_every_lesson_declares_its_rules_as_data_on_a_fresh_board():
    """Each lesson's claims module: its rule tables write cleanly on a board (known claim ids, valid criteria), the
    text parameters are filled, and a rule cannot be rewritten once its claim is measured."""
    import pytest

    from unicache_lib.scoreboard import Scoreboard

    from unicache_lib import lessons
    from unicache_lib.claims import LESSONS, rules_of

    fill = {"k": 6, "top_k": 5, "u3_bar": 0.3}  # the values the rules of 01 (M3) and 02 (U3) name
    for nb in LESSONS:
        board = Scoreboard()
        board.declare(rules_of(nb, **fill))
        assert set(board.rows) == set(rules_of(nb, **fill)), nb
        assert all("{" not in r.rule_text for r in board.rows.values()), f"{nb}: an unfilled text field"
    for nb, lesson in lessons.discover().items():  # the modules' tables its record names are views of the one source
        for ref, table in lesson.rule_tables().items():
            assert table == rules_of(nb), (nb, ref)
    board = Scoreboard()
    board.declare(rules_of("01_capture", k=3))
    assert "top-3 anchors" in board.rows["M3"].rule_text
    board.measure("M2", 0.0, interval=(0.0, 0.0), n=5, unit="samples")
    with pytest.raises(RuntimeError, match="before its measurement"):
        board.declare({"M2": ("again", {"": {"below": 1.0}})})


def test_criteria_lines_print_each_criterion_then_the_verdict():
    """The section read-out of 03 and 08: per criterion value, interval (in the asked format) and decision."""
    b = Scoreboard()
    b.rule("U5", "ratio above 2", above=2.0)
    b.measure("U5", 2.54321, interval=(2.1, 3.0), n=40, unit="prompts", shown="ratio 2.5")
    text = b.criteria_lines("U5")
    assert text.splitlines()[0].startswith("U5: 2.543 [2.1, 3] over 40 prompts, needs ") and text.endswith(
        "U5 verdict: holds; measured: ratio 2.5")
    short = b.criteria_lines("U5", fmt="#.3g", shown=False)
    assert "2.54 [2.10, 3.00]" in short and short.endswith("U5 verdict: holds")
    b.rule("U6", "ratio above 2", above=2.0)
    b.measure("U6", 1.9, interval=(1.5, 2.4), n=40, unit="prompts")
    assert b.criteria_lines("U6").endswith("U6 verdict: inconclusive")


def test_scoreboard_counts_each_criterion_in_its_own_unit():
    """Two criteria over different units: the count cell pairs each n with its unit, "(a) 20 timing rounds; (b) 1600
    prompts", not "(a) 20; (b) 1600 (a) timing rounds; (b) prompts"."""
    b = Scoreboard()
    b.rule("R1", "two criteria", criteria={"a": {"above": 2.0}, "b": {"above": 42.0}})
    b.measure("R1", 2.3, interval=(2.2, 2.4), n=20, unit="timing rounds", criterion="a")
    b.measure("R1", 40.4, interval=(40.1, 40.7), n=1600, unit="prompts", criterion="b")
    assert b.table().loc["R1", "n"] == "(a) 20 timing rounds; (b) 1600 prompts"
    both = "(a) 2.3 [2.2, 2.4] (n = 20 timing rounds); (b) 40.4 [40.1, 40.7] (n = 1600 prompts)"
    assert both in b.view()._repr_html_()  # the one-line view may cut R1 (its meaning is long); the HTML holds it all
    assert "(a) 2.3 [2.2, 2.4] (n = 20 timing rounds)" in repr(b.view())
    b.rule("R2", "one unit", criteria={"a": {"above": 2.0}, "b": {"above": 1.0}})
    b.measure("R2", 2.3, interval=(2.2, 2.4), n=20, unit="prompts", criterion="a")
    b.measure("R2", 2.3, interval=(2.2, 2.4), n=20, unit="prompts", criterion="b")
    assert (b.table().loc["R2", "n"], b.table().loc["R2", "unit"]) == ("20", "prompts")


def _anchor_inputs(scene_of: dict, n_image: int = 16, top_k: int = 3):
    """Synthetic inputs of measure_anchor_claims: samples with 3 layers (one per band), reads that favour a few
    positions per scene type, masks absent."""
    import pandas as pd

    rng = np.random.default_rng(1)
    ids, layers = sorted(scene_of), [0, 1, 2]
    L = pd.DataFrame([{"sample": s, "layer": li} for s in ids for li in layers])
    base = {t: rng.random(n_image) for t in set(scene_of.values())}
    img_reads = np.stack([[base[scene_of[s]] + 0.3 * rng.random(n_image) for _ in layers] for s in ids])
    anchors = {(s, li): np.argsort(-img_reads[k, li])[:top_k] for k, s in enumerate(ids) for li in layers}
    placement = pd.DataFrame([{"sample": s, "layer": li, "object": 0.5, "object_chance": 0.25} for s in ids for li in layers])
    recs = [s for s in ids for _ in layers]
    return dict(L=L, img_reads=img_reads, anchor_sets=anchors, bands={"shallow": [0], "middle": [1], "deep": [2]},
                scene_of=scene_of, placement=placement, sink=[0.3] * len(recs), anchor_mass=[0.2] * len(recs),
                record_samples=recs, top_k=top_k, cross=False, family_name="LLaVA-1.5",
                masks_note="not measurable with these samples: no masks")


def test_u3_b_says_what_it_needs_when_samples_have_no_scene_types():
    """Issue #62 item 9: your own samples (file_name and question only, no scene_type) are one untyped group: U3 (b),
    within- minus across-scene-type anchor Jaccard, has no across-type pairs. It reads "not measurable with these
    samples" naming scene_type (it used to stop the scoreboard: 'the statistic is not finite'); with two types of
    two samples each it is measured, over the typed samples only."""
    from unicache_lib.analysis.understanding_claims import measure_anchor_claims, scene_pairs_note, scene_type_note
    from unicache_lib.scoreboard import Scoreboard

    def board_for(scene_of):
        b = Scoreboard()
        b.rule("U3", "(a) above 0.1, (b) above 0", criteria={"a": {"above": 0.1}, "b": {"above": 0.0}})
        b.rule("U4", "(a) above 1.5, (b) above 0", criteria={"a": {"above": 1.5}, "b": {"above": 0.0}})
        measure_anchor_claims(b, **_anchor_inputs(scene_of))
        return b.rows["U3"]

    for scene_of, says in [({"a": "", "b": ""}, "none of the 2 samples has a scene_type"),
                           ({"a": "", "b": "", "c": ""}, "none of the 3 samples has a scene_type"),
                           ({"a": "clutter", "b": "clutter", "c": ""}, "every sample with a scene_type is 'clutter' (1 have none)"),
                           ({"a": "single", "b": "clutter"}, "one sample per scene type: no within-type pairs")]:
        row = board_for(scene_of)
        assert row.verdict == "not measurable here" and says in row.note, (scene_of, row.note)
        assert row.measured["a"].value is not None  # (a), layer persistence, needs no scene type
    assert "add a 'scene_type' (one of single, overlap, text, clutter, diagram)" in scene_type_note({"a": ""})
    row = board_for({"a": "single", "b": "single", "c": "clutter", "d": "clutter", "e": ""})
    m = row.measured["b"]
    assert m.value is not None and np.isfinite(m.value) and m.n == 4 and m.unit == "samples"  # "e" is in no pair
    assert scene_pairs_note({"a": "single", "b": "single", "c": "clutter"}) is None
    assert scene_type_note({"a": "single", "b": "clutter"}) is None
