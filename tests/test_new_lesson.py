"""docs/FORKING.md, "(g) a lesson": a lesson is its source (with its record in the header), its executed notebook and
its solution. A throw-away lesson is written as those files in a temporary course folder and goes through what every
lesson goes through: the record is found (:mod:`unicache_lib.lessons`), the notebook is built from the source and
run with the record's quick parameters, its first figure is taken from the run (tools/lesson_pictures.py), its
exercise scaffolding passes the course's check, and its solution runs; no other file is touched."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from unicache_lib import lessons
from unicache_lib.core.errors import InputError

from .deadline import deadline

ROOT = Path(__file__).resolve().parents[1]

# file 1: notebooks/src/98_toy.py, the lesson with its record in the header
SOURCE = '''# ---
# jupyter:
#   unicache:
#     first_figure: [toy_first]
#     figure_kind: named
#     quick: {N: 3}
# ---

# %% [markdown]
# # 98 · A toy lesson
#
# **What you will learn**: that a lesson is three files.
#
# ![This lesson's first figure, from its last run](../docs/figures/98_toy.png)

# %% tags=["parameters"]
N = 8
OUT_DIR = "outputs/98_toy"

# %%
import matplotlib.pyplot as plt
from unicache_lib import plots
from unicache_lib.paths import notebook_output

out = notebook_output(OUT_DIR)
squares = [i * i for i in range(N)]
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot(squares, label="squares")
ax.set_title("the squares")
plots.save(fig, out, "toy_first")
plt.show()
print(f"{N} squares, the last {squares[-1]}")

# %% [markdown]
# ## Exercises
#
# 1. ★ Write the cubes.

# %%
# Exercise 1 starter: the cubes of range(N), checked against the squares times i
cubes = ...  # <- write: a list of i ** 3 for i in range(N)
if cubes is ...:
    print("write `cubes` above, then run this cell")
else:
    print("correct" if cubes == [s * i for i, s in enumerate(squares)] else "not yet: compare with squares")
'''

# file 3: solutions/98_toy.py
SOLUTION = '''def exercise_1(quick=True):
    """Expected: the cubes of 0..2 when quick."""
    return [i ** 3 for i in range(3 if quick else 8)]
'''


def _write(root: Path) -> Path:
    src = root / "notebooks" / "src" / "98_toy.py"
    src.parent.mkdir(parents=True)
    src.write_text(SOURCE)
    (root / "solutions").mkdir()
    (root / "solutions" / "98_toy.py").write_text(SOLUTION)
    return src


def test_a_throw_away_lesson_in_three_files_runs_through_the_course(tmp_path):
    import jupytext
    import nbformat
    import papermill as pm

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import lesson_pictures
    finally:
        sys.path.remove(str(ROOT / "tools"))
    from tests.test_notebook_sources import cells, scaffold_problems

    course = tmp_path / "course"
    src = _write(course)
    found = lessons.discover(course)
    assert list(found) == ["98_toy"]
    lesson = found["98_toy"]
    assert (lesson.title, lesson.first_figure, lesson.figure_kind, lesson.quick) == (
        "98 · A toy lesson", ("toy_first",), "named", {"N": 3})

    # file 2: the notebook, built from the source as `make notebooks` builds it, then run with the quick parameters
    nb = jupytext.read(src)
    assert nb.metadata["unicache"]["first_figure"] == ["toy_first"]  # the record travels into the notebook
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lesson.notebook)
    run = tmp_path / "run"
    pm.execute_notebook(str(lesson.notebook), str(lesson.notebook), cwd=str(course), kernel_name="python3",
                        progress_bar=False, parameters={"OUT_DIR": str(run), **lesson.quick})
    executed = nbformat.read(lesson.notebook, as_version=4)
    assert any("3 squares, the last 4" in o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "curves" in json.loads((run / "toy_first.facts.json").read_text())  # plots.save wrote what it shows

    picture = lesson_pictures.write(lesson.notebook, course / "docs" / "figures")
    assert picture == course / "docs" / "figures" / "98_toy.png" and picture.read_bytes().startswith(b"\x89PNG")
    assert scaffold_problems(cells(jupytext.read(src)), executed.cells, None) == []

    spec = importlib.util.spec_from_file_location("solution_98_toy", lesson.solution)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.exercise_1() == [0, 1, 8]

    written = sorted(str(p.relative_to(course)) for p in course.rglob("*") if p.is_file())
    assert written == ["docs/figures/98_toy.png", "notebooks/98_toy.ipynb", "notebooks/src/98_toy.py",
                       "solutions/98_toy.py"]  # three written by hand, the picture by the tool


def test_every_shipped_lesson_has_a_record_the_tools_read():
    from unicache_lib import claims

    found = lessons.discover()
    assert list(found) == sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert claims.LESSONS == tuple(k for k in found if k in {c.notebook for c in claims.REGISTRY.values()})
    for lesson in found.values():
        assert lesson.notebook.is_file() and lesson.solution.is_file(), lesson.id
        for ref, table in lesson.rule_tables().items():  # the analysis modules' tables are views of claims.py
            assert table == claims.rules_of(lesson.id), (lesson.id, ref)


_HEAD = "# ---\n# jupyter:\n#   unicache:\n#     first_figure: [a]\n#     figure_kind: k\n"


@pytest.mark.parametrize("header, message", [
    ("", "no lesson record"),
    ("# ---\n# jupyter:\n#   unicache:\n#     first_figure: x\n#     figure_kind: named\n# ---\n", "first_figure must"),
    ("# ---\n# jupyter:\n#   unicache:\n#     first_figure: [a]\n# ---\n", "figure_kind must"),
    ("# ---\n# jupyter:\n#   unicache:\n#     first_figure: [a]\n#     figure_kind: k\n#     quik: {}\n# ---\n",
     "unknown lesson field"),
    ("# ---\n# jupyter:\n#   unicache:\n#     first_figure: [a]\n#     figure_kind: k\n#     quick: {n: 1}\n# ---\n",
     "UPPER_CASE"),
    ("# ---\n# jupyter:\n#   unicache: [\n# ---\n", "cannot be read as YAML"),
    (_HEAD + "#     quick: {SEED: 010}\n# ---\n", "leading zero .* write 10"),   # YAML 1.1 would read octal 8
    (_HEAD + "#     quick: {N: 1_000}\n# ---\n", "write 1000"),   # round 11: YAML 1.1 reads 1000, 1.2 a text
    (_HEAD + "#     quick: {G: .nan}\n# ---\n", "not a finite number"),
    (_HEAD + "#     quick: {G: [1.0, -.inf]}\n# ---\n", "not a finite number"),
    (_HEAD + "#     quick: {A: 1, A: 2}\n# ---\n", "'A' is written twice"),       # a reader would keep the last
    (_HEAD + "#     quick: {A: [1, {b: 2}]}\n# ---\n", "not a number, a word"),
    # round 6: seven levels of aliases ("billion laughs") expanded into a 52 MB one-line refusal
    ("# ---\n# x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"# {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(7))
     + "# jupyter:\n#   unicache:\n#     first_figure: [a]\n#     figure_kind: k\n# ---\n", "an alias"),
])
def test_a_malformed_record_names_the_file_and_the_field(tmp_path, header, message):
    src = tmp_path / "notebooks" / "src" / "97_bad.py"
    src.parent.mkdir(parents=True)
    src.write_text(header + "# %% [markdown]\n# # 97 · bad\n")
    with pytest.raises(InputError, match=message) as e:
        lessons.discover(tmp_path)
    assert "97_bad.py" in str(e.value) and len(str(e.value)) < 400


def test_a_record_reads_words_and_dates_as_written_and_a_source_that_is_not_utf8_is_refused(tmp_path):
    src = tmp_path / "notebooks" / "src" / "97_x.py"
    src.parent.mkdir(parents=True)
    src.write_text(_HEAD + "#     quick: {DEVICE: on, SEED: 10, DAY: 2024-01-01, ON: true, G: 1:30.0, F: [0.5, 1e-3, .5]}"
                           "\n# ---\n")
    assert lessons.discover(tmp_path)["97_x"].quick == {"DEVICE": "on", "SEED": 10, "DAY": "2024-01-01", "ON": True,
                                                         "G": "1:30.0", "F": [0.5, 0.001, 0.5]}
    src.write_bytes(b"# ---\n# \xff\n# ---\n")
    with pytest.raises(InputError, match="97_x.py: not UTF-8"):
        lessons.discover(tmp_path)


@pytest.mark.parametrize("kind", ["a link out", "a FIFO", "a folder"])
def test_a_lesson_source_that_is_no_file_of_the_repository_is_refused(tmp_path, kind):
    """Round 12's N6: a source that was a symlink out of the repository was read (its title, quick values and the
    rule modules rule_tables() would import); a FIFO blocked the reader; a folder was a raw IsADirectoryError."""
    import os

    src = tmp_path / "notebooks" / "src"
    src.mkdir(parents=True)
    (tmp_path / "outside.py").write_text(_HEAD + "# ---\n# # SECRET-TITLE\n")
    {"a link out": lambda p: p.symlink_to(tmp_path / "outside.py"), "a FIFO": os.mkfifo,
     "a folder": os.mkdir}[kind](src / "08_x.py")
    with deadline(20), pytest.raises(InputError, match="08_x.py") as e:
        lessons.discover(tmp_path)
    assert "\n" not in str(e.value) and "SECRET" not in str(e.value)
