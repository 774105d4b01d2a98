"""The Makefile's targets: each has a `##` help line and is documented in the README; `make lab` runs as
root and as a normal user."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()
TARGETS = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.M).group(1).split()


def test_every_target_has_a_help_line_and_a_readme_entry():
    readme = (ROOT / "README.md").read_text()
    assert len(TARGETS) >= 13
    for t in TARGETS:
        assert re.search(rf"^## {re.escape(t)}:", MAKEFILE, re.M), f"no '## {t}:' help line in the Makefile"
        assert f"make {t}`" in readme or f"`make {t} " in readme, f"`make {t}` is not documented in README.md"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("euid, flag", [("0", True), ("1000", False)])
def test_lab_adds_allow_root_only_for_root(euid, flag):
    out = subprocess.run(["make", "-n", "lab", f"EUID={euid}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lab = [line for line in out.splitlines() if "jupyter lab" in line]
    assert len(lab) == 1 and "--notebook-dir=notebooks" in lab[0]
    assert ("--allow-root" in lab[0]) is flag
