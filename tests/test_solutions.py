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

    for src in sorted((SOLUTIONS.parent / "notebooks" / "src").glob("0[1-6]_*.py")):
        text = src.read_text()
        n = len(re.findall(r"^# (\d+)\. ", text.split("## Exercises")[1], re.M))
        mod = load(src.stem)
        have = sorted(int(a.split("_")[1]) for a in dir(mod) if a.startswith("exercise_"))
        assert have == list(range(1, n + 1)), f"{src.stem}: exercises 1..{n}, solutions {have}"
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
    assert all(by[a] >= by[b] for a, b in zip(sizes, sizes[1:]))  # non-increasing with the batch size
    assert by[5] < 0.5  # M3 holds for the whole set


def test_01_fp16_means_match_to_3_decimals_single_entries_do_not(s01):
    r = s01.exercise_3(quick=True)
    assert r["_entropy_gap"] < 5e-4  # per-layer mean entropy equal to 3 decimals
    assert max(r["_median"].values()) < 1e-3
    assert r["_worst"]["max_weight"] > 5e-4  # the largest single difference is beyond the 3rd decimal


def test_01_two_ranks_write_one_store(s01):
    r = s01.exercise_4(quick=True)
    assert r["index files"] == ["index-rank00000.json", "index-rank00001.json"]
    assert r["problems"] == [] and r["samples"] == r["_n"] and r["records"] == 4 * r["_n"]


def test_02_anchor_conclusions_by_top_k(s02):
    t = s02.exercise_1(quick=True)["_table"]
    assert t["U4a holds (> 1.5)"].all()  # anchors on objects at every k
    assert bool(t.loc[3, "U3a holds (> 3x chance)"]) and not bool(t.loc[12, "U3a holds (> 3x chance)"])
    assert t.loc[3, "U4a object / chance"] > t.loc[12, "U4a object / chance"]


def test_02_color_as_function_word_barely_moves_u5(s02):
    r = s02.exercise_2(quick=True)
    assert r["_n_color"] > 0
    assert r["_after"] < r["_before"]  # a high-reading word moved to the function class
    assert abs(r["_after"] - r["_before"]) / r["_before"] < 0.05 and r["_before"] < 2 and r["_after"] < 2


def test_02_colour_word_is_a_better_pointer(s02):
    t = s02.exercise_3(quick=True)["_table"]
    assert t.iloc[:, 1].max() > 2 * t.iloc[:, 0].max()  # colour query's best layer vs the shape word's


def test_02_a_layer_1_head_finds_the_asked_object(s02):
    r = s02.exercise_4(quick=True)
    assert r["best head (layer, head)"][0] == 1 and r["its top patch on the asked object"] >= 0.9
    assert r["best head's hit rate per layer"][0] < 0.5
