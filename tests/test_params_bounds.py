"""Notebook parameters and budgets that used to pass the check cell and fail late, or run silently wrong (#60):
each is refused where it enters, in one line naming the parameter and the fix.

docs/FAULTS.md's "Hostile samples and parameters (#60)" table counts the cases below."""
import re
import shutil

import pytest

from unicache_lib.core.errors import InputError, ParameterError
from unicache_lib.inputs import MAX_IMAGE_TOKENS, budget_shares, check_count, check_fractions
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


# ---- second round (#60): what passed the check cell and ran silently wrong, or failed only after the model ran ----
@pytest.mark.parametrize("share", [1e-6, 5e-4, 0.5 / 576])
def test_a_share_that_rounds_to_no_token_is_refused_where_the_tokens_are_known(share):
    """budget_shares([1e-6], 576) was accepted and a uniform policy then kept 0 image tokens in every layer."""
    import torch

    from unicache_lib.kv.cache import EvictionContext
    from unicache_lib.kv.policies import POLICIES

    with pytest.raises(InputError, match=rf"budget {re.escape(repr(share))} keeps no image token of this model's 576: round\(.*\) = 0; "
                                         r"the smallest budget that keeps one is 1/576 = 0.00174, or '1t'"):
        budget_shares([share], 576)
    ctx = EvictionContext(600, torch.arange(12, 588), 2, [])
    with pytest.raises(InputError, match=r"keeps no image token of this picture's 576: .* 1/576"):
        POLICIES["random"]().select(ctx, share)
    assert budget_shares([1 / 576, 0.5], 576) == [1 / 576, 0.5] and budget_shares(["1t"], 576) == [1 / 576]
    check_params({"BUDGETS": [5e-4]})  # the check cell does not know the model's tokens yet: 05 refuses it after loading


@pytest.mark.parametrize("budgets,msg", [
    ([1e-9], r"budget 1e-09 is below 0.0001 \(1/10,000\) of the image tokens.*give a share >= 0.0001"),
    ([1e-6, 0.5], r"budget 1e-06 is below 0.0001"),
    (["200000t"], r"budget '200000t' counts more than 100,000 image tokens"),
    ([1.5], r"budget must be a fraction in \[0, 1\]"),
])
def test_budgets_no_model_could_keep_are_refused_in_the_check_cell_before_the_model_loads(budgets, msg):
    """#60, fourth round: BUDGETS=[1e-9] passed notebook 05's check cell (it judged shares against no model) and was
    refused only after the model loaded. The rule, where budgets enter (inputs.budget_shares, the check cell's
    params.budgets): a share is at least inputs.MIN_SHARE = 1/10,000 (below it no image under 10,000 tokens keeps a
    token), a count at most inputs.MAX_IMAGE_TOKENS; a count and a share are compared only once the model is known."""
    with pytest.raises(ParameterError, match=rf"BUDGETS=.*{msg}") as e:
        check_params({"BUDGETS": budgets})
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=msg):
        budget_shares(budgets, MAX_IMAGE_TOKENS, tokens_known=False)
    check_params({"BUDGETS": [1e-4, "25000t", 0.25]})  # the smallest share passes; '25000t' is no repeat of 0.25 yet


def test_check_fractions_refuses_a_repeat_with_its_own_message():
    """#60, fourth round: check_fractions([0.5, 0.5]) was accepted (kv.evaluate.run_eviction then wrote every row of
    that budget twice)."""
    with pytest.raises(InputError, match=r"^budget 0.5 is given twice: each budget is one row of the sweep.*drop one$"):
        check_fractions([0.5, 0.5])
    with pytest.raises(InputError, match=r"^fraction 0.25 is given twice"):
        check_fractions([0.25, 0.1, 0.25], "fraction", upper_inclusive=False)
    assert check_fractions([0.1, 0.5]) == [0.1, 0.5]


@pytest.mark.parametrize("name,value,msg", [
    ("FRACTIONS", [0.2, 0.2], r"fraction 0.2 is given twice: each fraction is one row of the sweep"),
    ("FRACTIONS", [0.0, 1.0], r"fraction must be a fraction in \[0, 1\) \(of the heads pruned\), got 1.0"),
    ("FRACTIONS", [], r"must hold at least one fraction$"),
    ("FEWER_STEPS", [10, 10], r"step count 10 is given twice"),
    ("MAP_PER_TYPE", 0, r"must be >= 1"),
    ("BUDGETS", "0.1,0.2", r"must be a list of shares or token counts.*-p BUDGETS \"\[0.1, 0.25\]\""),
])
def test_duplicates_and_values_the_run_refuses_late_stop_in_the_check_cell(name, value, msg):
    with pytest.raises(ParameterError, match=rf"{name}=.*{msg}") as e:
        check_params({name: value})
    assert str(e.value).count("notebook parameter") == 1  # said once, not wrapped in itself


def test_depth_tokens_the_committed_run_did_not_measure_are_refused_in_the_check_cell(tmp_path, monkeypatch):
    """DEPTH_TOKENS=65 passed the check cell and was refused only at 05 §8, after the whole run."""
    from unicache_lib.analysis import caching_claims as CC

    (tmp_path / "evaluate_depth_shares_tiny-llava-576.csv").write_text(
        "model,method,tokens,n\ntiny-llava-576,random,64,10\ntiny-llava-576,random,128,10\n")
    monkeypatch.setattr(CC, "DECISIVE", tmp_path)
    with pytest.raises(ParameterError, match=r"DEPTH_TOKENS=65: the committed depth-budget run on tiny-llava-576 "
                                             r"measured \[64, 128\] image tokens: pick one"):
        check_params({"DEPTH_TOKENS": 65, "SCALE_MODEL": "tiny-llava-576"})
    check_params({"DEPTH_TOKENS": 128, "SCALE_MODEL": "tiny-llava-576"})


def test_a_report_store_path_holding_an_equals_sign_is_a_path(tmp_path):
    """`unicache-report runs/lr=0.1/store` was split at '=' as LABEL=PATH ('no store at 0.1/store')."""
    from unicache_lib.diagnostics.report import cli_stores

    store = tmp_path / "runs" / "lr=0.1" / "store"
    store.mkdir(parents=True)
    assert cli_stores([str(store)]) == {"store": str(store)}
    assert cli_stores(["runs/lr=0.2/store"]) == {"store": "runs/lr=0.2/store"}  # not there yet: a '/' before '=' too
    assert cli_stores([f"mine={store}"]) == {"mine": str(store)}  # LABEL=PATH as before


@pytest.mark.parametrize("budgets,n_image,kept", [([0.111, "64t"], 576, 64), ([0.25, 0.2501], 576, 144),
                                                   ([0.111, 0.1105], 576, 64)])
def test_two_budgets_that_keep_the_same_token_count_are_refused_where_the_model_is_known(budgets, n_image, kept):
    """S10-S12 (#60 round IV): [0.111, '64t'] on 576 tokens became [0.111, 0.1111], both keeping round(x 576) = 64
    tokens, so the sweep measured one kept count twice (the doubling the exact-duplicate check prevents); the same
    for [0.25, 0.2501] and 0.1 next to 0.1 + 1e-17. Refused naming both budgets and the count; in the check cell
    (model not yet known) only exact repeats are."""
    with pytest.raises(InputError) as e:
        budget_shares(budgets, n_image)
    msg = str(e.value)
    assert "\n" not in msg and repr(budgets[0]) in msg and repr(budgets[1]) in msg and f"same {kept} of" in msg, msg
    assert budget_shares([0.111, 0.25], 576) == [0.111, 0.25]


def test_check_fractions_takes_one_float_apart_as_a_repeat():
    """S12: FRACTIONS=[0.1, 0.1 + 1e-17] (0.1 and 0.10000000000000002) passed as two fractions."""
    with pytest.raises(InputError, match=r"given twice"):
        check_fractions([0.1, 0.1 + 1e-17], "fraction")
    with pytest.raises(ParameterError, match=r"FRACTIONS=.*given twice"):
        check_params({"FRACTIONS": [0.1, 0.1 + 1e-17]})
    assert check_fractions([0.1, 0.1001]) == [0.1, 0.1001]
