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
