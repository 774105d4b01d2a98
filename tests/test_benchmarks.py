"""The benchmarks run (tiny sizes): `make benchmark` must not rot unnoticed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("config", ["eager", "stats", "recompute", "output_attentions"])
def test_capture_overhead_child_runs_at_a_tiny_shape(config):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "capture_overhead.py"), "--child", config, "--layers", "2",
                        "--heads", "2", "--n-image", "16", "--n-text", "8", "--repeats", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout.strip().splitlines()[-1])
    assert row["config"] == config and row["time_s"] > 0
    assert (row["kept_mb"] > 0) == (config != "eager")


def test_caching_benchmark_eviction_runs_at_a_tiny_shape(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import caching
    finally:
        sys.path.pop(0)
    caching.eviction(layers=2, heads=2, head_dim=4, n_image=16, n_text=4, repeats=2)
    out = capsys.readouterr().out
    assert "key_coverage" in out and "25% image KV" in out
