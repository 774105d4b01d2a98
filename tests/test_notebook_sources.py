"""Every committed notebook is built from its paired source (notebooks/src/NN_*.py, jupytext pairing in
notebooks/jupytext.toml): a source edit without a rebuild, or a notebook edit without its source, fails here."""
import sys
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


# Issue #46 item 4, exercises that scaffold: each exercise of a lesson's "## Exercises" list has one starter cell
# (`# Exercise K starter: ...`); a ★/★★ starter sets up the work from the notebook's own objects and leaves exactly
# one gap, `name = ...  # <- fill in: what`, and is done inside the notebook (no papermill re-run); the committed,
# executed notebook ran every starter cell (outputs, no error), each within STARTER_SECONDS as committed (gap
# unfilled; tools/record_results.py keeps papermill's per-cell seconds in data/results/NN_*.run.json).
STARTER_SECONDS = 5.0
STARTER_RE = r"^# Exercise (\d+) starter"
GAP_RE = r"^[ \t]*(?:[A-Za-z_]\w*[ \t]*=[ \t]*)?\.\.\.[ \t]+# <- (?:fill in|write): \S.*$"
# Issue #62 item 5: a gap is a value to choose (`k = ...  # <- fill in: ...`) or code to write: an expression over
# the run's objects (`hits = ...  # <- write: ...`) or a function's body (`    ...  # <- write: ...` under a `def`),
# which the starter cell checks once it is filled.
CODE_GAP_RE = r"^[ \t]*(?:[A-Za-z_]\w*[ \t]*=[ \t]*)?\.\.\.[ \t]+# <- write: \S.*$"


def scaffold_problems(src_cells: list, executed_cells: list | None, seconds: dict | None) -> list[str]:
    """What is wrong with a notebook's exercise scaffolding: src_cells as `cells()` gives them (kind, source, tags),
    executed_cells the committed notebook's cells (nbformat), seconds its run.json's starter_cells_seconds."""
    import re

    problems = []
    listing = next((s.split("## Exercises", 1)[1] for kind, s, _ in src_cells
                    if kind == "markdown" and "## Exercises" in s), None)
    if listing is None:
        return ["no '## Exercises' markdown cell"]
    stars = {int(k): len(st) for k, st in re.findall(r"^(\d+)\. (★+)", listing, re.M)}
    starters = {int(m.group(1)): s for kind, s, _ in src_cells if kind == "code" and (m := re.match(STARTER_RE, s))}
    if sorted(stars) != list(range(1, len(stars) + 1)) or not stars:
        problems.append(f"the exercise list is not numbered 1..n with stars: {sorted(stars)}")
    if sorted(starters) != sorted(stars):
        problems.append(f"exercises {sorted(stars)} but starter cells for {sorted(starters)}")
    for k, s in sorted(starters.items()):
        gaps = re.findall(GAP_RE, s, re.M)
        if stars.get(k, 3) <= 2:
            if len(gaps) != 1:
                problems.append(f"exercise {k} (★{'★' * (stars[k] - 1)}): {len(gaps)} gaps `name = ...  # <- fill in: "
                                f"...`, want exactly one")
            if "papermill" in s:
                problems.append(f"exercise {k}: a ★/★★ starter is done in the notebook, not with papermill")
        elif len(gaps) > 1:
            problems.append(f"exercise {k}: {len(gaps)} gaps, want at most one")
    if executed_cells is not None:
        ran = {int(m.group(1)): c for c in executed_cells
               if c.cell_type == "code" and (m := re.match(STARTER_RE, c.source))}
        for k in sorted(starters):
            outs = ran[k].get("outputs", []) if k in ran else []
            if not outs:
                problems.append(f"exercise {k}: the committed notebook holds no output of its starter cell")
            if any(o.get("output_type") == "error" for o in outs):
                problems.append(f"exercise {k}: its starter cell raised in the committed notebook")
    if seconds is not None:
        for k in sorted(starters):
            t = seconds.get(str(k))
            if t is None:
                problems.append(f"exercise {k}: no starter_cells_seconds recorded (make notebooks NB=..)")
            elif t > STARTER_SECONDS:
                problems.append(f"exercise {k}: its starter cell took {t} s unfilled (limit {STARTER_SECONDS} s): "
                                f"keep the heavy work behind the gap")
    return problems


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_starter_cells_scaffold(nb):
    import json

    run = ROOT / "data" / "results" / f"{nb.stem}.run.json"
    seconds = json.loads(run.read_text()).get("starter_cells_seconds", {}) if run.is_file() else {}
    problems = scaffold_problems(cells(jupytext.read(ROOT / "notebooks" / "src" / f"{nb.stem}.py")),
                                 nbformat.read(nb, as_version=4).cells, seconds)
    assert not problems, f"{nb.stem}: " + "; ".join(problems)


def test_scaffold_check_catches_a_starter_without_a_gap_or_with_papermill():
    import nbformat.v4 as v4

    listing = ("markdown", "## Exercises\n\n1. ★ Set a parameter.\n2. ★★ A few lines.\n3. ★★★ Your checkpoint.", [])
    good = [listing, ("code", "# Exercise 1 starter: x\nk = ...  # <- fill in: a number\nprint(k)", []),
            ("code", "# Exercise 2 starter: y\nf = ...  # <- fill in: a function\nprint(f)", []),
            ("code", "# Exercise 3 starter: z\nprint('papermill ...')", [])]
    ran = [v4.new_code_cell(s, outputs=[v4.new_output("stream", text="ok\n")]) for kind, s, _ in good if kind == "code"]
    assert scaffold_problems(good, ran, {"1": 0.1, "2": 0.2, "3": 0.1}) == []
    no_gap = [*good[:2], ("code", "# Exercise 2 starter: y\nprint('rerun with papermill -p STEPS 8')", []), good[3]]
    found = scaffold_problems(no_gap, None, None)
    assert any("exercise 2" in p and "0 gaps" in p for p in found) and any("papermill" in p for p in found)
    assert any("starter cells for [1, 2]" in p for p in scaffold_problems(good[:3], None, None))  # one listed, no cell
    ran[1].outputs = [v4.new_output("error", ename="E", evalue="", traceback=[])]
    assert any("raised" in p for p in scaffold_problems(good, ran, {"1": 0.1, "2": 9.0, "3": 0.1}))
    assert any("9.0 s" in p for p in scaffold_problems(good, ran, {"1": 0.1, "2": 9.0, "3": 0.1}))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lesson_opens_on_its_picture(nb):
    """#46: cell 0 ends on the lesson's picture (what you will learn, then the figure), and that picture is the committed
    run's own first figure: docs/figures/<lesson>.png equals the output of the cell that saves it
    (tools/lesson_pictures.py, run by make notebooks), so it cannot drift from the run."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import lesson_pictures as LP
    finally:
        sys.path.pop(0)
    cell0 = nbformat.read(nb, as_version=4).cells[0]
    assert cell0.cell_type == "markdown" and cell0.source.rstrip().endswith(LP.link(nb.stem))
    assert (ROOT / "docs" / "figures" / f"{nb.stem}.png").read_bytes() == LP.picture(nb), \
        f"docs/figures/{nb.stem}.png is not {nb.name}'s first figure: python tools/lesson_pictures.py {nb}"


def gap_counts(nb: Path) -> tuple[int, int]:
    """(gaps, of which code to write) in a lesson's starter cells."""
    import re

    starters = [s for kind, s, _ in cells(jupytext.read(ROOT / "notebooks" / "src" / f"{nb.stem}.py"))
                if kind == "code" and re.match(STARTER_RE, s)]
    return (sum(len(re.findall(GAP_RE, s, re.M)) for s in starters),
            sum(len(re.findall(CODE_GAP_RE, s, re.M)) for s in starters))


def test_exercises_make_you_write_code():
    """#62 item 5: at least two thirds of the course's gaps, and at least one in every lesson, are code to write;
    no starter is a papermill run of "your checkpoint" (those are in each lesson's "Next steps" box)."""
    import re

    counts = {nb.stem: gap_counts(nb) for nb in NOTEBOOKS}
    none = [k for k, (_, code) in counts.items() if code == 0]
    total, code = sum(g for g, _ in counts.values()), sum(c for _, c in counts.values())
    runs = [nb.stem for nb in NOTEBOOKS for kind, s, _ in cells(jupytext.read(ROOT / "notebooks" / "src" / f"{nb.stem}.py"))
            if kind == "code" and re.match(STARTER_RE, s) and "papermill" in s]
    assert not none and 3 * code >= 2 * total and not runs, (
        f"{code} of {total} gaps are code to write (want >= 2/3); lessons without one: {none}; "
        f"papermill starters (move to 'Next steps'): {runs}; per lesson (gaps, code): {counts}")
