"""The replication table: from scoreboards to the CSV, the README section and the scoreboards' notes."""
from pathlib import Path

from unicache_lib import replicate as R
from unicache_lib.scoreboard import Scoreboard

SRC = Path(__file__).resolve().parents[1] / "notebooks" / "src"


def _board(verdict_u1: str) -> list:
    return [{"claim": "U1", "verdict": verdict_u1}, {"claim": "U5", "verdict": "does not hold"}]


def _runs(u1_by_seed: dict) -> dict:
    runs = {}
    for label, v in u1_by_seed.items():
        runs[label] = {nb: [] for nb in R.NOTEBOOKS}
        runs[label]["02_understanding_maps"] = _board(v)
    return runs


def test_notebook_defaults_and_models():
    p = R.parameters(SRC / "02_understanding_maps.py")
    assert p["MODEL"] == "tiny-llava" and p["SAMPLE_SEED"] == 2024 and p["SEED"] == 0
    assert R.models_of(R.parameters(SRC / "05_kv_eviction.py")) == "tiny-llava"
    assert R.models_of(R.parameters(SRC / "06_step_reuse.py")) == "tiny-mmdit+tiny-pixart"
    assert "SAMPLE_SEED" not in R.parameters(SRC / "05_kv_eviction.py")  # 05 does not use the standard set
    for nb in R.NOTEBOOKS:  # every notebook the tool runs takes the parameters it passes
        assert {"SEED", "OUT_DIR"} <= set(R.parameters(SRC / f"{nb}.py"))
        assert set(R.QUICK[nb]) <= set(R.parameters(SRC / f"{nb}.py"))


def test_verdict_table_csv_readme_and_notes(tmp_path):
    df = R.verdict_table(_runs({"shipped": "holds", "seed 1": "holds", "seed 2": "inconclusive"}))
    assert list(df.columns) == ["notebook", "claim", "models", "shipped", "seed 1", "seed 2", "stable"]
    row = df.set_index("claim").loc["U1"]
    assert not row.stable and row.models == "tiny-llava"
    assert df.set_index("claim").loc["U5"].stable
    csv = tmp_path / "verdicts.csv"
    df.to_csv(csv, index=False)
    assert R.unstable_claims(["tiny-llava"], csv) == {"U1"}
    assert R.unstable_claims(["llava-hf/llava-1.5-7b-hf"], csv) == set()  # other models were not replicated
    assert R.unstable_claims(["tiny-llava"], tmp_path / "absent.csv") == set()
    section = R.readme_section(df)
    assert "| 02 | U1 | holds | holds | inconclusive | **no** |" in section and "1 of 2 verdicts differ" in section
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{R.BEGIN}\nplaceholder-xyz\n{R.END}\n\n## after\n")
    R.update_readme(readme, section)
    R.update_readme(readme, section)  # idempotent: replaces between the markers
    text = readme.read_text()
    assert text.count(R.BEGIN) == 1 and "placeholder-xyz" not in text and text.endswith("## after\n")
    b = Scoreboard(unstable=R.unstable_claims(["tiny-llava"], csv))
    b.rule("U1", "share > 0.5", above=0.5)
    b.measure("U1", 0.6, (0.55, 0.65), 20, "samples")
    assert "unstable across sample sets" in b.table().loc["U1", "note"]


def test_settling_runs_cover_the_unstable_claims():
    """make settle re-decides every claim the committed replication table finds unstable, each in the notebook that
    scores it and with parameters that notebook takes, on a seed no column used; its section renders every row."""
    import pandas as pd

    table = pd.read_csv(R.VERDICTS_CSV)
    unstable = set(table.loc[~table.stable.astype(bool), "claim"])
    settled = {c for _, claims in R.SETTLE.values() for c in claims}
    assert unstable <= settled, unstable - settled
    for nb, (params, claims) in R.SETTLE.items():
        assert set(params) <= set(R.parameters(SRC / f"{nb}.py"))
        assert set(claims) <= set(table[table.notebook == nb].claim)
    assert R.SEED_SETTLE not in (0, 1, 2)
    df = pd.DataFrame([{"notebook": "02_understanding_maps", "claim": "U11", "parameters": "{}", "verdict": "holds",
                        "value": 1.8, "lo": 1.6, "hi": 2.0, "n": 31, "unit": "samples", "note": ""}])
    sec = R.settle_section(df)
    assert sec.startswith(R.SETTLE_BEGIN) and sec.endswith(R.SETTLE_END) and "| 02 | U11 |" in sec and "1.8 [1.6, 2]" in sec
