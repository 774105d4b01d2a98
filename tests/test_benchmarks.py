"""The benchmarks run (tiny sizes): `make benchmark` must not rot unnoticed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    configs = {"narrow": ["eager", "output_attentions", "stats", "sdpa", "recompute"], "sd3": ["plain", "stats"]}[regime]
    assert list(row["times"]) == configs
    assert all(len(t) == 2 and min(t) > 0 for t in row["times"].values())
    assert all((row["kept_mb"][c] > 0) == (c not in ("eager", "sdpa", "plain")) for c in configs)


@pytest.mark.parametrize("config", ["stats", "output_attentions"])
def test_capture_overhead_memory_child_runs(config):
    row = _child("--memory", "narrow", config)
    assert row["config"] == config and row["kept_mb"] > 0 and row["extra_peak_mb"] >= 0


def test_caching_benchmark_eviction_runs_at_a_tiny_shape(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import caching
    finally:
        sys.path.pop(0)
    caching.eviction(layers=2, heads=2, head_dim=4, n_image=16, n_text=4, repeats=2)
    out = capsys.readouterr().out
    assert "key_coverage" in out and "25% image KV" in out
