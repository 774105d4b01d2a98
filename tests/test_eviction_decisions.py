"""05's decision table (caching_claims.eviction_decisions): who is ahead is read on the paired intervals the lesson
prints, and what the decisive run found is generated from its committed files, budget by budget."""
import numpy as np
import pandas as pd

from unicache_lib.analysis import caching_claims as CC

BUDGETS = [0.1, 0.5]


def _rows(correct: dict, n: int = 200, seed: int = 0) -> pd.DataFrame:
    """Per-question rows: ``correct[(method, budget)]`` = the share answered right (each question drawn once)."""
    rng = np.random.default_rng(seed)
    out = [{"method": "full", "budget": 1.0, "question": q, "correct": 1, "kind": "reference"} for q in range(n)]
    for (m, b), p in correct.items():
        hits = rng.permutation(np.arange(n) < round(p * n))
        out += [{"method": m, "budget": b, "question": q, "correct": int(h), "kind": "policy"} for q, h in enumerate(hits)]
    return pd.DataFrame(out)


def _acc(R: pd.DataFrame) -> pd.DataFrame:
    acc = R[R.method != "full"].groupby(["method", "budget"]).correct.mean().unstack("budget")
    acc.loc["full"] = 1.0
    return acc


def _results(tmp_path, merge="ahead", divprune=("ahead", "tie"), prefill=("tie", "behind"), controls="ahead"):
    d = tmp_path / "res"
    d.mkdir()
    pd.DataFrame([{"budget": b, "method": "key_coverage", "kind": "minus", "verdict": merge, "model": "tiny-llava"}
                  for b in (0.1, 0.25)]).to_csv(d / "merge_eviction.csv", index=False)
    pd.DataFrame([{"budget": b, "peer": p, "verdict": v, "model": "tiny-llava", "n": 9}
                  for b, v in zip((0.1, 0.5), divprune) for p in ("divprune",)]
                 + [{"budget": b, "peer": "downsample", "verdict": controls, "model": "tiny-llava", "n": 9}
                    for b in (0.1, 0.5)]).to_csv(d / "evaluate_controls.csv", index=False)
    pd.DataFrame([{"budget": b, "method": "key_coverage", "kind": "minus", "verdict": v}
                  for b, v in zip((0.1, 0.25), prefill)]).to_csv(d / "prefill_cover.csv", index=False)
    return d


def test_cover_finding_says_each_comparison_budget_by_budget(tmp_path):
    said = CC.cover_finding(_results(tmp_path))
    assert "key_coverage_merge ahead of key_coverage at 10%, 25%" in said
    assert "key_coverage ahead of DivPrune at 10% (a tie at 50%)" in said
    # prefill_cover.csv holds the prefill cover minus ours: its "behind" is ours ahead
    assert "key_coverage ahead of key_coverage_prefill at 25% (a tie at 10%)" in said
    assert CC.cover_finding(tmp_path / "none") == ""


def test_cover_finding_ignores_another_models_file_and_says_a_tie(tmp_path):
    d = _results(tmp_path, merge="tie", divprune=("tie", "tie"))
    m = pd.read_csv(d / "merge_eviction.csv").assign(model="tiny-llava-576")
    m.to_csv(d / "merge_eviction.csv", index=False)
    said = CC.cover_finding(d)
    assert "key_coverage_merge" not in said and "key_coverage and DivPrune tie at 10%, 50%" in said


def test_row_one_reads_the_paired_interval_not_a_count(tmp_path):
    # 200 questions: 0.95 against 0.93 is 4 questions apart (the old count called it a lead), its interval spans 0
    close = _rows({("key_coverage", b): 0.95 for b in BUDGETS} | {("divprune", b): 0.93 for b in BUDGETS})
    table = CC.eviction_decisions(_acc(close), BUDGETS, 200, None, 0.7, rows=close, results=tmp_path / "none").df
    assert table.iloc[0]["what it suggests on your model"].startswith("a tie at every budget (intervals across 0)")
    apart = _rows({("key_coverage", b): 0.95 for b in BUDGETS} | {("divprune", b): 0.6 for b in BUDGETS})
    table = CC.eviction_decisions(_acc(apart), BUDGETS, 200, None, 0.7, rows=apart, results=_results(tmp_path)).df
    act = table.iloc[0]["what it suggests on your model"]
    assert act.startswith("pick key_coverage at every budget. The decisive run: key_coverage_merge ahead"), act


def test_a_control_tied_here_is_read_against_the_decisive_run(tmp_path):
    R = _rows({("key_coverage", b): 0.9 for b in BUDGETS} | {("divprune", b): 0.8 for b in BUDGETS}
              | {("downsample", 0.1): 0.3, ("downsample", 0.5): 0.89})
    for controls, keep in (("ahead", True), ("tie", False)):
        res = tmp_path / controls
        res.mkdir()
        table = CC.eviction_decisions(_acc(R), BUDGETS, 200, None, 0.7, rows=R,
                                      results=_results(res, controls=controls)).df
        advice = table.iloc[1]["what it suggests on your model"]
        assert "here downsample ties at 50%" in advice
        assert ("the decisive run puts key_coverage ahead there: keep it" in advice) is keep, advice


def test_the_simulation_rho_has_an_interval_over_questions():
    """05 §4 decides "the simulation ranks policies usefully" on rho's interval against a bar fixed first
    (CC.SCREEN_BAR), not on the point value; each resample recomputes every cell from the same questions."""
    from scipy.stats import spearmanr

    shares = {(f"m{i}", b): 0.3 + 0.1 * i + 0.2 * b for i in range(5) for b in BUDGETS}
    R = _rows(shares)
    R["retained"] = R.correct * 0.5 + R.budget * 0.1  # tracks the answers: a useful screen
    cells = R[(R.kind == "policy")].groupby(["method", "budget"])[["retained", "correct"]].mean()
    iv = CC.simulation_rho(R)
    assert iv.value == spearmanr(cells.retained, cells.correct).statistic and iv.n == 200
    assert CC.SCREEN_BAR < iv.lo <= iv.value <= iv.hi
    R["retained"] = np.random.default_rng(1).random(len(R))  # unrelated to the answers: no useful screen
    assert CC.simulation_rho(R).lo < CC.SCREEN_BAR
