"""Every notebook's exercise solutions (solutions/NN_topic.py) run in quick mode on the shipped models, and the
outcome each docstring states is asserted where it is checkable."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"


def load(name: str):
    if str(SOLUTIONS) not in sys.path:
        sys.path.insert(0, str(SOLUTIONS))
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def s01():
    return load("01_capture")


@pytest.fixture(scope="module")
def s02():
    return load("02_understanding_maps")


def test_every_notebook_exercise_has_a_solution():
    import re

    for src in sorted((SOLUTIONS.parent / "notebooks" / "src").glob("0[1-9]_*.py")):
        text = src.read_text()
        n = len(re.findall(r"^# (\d+)\. ", text.split("## Exercises")[1], re.M))
        mod = load(src.stem)
        have = sorted(int(a.split("_")[1]) for a in dir(mod) if a.startswith("exercise_"))
        assert have == list(range(1, n + 1)), f"{src.stem}: exercises 1..{n}, solutions {have}"
        starters = sorted(int(k) for k in re.findall(r"^# Exercise (\d+) starter", text, re.M))
        assert starters == list(range(1, n + 1)), f"{src.stem}: exercises 1..{n}, starter cells for {starters}"
        for k in have:
            doc = getattr(mod, f"exercise_{k}").__doc__
            assert doc and "Expected" in doc, f"{src.stem} exercise {k}: the docstring states no expected outcome"


def test_01_vision_tower_is_more_focused_than_the_language_model(s01):
    r = s01.exercise_1(quick=True)
    assert len(r["_vision"]) == 2 and len(r["_language"]) == 4
    assert r["_vision"].max() < r["_language"].min()  # vision curve below the language curve at every depth
    assert 0.4 < r["_vision"].mean() < 0.7


def test_01_batch_averaging_loses_anchors_as_the_batch_grows(s01):
    by = s01.exercise_2(quick=True)["_by_size"]
    sizes = sorted(by)
    assert by[1] == 1.0 and sizes[-1] == 5
    assert by[2] < by[1] and max(by[b] for b in sizes if b >= 3) < by[2]  # falls with the batch size (k = 6, 5
    # samples: batches of 3 and 5 are one batch each, so they may swap by noise)
    assert by[5] < 0.5  # M3 holds for the whole set


def test_01_fp16_means_match_to_3_decimals_single_entries_do_not(s01):
    r = s01.exercise_3(quick=True)
    assert r["_entropy_gap"] < 5e-4  # per-layer mean entropy equal to 3 decimals
    assert max(r["_median"].values()) < 1e-3
    assert r["_worst"]["max_weight"] > 5e-4  # the largest single difference is beyond the 3rd decimal


def test_01_two_ranks_write_one_store_and_resume(s01):
    r = s01.exercise_4(quick=True)
    assert r["index files"] == ["index-rank00000.jsonl", "index-rank00001.jsonl"]
    assert r["problems"] == [] and r["samples"] == r["_n"] and r["records"] == 4 * r["_n"]
    assert r["_again"] == 0 and r["_first"] == r["records"]  # the second run resumes: nothing captured twice


def test_01_own_checkpoint_m2_is_code_m3_is_model(s01):
    t = s01.next_steps(quick=True)["_table"]
    assert (t["M2 max |difference|"] == 0).all()
    assert t.loc["random LM", "M3 mean Jaccard (k=6)"] > t.loc["trained", "M3 mean Jaccard (k=6)"] + 0.05


def test_02_anchor_conclusions_by_top_k(s02):
    r = s02.exercise_1(quick=True)
    t = r["_table"]
    for k, lib in r["_library"].items():  # the written body agrees with the library's layer_persistence
        assert abs(t.loc[k, "U3a Jaccard"] - lib) < 0.01
    assert t["U4a holds (> 1.5)"].all()  # anchors on objects at every k
    assert bool(t.loc[3, "U3a holds (> 3x chance)"]) and not bool(t.loc[12, "U3a holds (> 3x chance)"])
    assert t.loc[3, "U4a object / chance"] > t.loc[12, "U4a object / chance"]


def test_02_color_as_function_word_barely_moves_u5(s02):
    r = s02.exercise_2(quick=True)
    assert r["_n_color"] > 0
    assert r["_after"] < r["_before"]  # a high-reading word moved to the function class
    assert abs(r["_after"] - r["_before"]) / r["_before"] < 0.05 and r["_before"] < 2 and r["_after"] < 2


def test_02_colour_word_is_a_better_pointer(s02):
    r = s02.exercise_3(quick=True)
    t = r["_table"]
    assert np.allclose(t.iloc[:, 0].to_numpy(), r["_library"].to_numpy(), rtol=1e-4)  # the written body = section 6's
    assert t.iloc[:, 1].max() > 2 * t.iloc[:, 0].max()  # colour query's best layer vs the shape word's


def test_02_random_weights_look_uniform_and_ungrounded(s02):
    t = s02.next_steps(quick=True)["_table"]
    for b in ("shallow", "middle", "deep"):
        assert t.loc["random LM", f"entropy {b}"] > 0.95 > t.loc["trained", f"entropy {b}"]
    assert t.loc["random LM", "focused heads"] == 0
    assert t.loc["random LM", "anchors on objects / chance"] < 1.5 < t.loc["trained", "anchors on objects / chance"]


def test_02_a_layer_1_head_finds_the_asked_object(s02):
    r = s02.exercise_4(quick=True)
    assert r["best head (layer, head)"][0] == 1 and r["its top patch on the asked object"] >= 0.9
    assert r["best head's hit rate per layer"][0] < 0.5


@pytest.fixture(scope="module")
def s03():
    return load("03_diffusion_steps")


def test_03_written_knee_is_the_librarys(s03):
    r = s03.exercise_1(quick=True)
    assert r["_n"] >= 2 * 2 * 8 and r["_agree"] == r["_n"]  # both generators' layers, maps and outputs, both lines
    assert s03.knee([0.0, 0.2, 0.9, 0.95], 0.7) == 2 and s03.knee([0.0, 0.9, 0.5], 0.7) is None
    assert s03.reuse_start([1, 3, 2]) == 3 and s03.reuse_start([1, None]) is None


def test_03_fewer_steps_shrink_the_reuse_window(s03):
    t = s03.exercise_2(quick=True)["_table"]
    for m in ("tiny-mmdit", "tiny-pixart"):
        assert t.loc[(m, 20, 0.95), "window start"] == 1 and t.loc[(m, 20, 0.95), "reusable steps"] == 18
        assert t.loc[(m, 8, 0.95), "reusable steps"] < 8 - 2  # farther steps: the window starts later
        assert t.loc[(m, 8, 0.95), "lowest cosine"] < t.loc[(m, 20, 0.95), "lowest cosine"]
        for steps in (20, 8):  # a stricter threshold never reuses more
            assert t.loc[(m, steps, 0.99), "reusable steps"] <= t.loc[(m, steps, 0.95), "reusable steps"]
    assert t.loc[("tiny-mmdit", 8, 0.95), "reusable steps"] == 0


def test_03_own_checkpoint_calls_run_on_a_pipeline_stand_in(s03):
    r = s03.next_steps(quick=True)
    assert r["random weights"] and r["parts"] == ["joint"]
    K = r["_K"]
    assert len(K) >= 2 and (K["n_steps"] == r["_steps"]).all() and "knee (maps) @0.99" in K
    assert set(r["windows"]) == {0.7, 0.99}


def test_03_unconditional_branch_spreads_its_text_attention(s03):
    t = s03.exercise_3(quick=True)["_table"]
    for m in ("tiny-mmdit", "tiny-pixart"):
        assert t.loc[(m, "uncond"), "text_entropy"] > t.loc[(m, "cond"), "text_entropy"] + 0.05
        assert t.loc[(m, "uncond"), "text_entropy"] > 0.95
    assert t.loc[("tiny-mmdit", "uncond"), "text_share"] < t.loc[("tiny-mmdit", "cond"), "text_share"]


def test_03_repeated_shape_word_regions_do_not_separate(s03):
    t = s03.exercise_4(quick=True)["_table"]
    same, two = "same colour, same shape", "same colour, two shapes"
    assert t.loc[("tiny-pixart", same), "overlap"] > 0.9 > t.loc[("tiny-pixart", two), "overlap"]
    for m in ("tiny-mmdit", "tiny-pixart"):
        assert t.loc[(m, same), "overlap"] > 3 * t.loc[(m, same), "chance"]


def test_03_pixart_reads_end_of_text_and_not_position_words(s03):
    r = s03.exercise_5(quick=True)
    assert r["_real"] == pytest.approx(1.0, abs=1e-3)
    assert r["_by_role"].idxmax() == "end of text" and r["_by_role"]["position"] < 0.05


@pytest.fixture(scope="module")
def s04():
    return load("04_head_pruning")


def test_04_diffuse_heads_are_dispensable_deep_not_shallow(s04):
    r = s04.exercise_1(quick=True)
    t = r["_t"].set_index(["band", "heads pruned"])
    assert t.loc[("deep", 2), "drop"] <= 0.02 and t.loc[("deep", 4), "drop"] <= 0.02
    assert t.loc[("shallow", 4), "drop"] >= 0.2


def test_04_own_scorer_registered_and_behind_gradient(s04):
    r = s04.exercise_2(quick=True)
    from unicache_lib.pruning import SCORERS

    assert r["registered"] and "image_share" in SCORERS
    assert r["_mean"]["gradient"] > r["_mean"]["image_share"] + 0.05


def test_04_few_gradient_questions_suffice(s04):
    m = s04.exercise_3(quick=True)["_mean"]
    assert m["gradient n=8"] > m["random"] + 0.1 and m["gradient n=32"] > m["random"] + 0.1
    assert m["gradient n=2"] < m["gradient n=8"]


def test_04_p3_procedure_runs_on_a_grouped_query_stand_in(s04):
    r = s04.next_steps(quick=True)
    assert r["layers x heads"] == (3, 4) and r["heads pruned"] >= 1
    for m in r["_moves"].values():
        assert len(m) == r["_n"] == 5 and (m >= 0).all()
    assert "samples" in r["near-uniform minus random (deeper entropy move)"]


def test_04_random_band_needs_seeds_to_clear_a_scorer(s04):
    r = s04.exercise_4(quick=True)
    t = r["_t"].set_index("seeds")
    assert not t.loc[3, "clears"]  # three seeds separate nothing
    assert r["_first"] is not None and r["_first"] <= 10  # the notebook's RANDOM_SEEDS suffice
    assert (t["band hi"] - t["band lo"]).iloc[-1] < (t["band hi"] - t["band lo"]).loc[3] / 2  # it narrows


def test_04_06_starter_checks_accept_the_solutions_and_catch_a_wrong_mask(s04):
    import pandas as pd

    from unicache_lib.analysis.pruning_claims import band_mask_problems

    score = np.arange(12.0).reshape(3, 4)
    assert band_mask_problems(s04.prune_in_band(score, [2], 2), score, [2], 2) == []
    wrong = np.ones((3, 4))
    wrong[0, :2] = 0  # pruned outside the band
    assert any("outside" in p for p in band_mask_problems(wrong, score, [2], 2))
    s06 = load("06_step_reuse")
    static = pd.DataFrame([(0.55, 47.7)], columns=["computed", "psnr"])
    assert s06.dominated(pd.Series({"computed": 0.6, "psnr": 44.4}), static)
    assert not s06.dominated(pd.Series({"computed": 0.47, "psnr": 39.7}), static)


@pytest.fixture(scope="module")
def s07():
    return load("07_diagnostics")


def test_07_earlier_cutoff_costs_more_accuracy(s07):
    t = s07.exercise_1(quick=True)["_t"]
    acc = t.accuracy
    assert acc[1] < acc[2] <= acc[3] < acc["none"]
    assert acc[1] < 0.5 and acc["none"] > 0.9
    assert [t.loc[L, "first cut-off layer"] for L in (1, 2, 3)] == [1, 2, 3]


def test_07_shallow_coverage_does_not_beat_confidence(s07):
    r = s07.exercise_2(quick=True)
    a = r["_auroc"]
    conf = a.pop("confidence (baseline)")
    assert len(a) == 2 and all(v < conf for v in a.values())
    t = r["_table"]  # every AUROC with its stratified interval and a named direction
    assert ((t.lo <= t.auroc) & (t.auroc <= t.hi)).all() and set(t.direction) <= {"as oriented", "inverted", "none"}


def test_07_own_checkpoint_calls_run_and_refuse_an_auroc_without_right_answers(s07):
    r = s07.next_steps(quick=True)
    t = r["_t"]
    assert not t.fires.any() and (t["lowest share"] > 0.05).all()  # random attention spreads over the image: quiet
    assert (t["image dependence (KL)"] < 0.1).all()  # random weights barely use the picture
    assert r["_wrong"] == r["_n"] and r["U12"].startswith("refused") and "at least 2 of each" in r["U12"]


def test_07_shuffled_images_are_no_modality_cutoff(s07):
    t = s07.exercise_3(quick=True)["_t"]
    assert not t.loc["shuffled images", "fires"] and not t.loc["healthy", "fires"]
    assert t.loc["shuffled images", "accuracy"] < t.loc["healthy", "accuracy"] - 0.3
    assert t.loc["shuffled images", "image dependence (KL)"] > 1.0


def test_00_first_token_near_uniform_and_heads_differ_on_the_image():
    s00 = load("00_primer")
    out = s00.exercise_1(quick=True)["_out"]
    for name in ("short", "long"):
        layers = [v for k, v in out[name].items() if k.startswith("layer")]
        assert len(layers) == 4 and all(0.5 * out[name]["uniform"] < v < 2 * out[name]["uniform"] for v in layers)
    per_head = s00.exercise_2(quick=True)["_per_head"]
    assert len(per_head) == 8 and per_head.max() > 0.95 and per_head.min() < 0.5  # heads read the image very differently


@pytest.fixture(scope="module")
def s05():
    return load("05_kv_eviction")


@pytest.fixture(scope="module")
def s06():
    return load("06_step_reuse")


def test_05_anchor_policy_registered_and_behind_key_coverage(s05):
    from unicache_lib.kv import POLICIES

    S = s05.exercise_1(quick=True)["_S"]
    assert "notebook_anchors" in POLICIES
    assert S.loc["notebook_anchors", 0.1] < S.loc["key_coverage", 0.1] - 0.2
    assert S.loc["notebook_anchors", 0.25] >= S.loc["h2o", 0.25]


def test_05_absent_objects_under_eviction(s05):
    w = s05.exercise_2(quick=True)["_wrong"]
    from unicache_lib.kv import POLICIES

    assert set(w.index) >= set(POLICIES) - {"notebook_anchors"} and list(w.columns) == [0.1, 0.25]
    assert ((w >= 0) & (w <= 1)).all().all()
    assert w.loc["full"].nunique() == 1  # the full cache does not depend on the budget


def test_05_the_read_score_is_the_librarys_and_its_top_positions_cluster(s05):
    r = s05.exercise_3(quick=True)
    assert r["_same"] and len(r["_cells"]) == 6
    assert len({c // r["_side"] for c in r["_cells"]}) <= 2  # the top 10% sit in at most two rows of the grid


def test_05_own_model_calls_run_on_a_random_stand_in(s05):
    r = s05.next_steps(quick=True)
    assert r["methods"] == ["divprune", "full", "key_coverage", "random"]
    assert r["rows"] == r["_n"] * 4


def test_06_adaptive_never_beats_the_static_schedule(s06):
    r = s06.exercise_1(quick=True)
    t = r["_t"]
    reusing = t[t.computed < 1]
    assert len(reusing) >= 1 and (reusing["beats static"] == "no (dominated)").all()
    assert (t[t.method != "adaptive 0.99"]["beats static"] == "reuses nothing").all()  # 8 steps: too strict to reuse
    assert Path(r["figure"]).stat().st_size > 1000


def test_06_extrapolation_beats_plain_reuse_at_20_steps(s06):
    t = s06.exercise_2(quick=True)["_t"]
    a, b = t.loc[("tiny-mmdit", "step_skip")], t.loc[("tiny-mmdit", "step_skip (weight 0)")]
    assert a.flops == b.flops == pytest.approx(0.45)
    assert a["margin at equal FLOPs (dB)"] > b["margin at equal FLOPs (dB)"] + 1.0
    assert a.psnr > b.psnr


def test_06_own_pipeline_calls_run_on_a_random_stand_in(s06):
    r = s06.next_steps(quick=True)
    df = r["_df"]
    assert r["family"] == "sana" and {"none", "step_skip", "steps:9"} <= set(df.index)
    assert df.loc["step_skip", "flops"] == pytest.approx(0.45) == df.loc["steps:9", "flops"]  # 9 of 20 calls either way
    assert df.loc["none", "psnr"] == 100.0


def test_library_options_the_solutions_use_refuse_bad_input_with_a_working_fix(s02):
    """object_word_selectivity(question=, query=) and answer_attention(layers=): the errors and the fixes they name."""
    from unicache_lib.analysis.localisation import object_word_selectivity
    from unicache_lib.diagnostics.hallucination import answer_attention
    from unicache_lib.world import samples as sample_set
    from unicache_lib.world.questions import heldout_set

    model, processor = s02._model()
    multi = [s for s in sample_set.load(per_type=1) if len(s.objects) >= 2][:1]
    with pytest.raises(ValueError, match="query='last'"):
        object_word_selectivity(model, processor, multi, question="where is the {shape} ?", query="colour")
    with pytest.raises(ValueError, match="query must be one of"):
        object_word_selectivity(model, processor, multi, query="object")
    ok = object_word_selectivity(model, processor, multi, question="where is the {shape} ?", query="last")
    assert len(ok) == len(multi[0].objects) * 4 and np.isfinite(ok.selectivity).all()
    qas = heldout_set(2, seed=1)
    with pytest.raises(ValueError, match="pass indices of those"):
        answer_attention(model, processor, qas, progress=False, layers=[99])
    one = answer_attention(model, processor, qas, progress=False, layers=[0])
    every = answer_attention(model, processor, qas, progress=False)
    assert (one.coverage != every.coverage).any() and (one.prediction == every.prediction).all()


@pytest.fixture(scope="module")
def s08():
    return load("08_architectures")


def test_08_vilt_needs_its_text_to_read_the_image(s08):
    acc = s08.exercise_1(quick=True)["_acc"]
    assert acc["healthy"] >= 0.9 and acc["text blind to the image"] <= 0.5, acc


def test_08_mllama_question_focus_per_cross_layer(s08):
    by = s08.exercise_2(quick=True)["_by_layer"]
    assert list(by.index) == [1, 3, 5]  # the three cross-attention layers
    assert by.iou.max() > by.chance_iou.max()  # some cross layer lands on the asked object more than chance


def test_08_janus_task_switch_per_layer(s08):
    t = s08.exercise_3(quick=True)["_by_layer"]
    assert list(t.index) == [0, 1, 2, 3] and t[["describe", "answer"]].stack().between(0, 1).all()


def test_08_lower_focus_cut_off_adds_focused_heads_keeps_the_ranking(s08):
    t = s08.exercise_4(quick=True)["_focused"]
    assert (t[0.3] >= t[0.45]).all()  # a lower cut-off can only add focused heads
    assert t.loc["tiny-llava", 0.3] > t.loc["tiny-vilt", 0.3]  # and the more focused model stays ahead


def test_08_clip_image_tower_ignores_the_caption(s08):
    out = s08.exercise_5(quick=True)["_out"]
    assert out["vision maps identical"] and out["n_maps"] > 0  # torch.equal, map by map
    assert out["slot i, true captions"] > out["slot i, shuffled captions"] and out["own caption found, shuffled"] >= 0.8


def test_08_vilt_one_blind_layer_costs_between_none_and_all(s08):
    acc = s08.exercise_6(quick=True)["_acc"]
    layers = {k: v for k, v in acc.items() if k.startswith("layer")}
    assert len(layers) == 6 and acc["all"] < acc["none"] - 0.1
    assert all(acc["all"] - 0.05 <= v <= acc["none"] + 1e-9 for v in layers.values()), acc
    assert min(layers, key=layers.get) == "layer 1"  # the layer whose text injection the answer needs most
