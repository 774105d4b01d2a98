import os
import subprocess
import sys

import pytest

from unicache_lib.store import Store

pytestmark = pytest.mark.slow


def test_two_process_capture_merges(tmp_path, random_llava_dir):
    out = tmp_path / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "unicache_lib.capture.distributed", "--model", str(random_llava_dir), "--out", str(out),
           "--n-samples", "5", "--layer-batch", "2"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    st = Store(out)
    assert sorted(x.name for x in out.glob("index-rank*")) == ["index-rank00000.jsonl", "index-rank00001.jsonl"]
    recs = st.read()
    samples = sorted({r.sample for r in recs})
    assert len(samples) == 5 and len(recs) == 5 * 3  # 5 samples x 3 layers, each exactly once
    assert st.verify() == []
    assert st.read_meta()["world_size"] == 2
