"""The benchmarks run (tiny sizes): `make benchmark` must not rot unnoticed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from .conftest import benchmark

ROOT = Path(__file__).resolve().parents[1]


TINY = ["--layers", "2", "--heads", "2", "--n-image", "16", "--n-text", "8", "--repeats", "2", "--threads", "1",
        "--real-layers", "1", "--sd3-image", "16", "--sd3-text", "4"]


def _child(*args):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capture_overhead.py"), *args, *TINY],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("regime", ["narrow", "sd3"])
def test_capture_overhead_times_every_configuration_interleaved(regime):
    row = _child("--time", regime)
    configs = {"narrow": ["eager", "output_attentions", "stats", "sdpa", "recompute"],
               "sd3": ["plain", "stats", "map only", "recompute", "recompute+adjacent", "sampled/7", "sampled/7+adjacent",
                       "sampled/13", "sampled/13+adjacent"]}[regime]
    assert list(row["times"]) == configs
    assert all(len(t) == 2 and min(t) > 0 for t in row["times"].values())
    assert all((row["kept_mb"][c] > 0) == (c not in ("eager", "sdpa", "plain", "map only")) for c in configs)


def test_capture_overhead_sd3_memory_child_runs_the_streamed_capture():
    row = _child("--memory", "sd3", "recompute+adjacent")  # steps 0 and 1 after the plain forward's baseline
    assert row["config"] == "recompute+adjacent" and row["kept_mb"] > 0 and row["base_mb"] > 0


@pytest.mark.parametrize("config", ["stats", "output_attentions"])
def test_capture_overhead_memory_child_runs(config):
    row = _child("--memory", "narrow", config)
    assert row["config"] == config and row["kept_mb"] > 0 and row["extra_peak_mb"] >= 0


def test_caching_benchmark_eviction_runs_at_a_tiny_shape(capsys):
    caching = benchmark("caching")
    caching.eviction(layers=2, heads=2, head_dim=4, n_image=16, n_text=4, repeats=2)
    out = capsys.readouterr().out
    assert "key_coverage" in out and "25% image KV" in out


def test_store_scale_runs_small_and_times_the_write_path():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "store_scale.py"), "--sizes", "40", "200", "--layers", "4",
                        "--repeats", "2", "--writes", "2", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    *text, last = p.stdout.strip().splitlines()
    r = json.loads(last)
    assert r["sizes"] == [40, 200] and r["layers"] == 4
    for k in ("write_ms", "cpu_ms", "write_ratio", "open_s", "read_s"):
        assert all(len(r[k][n]) == 2 and min(r[k][n]) > 0 for n in ("40", "200")), k
    assert r["write_ratio"]["40"] == [1.0, 1.0]
    report = "\n".join(text)
    for check in ("write at 200 / write at 40", "open, 200 records", "one-sample read, 200 records"):
        assert check in report and "(target <=" in report.split(check)[1].splitlines()[0]


def test_decisive_eviction_run_shards_and_merges_equal_to_one_process(tmp_path, monkeypatch, capsys):
    """`make evaluate`: two ranks' shards merge into exactly the one-process rows (so N processes settle the same
    verdicts), the questions are disjoint from the design and notebook sets, and a missing or foreign shard is refused."""
    import pandas as pd

    E = benchmark("evaluate")
    from unicache_lib.world.questions import heldout_set

    def key(q):
        return q.question, q.scene.uint8().tobytes()
    qs = E.question_set(40)
    assert not {key(q) for q in qs} & {key(q) for q in heldout_set(100, seed=7000) + heldout_set(150, seed=2024)}
    one, two = tmp_path / "one", tmp_path / "two"
    E.run_shard(4, 0, 1, one, peers=False, budgets=(0.1, 0.25), progress=False)
    E.run_shard(4, 1, 2, two, peers=False, budgets=(0.1, 0.25), progress=False)
    with pytest.raises(RuntimeError, match="a shard is missing"):
        E.merge(two)
    E.run_shard(4, 0, 2, two, peers=False, budgets=(0.1, 0.25), progress=False)
    pd.testing.assert_frame_equal(E.merge(one).drop(columns=E.TIMING), E.merge(two).drop(columns=E.TIMING))
    assert "random" in set(E.merge(one).method)  # a seeded policy draws by question id, so shards agree with one run
    import shutil

    for fault in ("cut", "empty", "missing", "edited"):  # a shard damaged after its rank wrote it is refused, named
        bad = tmp_path / f"bad-{fault}"
        shutil.copytree(two, bad)
        csv = bad / "rows-rank1-of-2.csv"
        data = csv.read_bytes()
        if fault == "cut":
            csv.write_bytes(data[:-4])  # inside the last row's last field: pandas alone reads it without a word
        elif fault == "empty":
            csv.write_bytes(b"")
        elif fault == "missing":
            csv.unlink()
        else:
            csv.write_bytes(data.replace(b",0.", b",1.", 1))
        with pytest.raises(RuntimeError, match=f"shard {csv} (is {fault}|differs from what its rank wrote)"):
            E.merge(bad)
    for key, value in (("question_seed", 7000), ("n_image", 16)):  # round 13's S4: shards of another question set
        bad = tmp_path / f"bad-{key}"
        shutil.copytree(two, bad)
        side = bad / "rows-rank1-of-2.json"
        side.write_text(json.dumps({**json.loads(side.read_text()), key: value}))
        with pytest.raises(RuntimeError, match=f"shards whose {key} differs.*different runs"):
            E.merge(bad)
        assert E.main(["--merge", "--out", str(bad), "--results", str(tmp_path / "r")]) == 2  # one line, no traceback
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("evaluate.py: error: ") and "Traceback" not in err, err
    claims, controls = E.decide(E.merge(two))
    assert list(claims.claim) == ["E1", "E2", "E3", "E4"] and set(controls.peer) == {"pooling", "downsample", "key_coverage_features",
                                                                                      "divprune_keys", "divprune"}
    # the notebook reads the committed result only for the model it was run on, and says it decided the row
    from unicache_lib.analysis import caching_claims as CC
    from unicache_lib.scoreboard import Scoreboard

    assert E.main(["--merge", "--out", str(two), "--results", str(tmp_path / "res")]) == 0
    d = CC.decisive("tiny-llava", results=tmp_path / "res")
    assert list(d.index) == ["E1", "E2", "E3", "E4"] and CC.decisive("tiny-mllama", results=tmp_path / "res") is None
    assert CC.decisive("tiny-llava", "controls", results=tmp_path / "res").n.eq(4).all()
    board = Scoreboard()
    CC.declare(board, CC.EVICTION_RULES)
    R = E.merge(one)
    CC.measure_eviction(board, R, [0.1, 0.25], None, ["divprune"], decisive=d.drop(index="E3"))
    assert board.rows["E1"].shown.startswith("decided by the decisive run") and board.rows["E1"].measured[""].value == d.loc["E1", "value"]
    assert not board.rows["E3"].shown.startswith("decided")  # no decisive row: this run decides
    E.run_shard(4, 0, 1, two, peers=False, budgets=(0.1,), progress=False)  # a shard of another run
    with pytest.raises(RuntimeError, match="different runs"):
        E.merge(two)


def test_reuse_at_two_step_counts_runs_small(capsys):
    """benchmarks/reuse_steps.py (issue #31's 20- vs 50-step comparison) at a smoke size: every method's row and the
    control's verdict (or its refusal of a scrambled sweep) are printed."""
    reuse_steps = benchmark("reuse_steps")
    reuse_steps.main(["--prompts", "2", "--repeats", "2", "--steps", "10", "--generators", "tiny-mmdit"])
    out = capsys.readouterr().out
    assert "tiny-mmdit, 10 steps, 2 prompts" in out and "step_skip (stride 5)" in out and "steps:" in out
    assert "PSNR margin over fewer-step sampling" in out and "diffusers:taylorseer lite (N=3, order 2)" in out
    assert "step_skip (order 2, w=1)" in out


@pytest.mark.extended
def test_decisive_reuse_run_shards_and_merges_equal_to_one_process(tmp_path, capsys):
    """`make evaluate-reuse`: prompts disjoint from 06's and the tuning set's; two ranks' chunks merge into exactly the
    one-process rows; the merge decides 06's claims with 06's code, and 06 reads the result only for its own
    generators and settings, saying it decided the row."""
    import pandas as pd

    E = benchmark("evaluate_reuse")
    from unicache_lib.analysis import caching_claims as CC
    from unicache_lib.scoreboard import Scoreboard
    from unicache_lib.world.text import prompt_set

    units = E.prompt_units(80)
    assert not {p["short"] for p, _ in units} & {p["short"] for p in prompt_set(52, 0, 0)}
    assert len({(p["short"], s) for p, s in units}) == 80 and min(s for _, s in units) > 1015
    with pytest.raises(ValueError, match="multiple of 8"):
        E.run_shard(12, 0, 1, tmp_path / "x", generators=("tiny-pixart",), progress=False)
    one, two = tmp_path / "one", tmp_path / "two"
    E.run_shard(16, 0, 1, one, generators=("tiny-pixart",), progress=False)
    E.run_shard(16, 1, 2, two, generators=("tiny-pixart",), progress=False)
    with pytest.raises(RuntimeError, match="a shard is missing"):
        E.merge(two)
    E.run_shard(16, 0, 2, two, generators=("tiny-pixart",), progress=False)
    pd.testing.assert_frame_equal(E.merge(one), E.merge(two))
    assert E.main(["--merge", "--out", str(two), "--results", str(tmp_path / "res")]) == 0  # no timing: said, not faked
    # round 11: no shards was a 10-line traceback; a timing.json of other generators a raw KeyError; a link was read
    (tmp_path / "empty").mkdir()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"repeats": 3, "generators": ["x"], "timing": {"x": {}}}))
    bad = {"empty": (tmp_path / "empty", "no shards in"), "other": (two, "is not the timing of these shards"),
           "link": (two, "link")}
    for case, (out, msg) in bad.items():
        t = two / "timing.json"
        t.unlink(missing_ok=True)
        if case == "other":
            t.write_text((tmp_path / "elsewhere.json").read_text())
        elif case == "link":
            t.symlink_to(tmp_path / "elsewhere.json")
        assert E.main(["--merge", "--out", str(out), "--results", str(tmp_path / "res2")]) == 2, case
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err and "Traceback" not in err, (case, err)
    (two / "timing.json").unlink()
    d = CC.decisive_reuse(["tiny-pixart"], E.STEPS, E.GUIDANCE, results=tmp_path / "res")
    assert ("R1", "b") in d.index and pd.isna(d.loc[("R1", "a"), "value"]) and d.loc[("R1", "b"), "n"] == 16
    assert CC.decisive_reuse(["tiny-mmdit", "tiny-pixart"], E.STEPS, E.GUIDANCE, results=tmp_path / "res") is None
    assert CC.decisive_reuse(["tiny-pixart"], 50, E.GUIDANCE, results=tmp_path / "res") is None
    board = Scoreboard()
    CC.declare(board, CC.REUSE_RULES)
    R = E.merge(one)
    R = R[R.chunk == 0]  # a smaller "notebook" run beside the decisive one
    RU = E.tables(R, None)
    from unicache_lib.reuse.control import control_table
    from unicache_lib.reuse.evaluate import pareto_check

    CT = {g: control_table(t) for g, t in RU.items()}
    P = {(g, by): pareto_check(RU[g], [CC.NEW_REUSE, CC.MILD], [m for m in RU[g].index if m.startswith("diffusers:")], by)
         for g in RU for by in ("speedup", "flops")}
    CC.measure_reuse(board, RU, CT, P, {"tiny-pixart": "pixart"}, 0, decisive=d)
    row = board.rows["R1"]
    assert row.measured["b"].n == 16 and "(b) decided by the decisive run (make evaluate-reuse, 16 new prompts; this run's 8" in row.shown
    assert row.measured["a"].value is None  # the decisive run had no timing: the wall-clock criterion stays unmeasured


def test_stats_stride_error_runs_small_and_pairs_the_same_records(tmp_path):
    """benchmarks/stats_stride_error.py at a smoke size writes its table; its pairing refuses runs that captured
    different sites, and at stride 1 (the estimate is the exact capture) every error is zero."""

    E = benchmark("stats_stride_error")
    out = tmp_path / "err.txt"
    E.main(["--prompts", "1", "--steps", "3", "--strides", "4", "--generators", "tiny-pixart", "--out", str(out)])
    text = out.read_text()
    assert "tiny-pixart: 64 image queries per map, stats_stride 4 keeps 16 rows" in text and "map-similarity knees" in text
    gen, tables = E.run("tiny-mmdit", 1, [1], 3)
    errs = E.error_table(tables[1], tables[1].copy())
    assert (errs["max |err|"] == 0).all() and len(errs) >= 10
    with pytest.raises(ValueError, match="did not capture the same sites"):
        E.error_table(tables[1], tables[1][tables[1].layer == 0])


SMOKE_RUNS = [("stats_stride_error", ["--prompts", "1"], "stats_stride_error.txt"),
              ("batch_eviction", ["--questions", "2"], "batch_eviction.txt"),
              ("prefill_parts", ["--repeats", "2"], "prefill_parts_tiny-llava-576.txt"),
              ("merge_eviction", ["--questions", "20"], "merge_eviction.csv"),
              ("prefill_cover", ["--questions", "8100"], "prefill_cover.csv")]


@pytest.mark.parametrize("tool, argv, name", SMOKE_RUNS, ids=[t[0] for t in SMOKE_RUNS])
def test_a_smoke_run_never_replaces_the_committed_result(monkeypatch, capsys, tmp_path, tool, argv, name):
    """Rounds 15-16's LN4 and LN6: a benchmark run at other settings than the committed run's (`--prompts 1`,
    `--repeats 2`, or `prefill_cover.py --questions 8100` without the `--out` its docs name) replaced
    benchmarks/results/, which the docs read. Every such tool decides where it writes by one rule
    (`evaluate.committed_or_outputs`) before it measures: outputs/ at other settings, said; the default run still writes
    the committed file; `--out` chooses."""
    import unicache_lib.runtime.loaders as loaders

    mod = benchmark(tool)

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(loaders, "load_understanding", stop)
    monkeypatch.setattr(mod, "run", stop, raising=False)  # stats_stride_error measures generators
    committed = (ROOT / "benchmarks" / "results" / name).read_bytes()
    with pytest.raises(Stop):
        mod.main(argv)
    said = capsys.readouterr().out
    assert f"writing {ROOT / 'outputs' / name}, not {ROOT / 'benchmarks' / 'results' / name} (--out to choose)" in said
    assert (ROOT / "benchmarks" / "results" / name).read_bytes() == committed
    for run in ([], argv + ["--out", str(tmp_path / name)]):  # the committed run (make benchmark), a chosen file
        with pytest.raises(Stop):
            mod.main(run)
        assert "writing" not in capsys.readouterr().out


def test_decisive_eviction_budgets_as_token_counts_and_the_scale_targets(tmp_path):
    """`make evaluate BUDGETS=64t,128t`: token counts become shares of the model's image tokens (refused, naming the
    fix, when out of range or malformed), the shards carry them, and the merge decides the literature's-scale targets
    on the rows it has (a target whose budget was not run is left out) with a verdict from its interval."""
    E = benchmark("evaluate")
    from unicache_lib.core.errors import InputError

    assert E.parse_budgets("16t, 0.5", 64) == [0.25, 0.5] and E.parse_budgets(None, 64) == list(E.BUDGETS)
    for bad, says in (("65t", "keep between 1 and 64"), ("16x", "ends in 't'"), ("1.5", r"\[0, 1\]")):
        with pytest.raises((InputError, TypeError), match=says):
            E.parse_budgets(bad, 64)
    with pytest.raises(InputError, match="give the budget as a share"):
        E.parse_budgets("64t", None)
    E.run_shard(3, 0, 1, tmp_path / "rows", peers=False, budgets="32t,64t", progress=False)
    R = E.merge(tmp_path / "rows")
    assert sorted(R.budget.unique()) == [0.5, 1.0] and R.attrs["n_image"] == 64
    T = E.scale_targets(R, R.attrs["n_image"])
    assert set(T.tokens) == {64} and set(T.target) == {"S1", "S3", "S4"}  # S2 and S5 are at 128 tokens: not run
    assert set(T.verdict) <= {"holds", "does not hold", "inconclusive"} and (T.n == 3).all()
    assert (T.lo <= T.value).all() and (T.value <= T.hi).all()
    sh = E.shares(R, 64)
    assert {"tokens", "prefill_vs_full", "kv_fraction"} <= set(sh.columns) and set(sh.tokens) == {32, 64}
    assert (sh.prefill_vs_full > 0).all() and (sh[sh.method == "key_coverage"].prefill_vs_full == 1).all()
