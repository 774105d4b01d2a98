"""The real-shape rehearsal: stand-ins at real token counts, a slice of `make rehearsal`, and the GPU script's
clean skip (and its code path, on the CPU)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from unicache_lib.families import FAMILIES
from unicache_lib.zoo.builders.standins import STANDINS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(STANDINS))
def test_stand_in_configs_have_the_real_token_counts_and_depth(name, samples):
    spec = STANDINS[name]
    fam = FAMILIES[spec.family]
    tok = fam.tokenizer()
    cfg = fam.config(tok, spec.shape)
    proc = fam.processor(tok, spec.shape)
    enc = proc(images=[samples[0].image], text=[fam.prompt(proc, samples[0].question)], return_tensors="pt")
    if fam.cross_attention:  # the processor's tiles (all of them: padded ones too) times the tokens of one tile
        n = enc["pixel_values"].shape[2] * fam.tokens_per_tile(cfg)
    else:
        n = fam.spans(cfg, enc["input_ids"], enc).n_image
    assert n == spec.image_tokens
    text = cfg.get_text_config()
    assert text.num_hidden_layers == spec.shape.layers and text.num_attention_heads == spec.shape.heads
    if fam.cross_attention:  # Llama-3.2-Vision: a cross-attention layer every 5th layer, from layer 3
        assert text.cross_attention_layers == list(range(3, 40, 5))


@pytest.mark.extended
def test_rehearsal_slice_runs_a_notebook_by_parameters_and_records_cost(tmp_path):
    from unicache_lib.rehearsal import rehearse, write_results

    rows = rehearse(["qwen2-vl-2b"], ["01_capture"], tmp_path, progress=False)
    (row,) = rows
    assert row["wall_s"] > 0 and row["peak_rss_mb"] > 200  # the kernel's memory is counted
    assert row["verdicts"] == "not meaningful (random weights)"
    board = json.loads((tmp_path / "qwen2-vl-2b" / "01_capture" / "scoreboard.json").read_text())
    assert {r["verdict"] for r in board} == {"not meaningful (random weights)"} and len(board) == 4
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    write_results(rows, tmp_path / "r.csv", readme, 12.0)
    text = readme.read_text()
    assert "| 01_capture |" in text and "qwen2-vl-2b" in text and "rehearsal:end" in text
    write_results(rows, tmp_path / "r.csv", readme, 12.0)  # rewritten in place, not appended
    assert readme.read_text().count("rehearsal:begin") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script runs for real (make gpu-rehearsal)")
def test_gpu_script_skips_cleanly_without_cuda():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_rehearsal.py")], capture_output=True, text=True)
    assert r.returncode == 0 and "skipped" in r.stdout and "no CUDA" in r.stdout


@pytest.mark.slow
@pytest.mark.extended
def test_gpu_script_code_path_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_rehearsal.py"), "--cpu-smoke", "--repeats", "2",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in ("stats     / eager", "recompute / sdpa", "10% image KV", "diffusion capture, one SD3-medium joint block",
                 "recompute+adjacent", "sampled/13+adjacent", "at 50 steps: StepSkip(head=0.06", "steps:12"):
        assert line in r.stdout


def test_a_stand_in_card_records_its_weight_checksums(tmp_path):
    from unicache_lib.runtime.checksums import weight_checksums
    from unicache_lib.runtime.loaders import ChecksumError, load_understanding
    from unicache_lib.zoo.builders.standins import build

    d = build("qwen2-vl-2b", tmp_path)
    card = json.loads((d / "model_card.json").read_text())
    assert card["stand_in"] and list(card["checksums"]) == ["model.safetensors"]
    assert card["checksums"] == weight_checksums(d)
    with (d / "model.safetensors").open("r+b") as f:  # damaged after it was written: the loader says so
        f.seek(-4096, 2)
        f.write(bytes(4096))
    with pytest.raises(ChecksumError, match="model.safetensors is corrupted"):
        load_understanding(str(d))


def test_generator_rehearsal_passes_only_parameters_the_notebooks_declare(tmp_path):
    """Every parameter the generator rehearsal passes is declared in the notebook's parameters cell (so it
    changes nothing but parameters), and capture keeps the first, middle and last block."""
    import nbformat

    from unicache_lib.rehearsal import GEN_NOTEBOOKS, gen_notebook_params

    for nb in GEN_NOTEBOOKS:
        book = nbformat.read(ROOT / "notebooks" / f"{nb}.ipynb", as_version=4)
        cell = next(c for c in book.cells if "parameters" in c.get("metadata", {}).get("tags", []))
        declared = {line.split("=")[0].strip() for line in cell.source.splitlines() if "=" in line and not line.startswith("#")}
        params = gen_notebook_params(nb, tmp_path / "m", tmp_path, "cpu", "float32", blocks=57)
        assert set(params) <= declared, (nb, set(params) - declared)
    assert gen_notebook_params("03_diffusion_steps", tmp_path, tmp_path, "cpu", "float32", 57)["LAYERS"] == [0, 28, 56]
