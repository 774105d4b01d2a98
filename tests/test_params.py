"""Every notebook checks its parameters in a cell of its own right after the parameters (and papermill's injected
ones), before anything loads: each bad value stops it with a message naming the parameter (#29)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_lib.params import KINDS, ParameterError, check_params

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "src").glob("0*.py"))


def cells(path: Path) -> list[str]:
    return re.split(r"^# %%", path.read_text(), flags=re.M)


def parameters(path: Path) -> dict:
    cs = cells(path)
    ns: dict = {}
    exec([c for c in cs if 'tags=["parameters"]' in c.split("\n")[0]][0].split("\n", 1)[1], ns)
    return {k: v for k, v in ns.items() if k.isupper()}


BAD = {  # parameter -> (bad value, a phrase the message must hold)
    "SAMPLE_SEED": ("x", "whole number"), "SEED": (-1, ">= 0"), "PER_TYPE": (0, ">= 1"), "LAYERS": ("0,1", "is not a list"),
    "UNDERSTANDING_MODEL": ("", "must name a model"), "DEVICE": ("gpu", "'cuda'"),
    "DTYPE": ("fp8", "one of"), "BUDGETS": ([25], "fraction"), "FRACTIONS": ("0.1", "list"), "STEPS": (2.5, "whole"),
    "GENERATORS": ("tiny-mmdit", "a list"), "MODELS": ([], "at least one"), "N_QUESTIONS": ("1000", "without quotes"),
    "PEERS": ("yes", "True or False"), "MEMORY_BUDGET_GB": (0, "> 0"), "THRESHOLD": (70, "fraction"),
    "LLAVA": ("", "or None"), "FEWER_STEPS": (8, "list"), "SAMPLES": ("no/such/folder", "there is nothing at"),
    "MODEL": ("tiny-llama", "did you mean 'tiny-llava'"),
}


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_parameter_has_a_check_and_the_check_comes_first(src):
    params = parameters(src)
    assert set(params) <= set(KINDS), f"{src.stem}: parameters without a check in params.KINDS: {set(params) - set(KINDS)}"
    check_params(params, list(params))  # the shipped values pass
    cs = cells(src)
    at = [i for i, c in enumerate(cs) if "check_params(globals())" in c]
    par = [i for i, c in enumerate(cs) if 'tags=["parameters"]' in c.split("\n")[0]]
    assert at == [par[0] + 1], f"{src.stem}: check_params must be the cell right after the parameters"
    assert not re.search(r"load_(understanding|generator)\(", cs[at[0]])


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_each_bad_value_is_named(src, tmp_path):
    params = parameters(src)
    tried = 0
    for name, (bad, phrase) in BAD.items():
        if name not in params:
            continue
        with pytest.raises(ParameterError, match=rf"{name}=.*{re.escape(phrase)}"):
            check_params({**params, name: bad})
        tried += 1
    if "OUT_DIR" in params:
        f = tmp_path / "a_file"
        f.write_text("")
        with pytest.raises(ParameterError, match="OUT_DIR=.*names a file"):
            check_params({**params, "OUT_DIR": str(f)})
        tried += 1
    assert tried >= 3


def test_a_samples_folder_is_checked_line_by_line_before_anything_loads(tmp_path):
    from unicache_lib.world import samples

    folder = samples.export_folder(samples.load(per_type=1), tmp_path / "mine")
    check_params({"SAMPLES": str(folder)})  # an exported folder passes
    (folder / "metadata.jsonl").write_text('{"file_name": "single-0.png"}\n')
    with pytest.raises(ParameterError, match=r"SAMPLES=.*line 1: no 'question'"):
        check_params({"SAMPLES": str(folder)})


def test_a_parameter_without_a_check_is_refused():
    with pytest.raises(ValueError, match="no check: add it to unicache_lib.params.KINDS"):
        check_params({"NEW_KNOB": 3}, ["NEW_KNOB"])


def test_papermill_stops_in_the_check_cell_naming_the_parameter(tmp_path):
    """End to end: the primer with SEED='x' fails in its check cell, before the model loads."""
    nb = ROOT / "notebooks" / "00_primer.ipynb"
    p = subprocess.run([sys.executable, "-m", "papermill", "--cwd", str(ROOT), "-k", "python3", str(nb),
                        str(tmp_path / "out.ipynb"), "-p", "SEED", "x", "-p", "OUT_DIR", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "ParameterError" in p.stderr and "SEED='x'" in p.stderr
    import json

    code = [c for c in json.loads((tmp_path / "out.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    at = next(i for i, c in enumerate(code) if "check_params(globals())" in "".join(c["source"]))
    assert code[at]["outputs"] and all(c["execution_count"] is None for c in code[at + 1:])  # nothing after it ran


def test_a_mistyped_model_or_an_absent_device_stops_in_the_check_cell_in_one_line(monkeypatch):
    import torch

    with pytest.raises(ParameterError) as e:
        check_params({"MODEL": "tiny-llama"})
    assert "\n" not in str(e.value) and len(str(e.value)) < 300 and "did you mean 'tiny-llava'" in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ParameterError, match=r"DEVICE='cuda': this machine has 0 CUDA devices: pass 'auto'"):
        check_params({"DEVICE": "cuda"})
    check_params({"DEVICE": "auto", "MODEL": "tiny-llava"})  # the fix the message names works


def test_a_list_spelt_as_a_string_is_read_as_the_list():
    ns = {"LAYERS": "[0, 15, 31]", "BUDGETS": "[0.1, 0.25]", "GENERATORS": "['tiny-mmdit']"}
    check_params(ns)
    assert ns == {"LAYERS": [0, 15, 31], "BUDGETS": [0.1, 0.25], "GENERATORS": ["tiny-mmdit"]}


def test_papermill_parameters_the_notebook_does_not_define_are_named_and_old_names_still_work():
    """The check cell reads papermill's injected cell from IPython's history (In): a misspelt name is refused with the
    closest parameter, a renamed one (UNDERSTANDING_MODEL -> MODEL) moves to its new name with a warning."""
    own = 'MODEL = "tiny-llava"\nN_EVICTION = 150\n'
    ns = {"In": ["", own, '# Parameters\nMDOEL = "tiny-llava"\n'], "MODEL": "tiny-llava", "N_EVICTION": 150,
          "MDOEL": "tiny-llava"}
    with pytest.raises(ParameterError, match=r"MDOEL is not a parameter of this notebook; did you mean MODEL\?"):
        check_params(ns)
    ns = {"In": ["", own, '# Parameters\nUNDERSTANDING_MODEL = "tiny-llava"\nN_EVICTION = 5\n'], "MODEL": "x",
          "N_EVICTION": 5, "UNDERSTANDING_MODEL": "tiny-llava"}
    with pytest.warns(FutureWarning, match="UNDERSTANDING_MODEL is now called MODEL"):
        check_params(ns)
    assert ns["MODEL"] == "tiny-llava" and "UNDERSTANDING_MODEL" not in ns


def test_the_papermill_check_ignores_what_it_cannot_judge():
    """A fork whose own parameters cell starts with "# Parameters" (no papermill), and "Run All" twice in one kernel on
    a papermill output made with a former name: neither is refused, and the former name still moves."""
    ns = {"In": ["", '# Parameters\nPER_TYPE = 4\n'], "PER_TYPE": 4}
    check_params(ns)  # nothing before it: it cannot tell a defined name from an unknown one
    own = 'MODEL = "tiny-llava"\n'
    inj = '# Parameters\nUNDERSTANDING_MODEL = "tiny-llava"\n'
    ns = {"In": ["", own, inj, "check_params(globals())", own, inj], "MODEL": "x", "UNDERSTANDING_MODEL": "tiny-llava"}
    with pytest.warns(FutureWarning):
        check_params(ns)
    assert ns["MODEL"] == "tiny-llava"
