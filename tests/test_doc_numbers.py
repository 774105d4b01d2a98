"""Every number README.md and docs/*.md quote from a run is generated from a committed file (tools/doc_numbers.py):
the check passes on the committed pages, fails on a tampered or unreadable marker, and the selector syntax does what
its docstring says."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
try:
    import doc_numbers as dn
finally:
    sys.path.pop(0)


# ------------------------------------------------------------------------------------------ the committed pages

def test_every_generated_number_matches_its_source():
    problems = dn.check()
    assert not problems, "numbers that differ from their sources (run `make docs`, then read the sentences around " \
                         "them):\n" + "\n".join(problems)


def test_the_pages_quote_the_numbers_the_issue_named_through_markers():
    """The numbers that drifted when typed by hand are generated: the model cards' accuracies, PixArt's step_skip
    figures, `make models`' total time, the lesson path's reading times."""
    specs = {mk.spec for f in dn.doc_files() for mk in dn.find_markers(f.read_text())}
    readme = {mk.spec for mk in dn.find_markers((ROOT / "README.md").read_text())}
    for model in ("tiny-llava", "tiny-mllama", "tiny-vilt", "tiny-janus"):
        assert f'data/models/{model}/model_card.json#heldout.accuracy fmt="{{:.1%}}"' in specs, model
    assert any("@train_minutes" == dn.parse_spec(s)[0] for s in readme)
    assert any("speed-up over no reuse: median paired > step_skip@3" in s for s in readme)  # PixArt's step_skip
    assert any("06_step_reuse.json#[claim=R2].value" in s for s in readme)  # R2's margin over fewer steps
    assert sum(dn.parse_spec(s)[0].startswith("@read_minutes:") for s in readme) == \
        len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))


def test_the_readme_holds_no_measurement_typed_by_hand():
    found = dn.unmarked_measurements((ROOT / "README.md").read_text())
    assert not found, f"measurement-looking numbers outside markers in README.md (line, text): {found}"


def test_write_with_nothing_new_changes_nothing(tmp_path):
    """`make docs` on the committed tree is a no-op: every page already shows what its sources say."""
    pages = [tmp_path / p.name for p in dn.doc_files()]
    for src, dst in zip(dn.doc_files(), pages):
        shutil.copy(src, dst)
    assert dn.write(pages) == []
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(dn.doc_files(), pages))


# ------------------------------------------------------------------------------------ failing when they differ

def _tree(tmp_path, card=None):
    """A small root with one model card, one results file, one CSV, one text file and one notebook."""
    card = card or {"heldout": {"accuracy": 0.983, "n": 1500, "per_type": {"colour": 1.0}}, "train_minutes": 30.5,
                    "previous_run": {"train_minutes": 12.0}, "note": "position 17.5% (chance 20%)"}
    (tmp_path / "data" / "models" / "m").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "models" / "m" / "model_card.json").write_text(json.dumps(card))
    (tmp_path / "data" / "results").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "results" / "07_x.json").write_text(json.dumps([
        {"claim": "A1", "verdict": "holds", "criteria": [{"name": "a", "value": 0.9116}, {"name": "b", "value": 0.88}]},
        {"claim": "A2", "verdict": "inconclusive", "criteria": []}]))
    (tmp_path / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (tmp_path / "benchmarks" / "results" / "r.csv").write_text("nb,model,wall_s\n01,a,60\n01,b,120\n02,a,30\n")
    (tmp_path / "benchmarks" / "results" / "o.txt").write_text(
        "narrow\nstats / eager  time ratio 1.23 [1.22, 1.27]\nreal width\nstats / eager  time ratio 1.01 [1.00, 1.02]\n")
    (tmp_path / "notebooks").mkdir(exist_ok=True)
    nb = {"cells": [{"cell_type": "markdown", "source": ["word " * 450]},
                    {"cell_type": "code", "source": [], "outputs": [
                        {"output_type": "stream", "name": "stdout", "text": ["R1 · inconclusive\n", "  measured  2.21x at 45.3 dB\n"]},
                        {"output_type": "display_data", "data": {"text/plain": ["E1 · holds\n  value  0.9932\n"]}}]}]}
    (tmp_path / "notebooks" / "01_x.ipynb").write_text(json.dumps(nb))
    return tmp_path


def test_a_tampered_value_fails_naming_the_file_line_and_both_values(tmp_path):
    root = _tree(tmp_path)
    good = 'x\n<!--num data/models/m/model_card.json#heldout.accuracy fmt="{:.1%}"-->98.3%<!--/num-->\n'
    assert dn.check_text(good, "p.md", root) == []
    bad = good.replace("98.3%<", "98.4%<")
    (problem,) = dn.check_text(bad, "p.md", root)
    assert problem.startswith("p.md:2:") and "'98.3%'" in problem and "'98.4%'" in problem


def test_a_changed_source_fails_until_write_refreshes_it(tmp_path):
    root = _tree(tmp_path)
    page = root / "page.md"
    page.write_text('acc <!--num data/models/m/model_card.json#heldout.accuracy fmt="{:.1%}"-->98.3%<!--/num--> end\n')
    assert dn.check([page], root) == []
    _tree(tmp_path, {"heldout": {"accuracy": 0.912, "n": 1500}})  # the model is retrained
    assert len(dn.check([page], root)) == 1
    assert dn.write([page], root) == ["page.md:1: '98.3%' -> '91.2%'"]
    assert page.read_text() == 'acc <!--num data/models/m/model_card.json#heldout.accuracy fmt="{:.1%}"-->91.2%<!--/num--> end\n'
    assert dn.check([page], root) == [] and dn.write([page], root) == []


@pytest.mark.parametrize("spec, why", [
    ("data/models/absent/model_card.json#heldout.accuracy", "does not exist"),
    ("data/models/m/model_card.json#heldout.recall", "no key 'recall'"),
    ("data/models/m/model_card.json#heldout", "selects a dict"),
    ("README.md#x", "not a committed results file"),
    ("data/models/../../etc/passwd#x", "not a committed results file"),
    ("@no_such_value", "unknown derived value"),
    ("data/models/m/model_card.json#heldout.accuracy fmt={:d}", "cannot format"),
    ("data/models/m/model_card.json#heldout.accuracy colour=red", "unknown option"),
    ('"notebooks/01_x.ipynb#out:R9 · > measured@0"', "no line holding 'R9 ·'"),
    ('"notebooks/01_x.ipynb#out:R1 · > measured@5"', "wanted number @5"),
    ('"notebooks/01_x.ipynb#out:E1 · " re="(F\\d)"', "does not match"),
])
def test_a_missing_or_unreadable_source_fails(tmp_path, spec, why):
    root = _tree(tmp_path)
    (problem,) = dn.check_text(f"<!--num {spec}-->1<!--/num-->", "p.md", root)
    assert "cannot read" in problem and why in problem, problem


def test_missing_text_stands_in_only_for_a_file_not_yet_written(tmp_path):
    root = _tree(tmp_path)
    spec = 'data/results/01_x.run.json#duration_s scale=1/60 fmt="{:.0f} min" missing="not recorded yet"'
    assert dn.render(spec, root) == "not recorded yet"
    (root / "data" / "results" / "01_x.run.json").write_text(json.dumps({"duration_s": 185.0}))
    assert dn.render(spec, root) == "3 min"
    # a file that exists but lacks the key is an error, not the missing text
    (root / "data" / "results" / "01_x.run.json").write_text(json.dumps({"seconds": 185.0}))
    with pytest.raises(dn.SourceError, match="no key 'duration_s'"):
        dn.render(spec, root)


def test_the_command_line_check_exits_1_on_a_difference(tmp_path):
    page = tmp_path / "p.md"
    page.write_text('<!--num data/models/tiny-llava/model_card.json#heldout.n fmt="{:,}"-->1,499<!--/num-->\n')
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "doc_numbers.py"), str(page)], capture_output=True, text=True)
    assert r.returncode == 1 and "expected '1,500'" in r.stderr and "make docs" in r.stderr


# ----------------------------------------------------------------------------------------------- the selectors

@pytest.mark.parametrize("source, want", [
    ("data/models/m/model_card.json#heldout.n", 1500),
    ("data/models/m/model_card.json#heldout.per_type.colour", 1.0),
    ("data/results/07_x.json#[1].verdict", "inconclusive"),
    ("data/results/07_x.json#[claim=A1].criteria[name=b].value", 0.88),
    ("data/results/07_x.json#[claim=A1].criteria[0].value", 0.9116),
    ("data/results/07_x.json#[-1].claim", "A2"),
    ("data/models/m/model_card.json#note@0", 17.5),
    ("data/models/m/model_card.json#note@1", 20),
    ("benchmarks/results/r.csv#[nb=01,model=b].wall_s", 120),
    ("benchmarks/results/r.csv#sum(wall_s)", 210),
    ("benchmarks/results/r.csv#sum([nb=01].wall_s)", 180),
    ("benchmarks/results/r.csv#count([model=a])", 2),
    ("benchmarks/results/r.csv#count()", 3),
    ("benchmarks/results/o.txt#real width > stats / eager@0", 1.01),
    ("benchmarks/results/o.txt#stats / eager@2", 1.27),
    ("notebooks/01_x.ipynb#out:R1 · > measured@1", 45.3),
    ("notebooks/01_x.ipynb#out:E1 · > value@0", 0.9932),
    ("notebooks/01_x.ipynb#cells[1].outputs[0].name", "stdout"),
    ("@train_minutes:m", 42.5),
    ("@read_minutes:01_x", 5),
    ("@meets_bar:m:0.9", "meets its bar"),
    ("@meets_bar:m:0.99", "below its bar"),
])
def test_selectors(tmp_path, source, want):
    assert dn.read_source(source, _tree(tmp_path)) == want


@pytest.mark.parametrize("source, why", [
    ("data/results/07_x.json#[claim=A9].verdict", "no item"),
    ("data/results/07_x.json#[7].verdict", "no item [7]"),
    ("benchmarks/results/r.csv#[nb=01].wall_s", "matches 2 rows, not one"),
    ("benchmarks/results/r.csv#[nb=01,model=a].seconds", "no column 'seconds'"),
    ("benchmarks/results/r.csv#wall_s", "a CSV selector is"),
    ("benchmarks/results/r.csv#[nb].wall_s", "a filter is k=v"),
    ("benchmarks/results/o.txt#gpu > stats", "no line holding 'gpu'"),
    ("data/models/m/model_card.json", "FILE#SELECTOR"),
    ("@train_minutes:absent", "no model card"),
    ("@read_minutes:99_absent", "no notebook"),
    ("@meets_bar:m", "needs the card's heldout.accuracy and a bar"),
])
def test_selectors_that_cannot_select_one_value_say_why(tmp_path, source, why):
    with pytest.raises(dn.SourceError, match=None) as e:
        dn.read_source(source, _tree(tmp_path))
    assert why in str(e.value)


def test_options_re_scale_and_fmt(tmp_path):
    root = _tree(tmp_path)
    assert dn.render('"notebooks/01_x.ipynb#out:R1 · " re="R1 · (.+)"', root) == "inconclusive"
    assert dn.render('"notebooks/01_x.ipynb#out:R1 · > measured" re="[\\d.]+x"', root) == "2.21x"
    assert dn.render('@train_minutes:m scale=1/60 fmt="{:.2f} h"', root) == "0.71 h"
    assert dn.render('data/models/m/model_card.json#heldout.per_type.colour scale=100 fmt="{:.3g}"', root) == "100"
    with pytest.raises(dn.SourceError, match="scale= needs a number"):
        dn.render('data/results/07_x.json#[0].verdict scale=100', root)
    with pytest.raises(dn.SourceError, match="scale must be a number"):
        dn.render('data/models/m/model_card.json#heldout.n scale=abc', root)


@pytest.mark.parametrize("spec", ["a#b fmt=x--y", "a#b fmt=x-", "a#b fmt=\"{}|\"", "a#b fmt=\"unclosed"])
def test_an_opening_comment_that_html_or_a_table_would_break_is_refused(spec):
    with pytest.raises(dn.SourceError):
        dn.parse_spec(spec)


def test_markers_are_found_with_their_lines_and_shown_text():
    text = 'a\nb <!--num x.json#k fmt="{:.1f}"-->1.0<!--/num--> c <!--num "y.txt#p > q@2"-->7<!--/num-->\n'
    (m1, m2) = dn.find_markers(text, "p.md")
    assert (m1.line, m1.source, m1.shown, m2.source, m2.shown) == (2, "x.json#k", "1.0", "y.txt#p > q@2", "7")
    assert text[m1.start:m1.end] == "1.0"


def test_unmarked_measurements_are_found_outside_markers_code_and_comments():
    text = ("It runs 2.2× faster (+3.2 dB) in 7 minutes.\n"
            '<!--num x#y-->9 min<!--/num--> and `3 s` and 95%\n'
            "```\n10 minutes\n```\n<!-- 4 h -->\n")
    assert dn.unmarked_measurements(text) == [(1, "2.2×"), (1, "+3.2 dB"), (1, "7 minutes")]


# ------------------------------------------------------------------------- what `make notebooks` keeps for them

def test_record_results_keeps_the_scoreboard_and_the_run_time_and_refuses_a_stale_one(tmp_path):
    import os
    import time

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import record_results as rr
    finally:
        sys.path.pop(0)
    nb = tmp_path / "notebooks" / "07_x.ipynb"
    nb.parent.mkdir()
    start = time.time() - 60
    pm = {"start_time": __import__("datetime").datetime.fromtimestamp(start).isoformat(), "end_time": "e",
          "duration": 61.27, "exception": None}
    nb.write_text(json.dumps({"cells": [], "metadata": {"papermill": pm}}))
    board = tmp_path / "outputs" / "07_x" / "scoreboard.json"
    board.parent.mkdir(parents=True)
    board.write_text(json.dumps([{"claim": "A1", "verdict": "holds"}]))
    out, run = rr.record(nb, tmp_path)
    assert json.loads(out.read_text()) == [{"claim": "A1", "verdict": "holds"}]
    assert json.loads(run.read_text())["duration_s"] == 61.3
    assert dn.render('data/results/07_x.run.json#duration_s scale=1/60 fmt="{:.0f} min"', tmp_path) == "1 min"
    os.utime(board, (start - 10, start - 10))  # a scoreboard from an earlier run is not this run's
    with pytest.raises(SystemExit, match="older than this run"):
        rr.record(nb, tmp_path)
    nb.write_text(json.dumps({"cells": [], "metadata": {"papermill": {}}}))  # timings already stripped
    with pytest.raises(SystemExit, match="no finished run"):
        rr.record(nb, tmp_path)
    # a lesson that rules on no claim (the primer) gets its run time only; one that builds a board must have written it
    primer = tmp_path / "notebooks" / "00_p.ipynb"
    primer.write_text(json.dumps({"cells": [{"source": "print(1)"}], "metadata": {"papermill": pm}}))
    (written,) = rr.record(primer, tmp_path)
    assert written.name == "00_p.run.json" and not (tmp_path / "data" / "results" / "00_p.json").exists()
    primer.write_text(json.dumps({"cells": [{"source": "board = Scoreboard()"}], "metadata": {"papermill": pm}}))
    with pytest.raises(SystemExit, match="no outputs/00_p/scoreboard.json"):
        rr.record(primer, tmp_path)


# ------------------------------------------------------------------------------- numbers in the notebooks' prose

def test_notebook_prose_holds_no_new_number_typed_by_hand():
    """Every measurement-looking number in a notebook's markdown is a marker over the run's outputs or results (checked
    by test_every_generated_number_matches_its_source), an allowed convention, or one of the numbers still pending
    conversion in notebooks/src/pending_numbers/. A new hand-typed number fails; so does a pending entry that is
    gone from the prose (remove it: the list only shrinks)."""
    from collections import Counter

    pending = dn.pending_numbers()
    problems = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        found = Counter(n for _, n in dn.notebook_prose_numbers(nb))
        allowed = Counter(pending.get(nb.name, []))
        new, gone = found - allowed, allowed - found
        if new:
            cells = {n: [c for c, m in dn.notebook_prose_numbers(nb) if m == n] for n in new}
            problems.append(f"{nb.name}: typed by hand, not a marker: {dict(cells)} (cell indices)")
        if gone:
            problems.append(f"{nb.name}: pending entries no longer in the prose, remove them: {sorted(gone.elements())}")
    assert not problems, "\n".join(problems)


def test_markers_in_a_notebook_are_read_inside_its_json(tmp_path):
    """A marker in a committed .ipynb sits inside a JSON string: its quotes are escaped there and the value written
    back is escaped too, so the notebook stays valid JSON and shows the source's value."""
    (tmp_path / "data" / "results").mkdir(parents=True)
    (tmp_path / "data" / "results" / "r.json").write_text(json.dumps({"x": 0.4567}))
    md = 'the mean is <!--num data/results/r.json#x fmt="{:.2f}"-->0.99<!--/num--> here'
    nb = tmp_path / "notebooks" / "00_x.ipynb"
    nb.parent.mkdir()
    nb.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": [md]}]}, indent=1, ensure_ascii=False))
    assert dn.check([nb], tmp_path) and dn.write([nb], tmp_path)
    assert json.loads(nb.read_text())["cells"][0]["source"][0] == md.replace("0.99", "0.46")
    assert dn.check([nb], tmp_path) == []


def test_a_constant_says_why_in_place_and_is_not_counted():
    text = "the rule: within <!--const M4's threshold, fixed before the numbers-->±0.02<!--/const--> of 0.0357"
    assert [n for _, n in dn.unmarked_measurements(text)] == []
    nb = {"cells": [{"cell_type": "markdown", "source": [text]}]}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.ipynb"
        p.write_text(json.dumps(nb))
        assert [n for _, n in dn.notebook_prose_numbers(p)] == ["0.0357"]


def test_notebook_prose_stays_short():
    """#46: a lesson opens with at most 250 words before its first code, no markdown cell runs over 250 words (a wall
    of text goes to docs/), and the nine lessons hold at most 17,000 words of prose a reader sees."""
    total, problems = 0, []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        words = [len(dn.visible_text("".join(c["source"])).split()) if c["cell_type"] == "markdown" else 0 for c in cells]
        total += sum(words)
        problems += [f"{nb.name} cell {i}: {w} words (at most 250)" for i, w in enumerate(words) if w > 250]
    assert not problems, "\n".join(problems)
    assert total <= 17_000, f"{total} words of prose in the lessons (at most 17,000)"
