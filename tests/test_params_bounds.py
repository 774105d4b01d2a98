"""Notebook parameters and budgets that used to pass the check cell and fail late, or run silently wrong (#60):
each is refused where it enters, in one line naming the parameter and the fix.

docs/FAULTS.md's "Hostile samples and parameters (#60)" table counts the cases below."""
import shutil

import pytest

from unicache_lib.core.errors import InputError, ParameterError
from unicache_lib.inputs import budget_shares, check_count
from unicache_lib.params import check_params


@pytest.mark.parametrize("budgets,msg", [
    ([0], r"budget 0 keeps no image token"),
    ([0.0], r"budget 0.0 keeps no image token"),
    (["0t"], r"budget '0t' keeps no image token: the smallest budget is '1t'"),
    (["-1t"], r"budget '-1t' has a sign"),
    (["+64t"], r"budget '\+64t' has a sign.*e\.g\. '64t'"),
    (["64 t"], r"budget '64 t' holds a space: .*e\.g\. '64t'"),
    (["64T"], r"budget '64T' ends in 'T': .*'64t'"),
    (["0.25"], r"budget '0.25': a share is a number, not a string: pass 0.25"),
    (["6.5t"], r"budget '6.5t': a token count is a whole number"),
    (["16t", 0.25], r"budgets '16t' and 0.25 are one share \(0.25 of 64 image tokens\).*write its rows twice"),
    ([0.25, 0.25], r"budget 0.25 is given twice"),
])
def test_each_bad_budget_gets_its_own_message(budgets, msg):
    with pytest.raises(InputError, match=msg) as e:
        budget_shares(budgets, 64)
    assert "must end in" not in str(e.value)


@pytest.mark.parametrize("budgets", [[0], [0.0], ["-1t"], ["64 t"], ["64t", "64t"]])
def test_the_check_cell_refuses_bad_budgets(budgets):
    with pytest.raises(ParameterError, match=r"BUDGETS="):
        check_params({"BUDGETS": budgets})


def test_the_shipped_budgets_and_their_fixes_pass():
    assert budget_shares([0.1, 0.25, 0.5, 0.75], 576) == [0.1, 0.25, 0.5, 0.75]
    assert budget_shares(["64t", "128t"], 576) == [64 / 576, 128 / 576]
    assert budget_shares(["16t", 0.5], 64) == [0.25, 0.5]


@pytest.mark.parametrize("name,value,msg", [
    ("GUIDANCE", float("inf"), r"must be a finite number > 0 and at most 100"),
    ("GUIDANCE", float("nan"), r"must be a finite number"),
    ("GUIDANCE", 1e6, r"at most 100"),
    ("MEMORY_BUDGET_GB", float("inf"), r"must be a finite number > 0 and at most 10000"),
    ("PER_TYPE", 10**6, r"must be at most 100,000"),
    ("STEPS", 10**6, r"must be at most 1,000 \(schedulers"),
    ("N_QUESTIONS", 10**9, r"must be at most 100,000"),
    ("SEED", 2**40, r"must be at most 2,147,483,647"),
    ("FEWER_STEPS", [8, 10**6], r"must be at most 1,000"),
])
def test_parameters_have_sane_upper_bounds(name, value, msg):
    with pytest.raises(ParameterError, match=rf"{name}(\[\.\.\.\])?=.*{msg}"):
        check_params({name: value})


@pytest.mark.parametrize("per_type,seed,msg", [
    (6, 2024, r"PER_TYPE=6: the shipped sample set .* has 4 samples per scene type"),
    (5000, 7, r"PER_TYPE=5000: SAMPLE_SEED=7 builds its set in memory, at most 1,000 samples per scene type"),
])
def test_per_type_beyond_the_standard_sets_is_refused_in_the_check_cell(per_type, seed, msg):
    ns = {"PER_TYPE": per_type, "SAMPLES": None, "SAMPLE_SEED": seed}
    with pytest.raises(ParameterError, match=msg):
        check_params(dict(ns))
    check_params({**ns, "PER_TYPE": 6, "SAMPLE_SEED": 7})  # the fix: another seed builds 6 per type
    check_params({**ns, "PER_TYPE": 5000, "SAMPLES": "data/samples"})  # a folder of 5000 untyped samples: its PER_TYPE


def test_check_count_has_an_upper_bound():
    assert check_count(5, "n", 1, 10) == 5
    with pytest.raises(InputError, match=r"n=11 is more than 10, the most it may be"):
        check_count(11, "n", 1, 10)


@pytest.mark.parametrize("same", ["folders", "twice"])
def test_two_generators_under_one_name_are_refused_naming_both(tmp_path, same):
    from unicache_lib.runtime.loaders import resolve

    src = resolve("tiny-mmdit", reach=False)
    if same == "folders":
        a, b = tmp_path / "a" / "generator", tmp_path / "b" / "generator"
        for d in (a, b):
            shutil.copytree(src, d)
        gens, msg = [str(a), str(b)], r"'.*a/generator' and '.*b/generator' are both named 'generator'.*another name"
    else:
        gens, msg = ["tiny-mmdit", "tiny-mmdit"], r"'tiny-mmdit' and 'tiny-mmdit' are both named .*list each model once"
    with pytest.raises(ParameterError, match=rf"GENERATORS=.*{msg}"):
        check_params({"GENERATORS": gens})
