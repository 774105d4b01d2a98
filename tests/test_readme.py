"""Every ```python block of README.md and of the docs/ pages runs as written.

Each document's blocks run top to bottom in one namespace (as a reader pastes them into one session),
offline, on the shipped models, in a temporary working directory so nothing lands in the repository.
A block fenced ```python no-test (a path on the reader's machine, a real checkpoint) is only compiled.
A failure names the document and the line where the block starts.
"""
import re
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE_START = "```python"
# README.md and every docs/ page with a python block (README.md and docs/FORKING.md must have one); each page's blocks
# run in a namespace of their own, so a page never depends on another
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")
                             if FENCE_START in p.read_text() and p.name != "FORKING.md"), "docs/FORKING.md"]
FENCE = re.compile(r"^```python(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """``(line where the code starts, code, runnable)`` for every ```python block of ``text``."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        out.append((line, m.group("code"), "no-test" not in m.group("info").split()))
    return out


def run_blocks(doc: str, blocks) -> None:
    ns: dict = {"__name__": "__readme__"}
    for line, code, runnable in blocks:
        # the code object is named after the document and shifted to its line numbers, so a traceback
        # points at README.md:<line of the failing statement>
        compiled = compile("\n" * (line - 1) + code, f"{doc}", "exec")
        if not runnable:
            continue
        try:
            exec(compiled, ns)
        except BaseException as e:  # noqa: BLE001 - any failure of a block fails the test, with where it is
            pytest.fail(f"{doc}: the python block starting at line {line} failed: {type(e).__name__}: {e}\n"
                        + "".join(traceback.format_exception(e)[-6:]), pytrace=False)


def test_block_extraction_finds_line_numbers_and_no_test_blocks():
    text = "intro\n```python\nx = 1\n```\n\n```python no-test\nopen('mine.png')\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n", True), (7, "open('mine.png')\n", False)]


def test_a_broken_block_fails_naming_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks("# t\n```python\nx = 1\n```\ntext\n```python\ny = x + undefined_name\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"README.md: the python block starting at line 7 failed: NameError"):
        run_blocks("README.md", blocks)


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_block_runs(doc, tmp_path, monkeypatch):
    path = ROOT / doc
    if not path.exists():
        pytest.fail(f"{doc} is missing")
    blocks = python_blocks(path.read_text())
    assert any(runnable for _, _, runnable in blocks), f"{doc} has no runnable python block"
    monkeypatch.chdir(tmp_path)  # outputs of the blocks (stores, pipelines, scoreboards) land here
    import matplotlib

    matplotlib.use("Agg")
    run_blocks(doc, blocks)


def test_the_pages_with_python_blocks_are_all_run():
    assert {"README.md", "docs/FORKING.md", "docs/MODELS.md", "docs/CAPTURE.md", "docs/CACHING.md"} <= set(DOCS)


# the per-notebook table of docs/LAYOUT.md lists the claims each notebook measures, from the claims' one source
LAYOUT = "docs/LAYOUT.md"
NOTEBOOK_ROW = re.compile(r"^\| `notebooks/(\d\d_\w+)\.ipynb` \|.*; (<!--num @claims:(\w+)-->)?[^|]* \|$", re.M)


def test_layout_lists_each_lessons_claims_from_their_one_source():
    """docs/LAYOUT.md names each lesson's claims through a marker over unicache_lib/claims.py (tools/doc_numbers.py
    checks what it shows), never typed by hand."""
    from unicache_lib.claims import LESSONS

    rows = NOTEBOOK_ROW.findall((ROOT / LAYOUT).read_text())
    assert [nb for nb, *_ in rows][1:] == list(LESSONS)  # 00, the primer, rules on no claim
    for nb, marker, named in rows[1:]:
        assert marker and named == nb, f"{LAYOUT}: the row of {nb} lists its claims without the @claims:{nb} marker"
