"""Every committed notebook is built from its paired source (notebooks/src/NN_*.py, jupytext pairing in
notebooks/jupytext.toml): a source edit without a rebuild, or a notebook edit without its source, fails here."""
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REBUILD = ("rebuild it from its source without executing (ids and outputs kept): `jupytext --update --to ipynb "
           "--output notebooks/{n}.ipynb notebooks/src/{n}.py`, then `make notebooks NB={nn}` to refresh its outputs; "
           "or, if the notebook is right, `jupytext --sync notebooks/{n}.ipynb` writes its source")


def cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_every_notebook_has_a_source():
    assert len(NOTEBOOKS) >= 6
    srcs = {p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")}
    assert {p.stem for p in NOTEBOOKS} == srcs


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_source(nb):
    built = cells(jupytext.read(ROOT / "notebooks" / "src" / f"{nb.stem}.py"))
    committed = cells(nbformat.read(nb, as_version=4))
    fix = REBUILD.format(n=nb.stem, nn=nb.stem[:2])
    assert len(built) == len(committed), f"{nb.name}: {len(committed)} cells, its source {len(built)}; {fix}"
    for i, (b, c) in enumerate(zip(built, committed)):
        if b != c:
            nl, sl = c[1].splitlines(), b[1].splitlines()
            k = next((k for k, (x, y) in enumerate(zip(nl, sl)) if x != y), min(len(nl), len(sl)))
            first = f"line {k + 1}: notebook {nl[k] if k < len(nl) else None!r}, source {sl[k] if k < len(sl) else None!r}"
            raise AssertionError(f"{nb.name} cell {i} ({c[0]}, tags {c[2]}) differs from its source "
                                 f"({b[0]}, tags {b[2]}), {first}; {fix}")


def test_rebuild_keeps_ids_and_outputs_and_pairing_syncs_back(tmp_path):
    """The fix the message above names: `jupytext --update` brings a source edit into the notebook with its
    cell ids and outputs kept; `jupytext --sync` after an edit in the notebook writes it into the source."""
    import shutil
    import subprocess
    import sys

    nb = NOTEBOOKS[-1]
    (tmp_path / "src").mkdir()
    shutil.copy(ROOT / "notebooks" / "jupytext.toml", tmp_path)
    shutil.copy(nb, tmp_path)
    src = tmp_path / "src" / f"{nb.stem}.py"
    src.write_text((ROOT / "notebooks" / "src" / f"{nb.stem}.py").read_text().replace("\nSEED = 0\n", "\nSEED = 5\n", 1))
    before = nbformat.read(nb, as_version=4)
    jt = [sys.executable, "-m", "jupytext", "--quiet"]
    subprocess.run([*jt, "--update", "--to", "ipynb", "--output", str(tmp_path / nb.name), str(src)], check=True)
    after = nbformat.read(tmp_path / nb.name, as_version=4)
    assert cells(after) == cells(jupytext.read(src)) and "SEED = 5" in after.cells[1].source
    assert [c.id for c in after.cells] == [c.id for c in before.cells]
    assert [c.get("outputs") for c in after.cells[2:]] == [c.get("outputs") for c in before.cells[2:]]
    after.cells[-1].source += "\nprint('edited in JupyterLab')"
    nbformat.write(after, tmp_path / nb.name)
    subprocess.run([*jt, "--sync", str(tmp_path / nb.name)], check=True)
    assert src.read_text().rstrip().endswith("print('edited in JupyterLab')")


# A lesson's code cells are short: the measurement lives in the library, the cell calls it (notebook 08 shows the
# pattern: analysis/architecture_claims.py). Cells still longer than the limit are listed with their length; the
# list may only shrink (a cell shortened below the limit must leave it, and no new long cell may join).
MAX_CELL_LINES = 30
LONG_CELLS: dict[str, list[int]] = {}  # none left: every lesson's cells are short


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_are_short(nb):
    lengths = [len([ln for ln in src.splitlines() if ln.strip()])
               for kind, src, _ in cells(jupytext.read(ROOT / "notebooks" / "src" / f"{nb.stem}.py")) if kind == "code"]
    long = [n for n in lengths if n > MAX_CELL_LINES]
    allowed = LONG_CELLS.get(nb.stem, [])
    ok = len(long) <= len(allowed) and all(n <= a for n, a in zip(sorted(long), sorted(allowed)))
    assert ok, (f"{nb.stem}: code cells of {long} non-blank lines (limit {MAX_CELL_LINES}; known long cells "
                f"{allowed}, which may only shrink): move the measurement into unicache_lib and call it, or split the "
                f"cell where a reader would pause")
