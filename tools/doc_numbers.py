"""Numbers in README.md, docs/*.md and the notebooks' markdown that come from a run are generated from committed files.

    python tools/doc_numbers.py            # check: every marker shows what its source says (exit 1 and a list if not)
    python tools/doc_numbers.py --write    # refresh every marker from its source (`make docs`)
    python tools/doc_numbers.py --list     # every marker: file:line, source, value shown

A number is written between two HTML comments, which GitHub and JupyterLab do not render:

    <!--num data/models/tiny-llava/model_card.json#heldout.accuracy fmt="{:.1%}"-->98.3%<!--/num-->

The opening comment holds the **source** and optional ``key=value`` options (split like a shell line, so a value
with spaces is quoted); the text up to ``<!--/num-->`` is what the reader sees, and must equal the source's value
put through the options. Sources are committed files only (:data:`SOURCE_DIRS`):

- ``file.json#a.b[2].c`` (also ``.ipynb``): a dotted path; ``[k=v]`` picks the first list item whose ``k`` is
  ``v`` (``data/results/08_architectures.json#[claim=A1].criteria[name=a].value``), ``[3]`` an index;
- ``file.csv#[k=v,k2=v2].column``: the one row matching every ``k=v``; ``sum(column)``, ``sum([k=v].column)``,
  ``count()``, ``count([k=v])`` aggregate;
- ``"file.txt#first line > next line"``: the first line holding ``first line``, then from there the first line
  holding ``next line`` (as many steps as needed), as text;
- ``"notebook.ipynb#out:first line > next line"``: the same over the printed outputs of the committed notebook's
  code cells (stream text and ``text/plain``, in cell order), for a number a notebook prints but no results file
  holds (``"notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > step_skip@3"``);
- any of these followed by ``@k``: the k-th number (from 0) in the text selected, e.g. a benchmark row or a
  model card's note (``"benchmarks/results/capture_overhead.txt#real width > stats / eager@0"``);
- ``@name`` or ``@name:argument``: a value derived in :data:`DERIVED` from committed files (the sum of the model
  cards' training minutes, a notebook's reading time, whether a model meets the bar its card sets).

Options: ``re`` (a regular expression searched in the selected text: the value is its first group, or the whole
match without one; e.g. a verdict, ``re="E1 · (.+)"``), ``fmt`` (a ``str.format`` template, default ``{}``),
``scale`` (a factor such as ``100`` or ``1/60``, applied to numbers before ``fmt``), ``missing`` (the text to show while the source file does not exist yet, e.g. a
run time that the next ``make notebooks`` records; without it a missing file is an error).

The opening comment must not contain ``--`` or end with ``-`` (an HTML comment could not hold it), nor ``|``
(it would split a table cell). tests/test_doc_numbers.py runs the check over README.md, docs/*.md and the notebooks.

**In a notebook** a marker sits in a markdown cell of its source (``notebooks/src/NN_*.py``) and of the committed
``.ipynb`` alike (JupyterLab hides the comments, the reader sees the number). Its source is usually the notebook's
own printed outputs (``"notebooks/05_kv_eviction.ipynb#out:E2 > key_coverage@0"``), so a re-run that prints another
number changes the prose with it: ``make notebooks`` refreshes a notebook's markers right after executing it. In the
``.ipynb`` the marker is read and written inside its JSON string (quotes escaped), so the file keeps its layout.

**The Makefile** holds markers too, in its ``##`` help lines (the times of `make run`, `make test`, ...): those lines
are the one source of `make help` (which prints them, each marker's comments left out) and of docs/SETUP.md's table
of targets, which ``--write`` regenerates between ``<!-- targets:begin -->`` and ``<!-- targets:end -->`` (each
``docs/PAGE.md`` a link there) and the check compares (:func:`targets_table`; tests/test_makefile.py).

A number in prose that reads like a measurement but is a constant fixed before any run (a rule's threshold, a
parameter) says so in place, with its reason: ``<!--const E2's threshold, written before the numbers-->97%<!--/const-->``
(:data:`CONSTANT`; ``--prose`` and the tests skip it, a reviewer reads the reason).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from unicache_lib.store import _atomic_write_bytes  # the store's write: a unique temp file, fsync, replace

ROOT = Path(__file__).resolve().parents[1]
# where a marker's source may live: committed results, model cards and the committed notebooks' metadata
SOURCE_DIRS = ("data/models/", "data/results/", "data/replicate/", "benchmarks/results/", "notebooks/")
MARKER = re.compile(r"<!--num (?P<spec>.*?)-->(?P<shown>.*?)<!--/num-->")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
OPTIONS = ("fmt", "scale", "missing", "re")


class SourceError(ValueError):
    """A marker's source cannot be read or does not select one value."""


@dataclass
class Marker:
    file: str  # as given (relative to the root when it is inside)
    line: int
    spec: str
    shown: str
    start: int  # offsets of the shown text in the file
    end: int

    @property
    def source(self) -> str:
        return shlex.split(self.spec)[0]


def find_markers(text: str, file: str = "<text>") -> list[Marker]:
    out = []
    for m in MARKER.finditer(text):
        out.append(Marker(file, text.count("\n", 0, m.start()) + 1, m.group("spec"), m.group("shown"),
                          m.start("shown"), m.end("shown")))
    return out


def parse_spec(spec: str) -> tuple[str, dict]:
    if "--" in spec or spec.endswith("-") or "|" in spec:
        raise SourceError("the opening comment may hold neither '--' nor '|' and may not end with '-'")
    try:
        tokens = shlex.split(spec)
    except ValueError as e:
        raise SourceError(f"cannot split {spec!r}: {e}") from e
    if not tokens:
        raise SourceError("no source")
    opts = {}
    for t in tokens[1:]:
        k, sep, v = t.partition("=")
        if not sep or k not in OPTIONS:
            raise SourceError(f"unknown option {t!r} (options: {', '.join(f'{o}=' for o in OPTIONS)})")
        opts[k] = v
    return tokens[0], opts


# ---------------------------------------------------------------------------------------------- reading sources

def _nth_number(text: str, k: int):
    nums = NUMBER.findall(str(text))
    if k >= len(nums):
        raise SourceError(f"wanted number @{k} of {text!r}, which holds {len(nums)}")
    s = nums[k].replace(",", "")
    return int(s) if re.fullmatch(r"-?\d+", s) else float(s)


def _split_at(selector: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"(.*?)@(\d+)", selector, re.S)
    return (m.group(1), int(m.group(2))) if m else (selector, None)


def _filters(body: str) -> list[tuple[str, str]]:
    out = []
    for part in body.split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise SourceError(f"a filter is k=v, got {part!r}")
        out.append((k.strip(), v.strip()))
    return out


def _matches(item, filters) -> bool:
    return isinstance(item, dict) and all(str(item.get(k)) == v for k, v in filters)


def json_path(data, path: str):
    """``a.b[2].c[k=v].d`` in parsed JSON."""
    cur = data
    for m in re.finditer(r"\[([^\]]*)\]|([^.\[\]]+)", path):
        sel, key = m.group(1), m.group(2)
        if key is not None:
            if not isinstance(cur, dict) or key not in cur:
                have = ", ".join(list(cur)[:12]) if isinstance(cur, dict) else type(cur).__name__
                raise SourceError(f"no key {key!r} (have: {have})")
            cur = cur[key]
        elif re.fullmatch(r"-?\d+", sel):
            if not isinstance(cur, list) or not -len(cur) <= int(sel) < len(cur):
                raise SourceError(f"no item [{sel}]")
            cur = cur[int(sel)]
        else:
            fs = _filters(sel)
            hit = [x for x in (cur if isinstance(cur, list) else []) if _matches(x, fs)]
            if not hit:
                raise SourceError(f"no item [{sel}]")
            cur = hit[0]
    return cur


def _csv_value(v: str):
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def csv_select(rows: list[dict], selector: str):
    m = re.fullmatch(r"(sum|count)\((.*)\)", selector)
    if m:
        fn, inner = m.groups()
        fm = re.fullmatch(r"(?:\[([^\]]*)\])?\.?([^\[\]]*)", inner)
        filt, col = (fm.group(1), fm.group(2)) if fm else (None, inner)
        sel = [r for r in rows if _matches(r, _filters(filt))] if filt else rows
        if fn == "count":
            return len(sel)
        if not col or (sel and col not in sel[0]):
            raise SourceError(f"no column {col!r}")
        return sum(_csv_value(r[col]) for r in sel)
    fm = re.fullmatch(r"\[([^\]]*)\]\.(.+)", selector)
    if not fm:
        raise SourceError(f"a CSV selector is [k=v,...].column, sum(...) or count(...), got {selector!r}")
    fs = _filters(fm.group(1))
    hit = [r for r in rows if _matches(r, fs)]
    if len(hit) != 1:
        raise SourceError(f"[{fm.group(1)}] matches {len(hit)} rows, not one")
    if fm.group(2) not in hit[0]:
        raise SourceError(f"no column {fm.group(2)!r} (have: {', '.join(hit[0])})")
    return _csv_value(hit[0][fm.group(2)])


def text_select(text: str, selector: str) -> str:
    lines = text.splitlines()
    i = 0
    for step in (s.strip() for s in selector.split(" > ")):
        while i < len(lines) and step not in lines[i]:
            i += 1
        if i == len(lines):
            raise SourceError(f"no line holding {step!r} (after the previous steps)")
    return lines[i]


def notebook_output_text(nb: dict) -> str:
    """What a notebook's code cells printed, in order: stream text and the ``text/plain`` of results and displays."""
    parts = []
    for c in nb.get("cells", []):
        for o in c.get("outputs", []) if c.get("cell_type") == "code" else []:
            text = o.get("text") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain")
            if text:
                parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def read_source(source: str, root: Path = ROOT):
    """The value a source selects (a number, a string or a bool)."""
    if source.startswith("@"):
        name, _, arg = source[1:].partition(":")
        if name not in DERIVED:
            raise SourceError(f"unknown derived value @{name} (known: {', '.join('@' + d for d in DERIVED)})")
        return DERIVED[name](root, arg)
    path, sep, selector = source.partition("#")
    if not sep:
        raise SourceError("a source is FILE#SELECTOR or @name")
    if not path.startswith(SOURCE_DIRS) or ".." in Path(path).parts:
        raise SourceError(f"{path} is not a committed results file (sources live under {', '.join(SOURCE_DIRS)})")
    f = root / path
    if not f.is_file():
        raise FileNotFoundError(path)
    selector, nth = _split_at(selector)
    if f.suffix == ".ipynb" and selector.startswith("out:"):
        value = text_select(notebook_output_text(json.loads(f.read_text())), selector[len("out:"):])
    elif f.suffix in (".json", ".ipynb"):
        value = json_path(json.loads(f.read_text()), selector)
    elif f.suffix == ".csv":
        with f.open(newline="") as fh:
            value = csv_select(list(csv.DictReader(fh)), selector)
    else:
        value = text_select(f.read_text(), selector)
    if nth is not None:
        value = _nth_number(value, nth)
    if isinstance(value, (dict, list)):
        raise SourceError(f"selects a {type(value).__name__}, not one value")
    return value


def _scale(s: str) -> float:
    a, _, b = s.partition("/")
    try:
        return float(a) / (float(b) if b else 1.0)
    except ValueError as e:
        raise SourceError(f"scale must be a number or a fraction like 1/60, got {s!r}") from e


def render(spec: str, root: Path = ROOT) -> str:
    """The text a marker must show."""
    source, opts = parse_spec(spec)
    try:
        value = read_source(source, root)
    except FileNotFoundError:
        if "missing" in opts:
            return opts["missing"]
        raise SourceError(f"{source.partition('#')[0]} does not exist (give missing=\"...\" if a run writes it later)")
    if "re" in opts:
        try:
            m = re.search(opts["re"], str(value))
        except re.error as e:
            raise SourceError(f"re {opts['re']!r} is not a regular expression: {e}") from e
        if not m:
            raise SourceError(f"re {opts['re']!r} does not match {value!r}")
        value = m.group(1) if m.re.groups else m.group(0)
    if "scale" in opts:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SourceError(f"scale= needs a number, the source gives {value!r}")
        value = value * _scale(opts["scale"])
    try:
        return opts.get("fmt", "{}").format(value)
    except (ValueError, IndexError, KeyError) as e:
        raise SourceError(f"fmt {opts.get('fmt')!r} cannot format {value!r}: {e}") from e


# --------------------------------------------------------------------------------------------- derived values

def _card_minutes(card: dict) -> float:
    """Training minutes behind one shipped model: the card's total when it records one, else the sum over the card
    and the chain of runs it was continued from (``previous_run``)."""
    if "train_minutes_total" in card:
        return float(card["train_minutes_total"])
    total, run = 0.0, card
    while run:
        total += float(run.get("train_minutes") or 0.0)
        run = run.get("previous_run")
    return total


def train_minutes(root: Path, model: str = "") -> float:
    """``@train_minutes``: CPU minutes of every run behind the shipped models (one thread each), what `make models`
    repeats; ``@train_minutes:tiny-mllama``: one model's."""
    cards = [root / "data" / "models" / model / "model_card.json"] if model else \
        sorted((root / "data" / "models").glob("*/model_card.json"))
    if not cards or not cards[0].is_file():
        raise SourceError(f"no model card for {model or 'any model'}")
    return sum(_card_minutes(json.loads(c.read_text())) for c in cards)


WORDS_PER_MINUTE = 200


def read_minutes(root: Path, notebook: str) -> int:
    """``@read_minutes:05_kv_eviction``: the committed notebook's markdown at 200 words a minute, rounded up to 5
    minutes (figures, tables and running cells not counted)."""
    f = root / "notebooks" / f"{notebook}.ipynb"
    if not f.is_file():
        raise SourceError(f"no notebook {notebook}")
    cells = json.loads(f.read_text())["cells"]
    words = sum(len(visible_text("".join(c["source"])).split()) for c in cells if c["cell_type"] == "markdown")
    return max(5, 5 * math.ceil(words / WORDS_PER_MINUTE / 5))


def visible_text(markdown: str) -> str:
    """What a reader sees of ``markdown``'s words: every HTML comment (a marker's or a constant's opening and closing
    comments) dropped, the numbers they frame kept."""
    return re.sub(r"<!--.*?-->", "", markdown, flags=re.S)


def run_minutes(root: Path, _arg: str = "") -> float:
    """``@run_minutes``: the sum of every notebook's recorded run time (``data/results/NN_*.run.json``, written by
    `make notebooks`), i.e. what `make run` takes on that machine; missing until every notebook has one."""
    notebooks = sorted(p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    runs = [root / "data" / "results" / f"{nb}.run.json" for nb in notebooks]
    if not runs or not all(r.is_file() for r in runs):
        raise FileNotFoundError("data/results/*.run.json")
    return sum(json.loads(r.read_text())["duration_s"] for r in runs) / 60


def meets_bar(root: Path, arg: str) -> str:
    """``@meets_bar:tiny-janus:0.9``: "meets its bar" or "below its bar", the card's held-out question accuracy
    (``heldout.accuracy``) against the bar given after the model's name (without one, the card's
    ``target.heldout_accuracy``), so a sentence about a model that is retrained cannot go stale."""
    model, _, bar = arg.partition(":")
    card = root / "data" / "models" / model / "model_card.json"
    if not model or not card.is_file():
        raise SourceError(f"no model card for {model or '(no model named)'}")
    d = json.loads(card.read_text())
    try:
        acc = float(d["heldout"]["accuracy"])
        bar = float(bar) if bar else float(d["target"]["heldout_accuracy"])
    except (KeyError, TypeError, ValueError) as e:
        raise SourceError(f"@meets_bar:{arg}: needs the card's heldout.accuracy and a bar (a number after the "
                          f"model's name, or the card's target.heldout_accuracy)") from e
    return "meets its bar" if acc >= bar else "below its bar"


def claim_ids(root: Path, notebook: str) -> str:
    """``@claims:05_kv_eviction``: "claims U7 and targets E1–E4", the lesson's claim ids as
    :func:`unicache_lib.claims.ids_text` lists them from the claims' one source."""
    from unicache_lib.claims import ids_text  # local: the tool reads data files; only this marker needs the package

    try:
        return ids_text(notebook)
    except Exception as e:  # an unknown lesson names the known ones
        raise SourceError(f"@claims:{notebook}: {e}") from e


DERIVED = {"train_minutes": train_minutes, "read_minutes": read_minutes, "run_minutes": run_minutes,
           "meets_bar": meets_bar, "claims": claim_ids}


# ------------------------------------------------------------------------------------------------ check / write

def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/*.md and the Makefile, whose `##` help lines quote recorded times through markers too."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "Makefile"]


def notebook_files(root: Path = ROOT) -> list[Path]:
    """Each lesson's source and its committed notebook (both hold the same markers)."""
    return [*sorted((root / "notebooks" / "src").glob("[0-9][0-9]_*.py")),
            *sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]


def all_files(root: Path = ROOT) -> list[Path]:
    return doc_files(root) + notebook_files(root)


def _in_json(file: str) -> bool:
    return str(file).endswith(".ipynb")


def _unescape(s: str, file: str) -> str:
    """A marker's text as written in ``file``: inside a JSON string in a notebook (quotes escaped there)."""
    return json.loads(f'"{s}"') if _in_json(file) else s


def _escape(s: str, file: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1] if _in_json(file) else s


def _name(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def check_text(text: str, file: str, root: Path = ROOT) -> list[str]:
    """One message per marker that does not show its source's value: ``file:line: expected 'x' (source), found
    'y'``, or why the source cannot be read."""
    problems = []
    for mk in find_markers(text, file):
        try:
            want = _escape(render(_unescape(mk.spec, file), root), file)
        except (SourceError, ValueError) as e:
            problems.append(f"{file}:{mk.line}: cannot read {mk.spec!r}: {e}")
            continue
        if want != mk.shown:
            problems.append(f"{file}:{mk.line}: expected {want!r} (from {mk.source}), found {mk.shown!r}")
    return problems


def check(files=None, root: Path = ROOT) -> list[str]:
    files = all_files(root) if files is None else files
    return [p for f in files for p in check_text(Path(f).read_text(), _name(Path(f), root), root)] + \
        [p for f in files if Path(f).name == TARGETS_PAGE.name for p in check_targets_table(Path(f), root)]


def write(files=None, root: Path = ROOT) -> list[str]:
    """Refresh every marker in place (atomically per file); returns ``file:line: 'old' -> 'new'`` for each change.
    A source that cannot be read stops it before anything is written."""
    files = all_files(root) if files is None else files
    changes, new_texts = [], {}
    for f in map(Path, files):
        text = original = f.read_text()
        if f.name == TARGETS_PAGE.name:  # docs/SETUP.md: its table of targets from the Makefile's help lines first
            text = with_targets_table(text, root)
            if text != original:
                changes.append(f"{_name(f, root)}: the table of make targets regenerated from the Makefile")
        out, last = [], 0
        for mk in find_markers(text, _name(f, root)):
            try:
                want = _escape(render(_unescape(mk.spec, mk.file), root), mk.file)
            except (SourceError, ValueError) as e:
                raise SystemExit(f"{mk.file}:{mk.line}: cannot read {mk.spec!r}: {e}")
            out += [text[last:mk.start], want]
            last = mk.end
            if want != mk.shown:
                changes.append(f"{mk.file}:{mk.line}: {mk.shown!r} -> {want!r}")
        out.append(text[last:])
        if "".join(out) != original:
            new_texts[f] = "".join(out)
    for f, body in new_texts.items():
        _atomic_write_bytes(f, body.encode())
    return changes


# ------------------------------------------------------------- the Makefile's help and docs/SETUP.md's targets table

TARGETS_PAGE = Path("docs/SETUP.md")
TARGETS_BEGIN, TARGETS_END = "<!-- targets:begin -->", "<!-- targets:end -->"
HELP_LINE = re.compile(r"^## (?P<target>[a-z][\w-]*):[ \t]*(?P<text>.*)$")
DOC_PATH = re.compile(r"(?<![\w/.`\[])docs/(?P<page>[A-Z][\w-]*\.md)(?P<anchor>#[\w-]+)?")


def make_help(makefile_text: str) -> list[tuple[str, str]]:
    """``(target, text)`` for every ``## target: text`` comment of the Makefile, in order; the text goes on over the
    following ``##`` lines (one space between lines). What `make help` prints, markers included; the one source of
    docs/SETUP.md's table."""
    out: list[list] = []
    cur = None
    for line in makefile_text.splitlines():
        m = HELP_LINE.match(line)
        if m:
            cur = [m.group("target"), [m.group("text").strip()]]
            out.append(cur)
        elif cur is not None and line.startswith("##"):
            cur[1].append(line[2:].strip())
        else:
            cur = None
    return [(t, " ".join(p for p in parts if p)) for t, parts in out]


def help_markdown(text: str) -> str:
    """A help line as docs/SETUP.md shows it: each ``docs/PAGE.md[#anchor]`` a link relative to docs/."""
    if "|" in text:
        raise SourceError(f"a help line may not hold '|' (it would split the table's row): {text!r}")
    return DOC_PATH.sub(lambda m: f"[{m.group('page')}]({m.group('page')}{m.group('anchor') or ''})", text)


def targets_table(root: Path = ROOT) -> str:
    """docs/SETUP.md's table of make targets, one row per ``##`` help comment of the Makefile, in its order."""
    rows = [f"| `make {t}` | {help_markdown(text)} |" for t, text in make_help((root / "Makefile").read_text())]
    return "\n".join(["| target | what it does |", "|---|---|", *rows])


def with_targets_table(text: str, root: Path = ROOT) -> str:
    """``text`` (docs/SETUP.md) with the table between :data:`TARGETS_BEGIN` and :data:`TARGETS_END` regenerated."""
    i, j = text.find(TARGETS_BEGIN), text.find(TARGETS_END)
    if i < 0 or j < i:
        raise SystemExit(f"{TARGETS_PAGE}: no {TARGETS_BEGIN} ... {TARGETS_END} around the table of make targets")
    return text[:i + len(TARGETS_BEGIN)] + "\n" + targets_table(root) + "\n" + text[j:]


def check_targets_table(page: Path, root: Path = ROOT) -> list[str]:
    text = page.read_text()
    if TARGETS_BEGIN not in text or TARGETS_END not in text:
        return [f"{TARGETS_PAGE}: no {TARGETS_BEGIN} ... {TARGETS_END} around the table of make targets"]
    want = with_targets_table(text, root)
    if want == text:
        return []
    shown = {line for line in text.splitlines() if line.startswith("| `make ")}
    differ = [line.split("|")[1].strip() for line in want.splitlines() if line.startswith("| `make ") and line not in shown]
    return [f"{TARGETS_PAGE}: the table of make targets differs from the Makefile's ## help lines (rows "
            f"{', '.join(differ) or 'in another order'}): `make docs` regenerates it"]


def tests_minutes(root: Path, which: str = "") -> float:
    """``@test_minutes`` / ``@test_minutes:fast``: the seconds per test file (and notebook) of the last recorded
    `make test` / `make test-fast` (tests/costs.json, tests/costs_fast.json: `RECORD=1` writes them), summed, in
    minutes: the work its lanes share."""
    f = root / "tests" / ("costs_fast.json" if which == "fast" else "costs.json")
    if which not in ("", "fast"):
        raise SourceError(f"@test_minutes:{which}: the argument is empty (make test) or fast (make test-fast)")
    if not f.is_file():
        raise FileNotFoundError(f.relative_to(root).as_posix())
    return sum(json.loads(f.read_text()).values()) / 60


DERIVED["test_minutes"] = tests_minutes


# ------------------------------------------------------------------------- numbers written outside any marker

# a number followed by a unit that says "this was measured": ×, x, dB, %, time units, memory units, points
MEASUREMENT = re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?\s?(?:×(?!\s?\d)|x\b|dB\b|%|minutes?\b|min\b|hours?\b|h\b"
                         r"|seconds?\b|s\b|GB\b|MB\b|pt\b)")
# numbers that read like measurements but are conventions, each with its reason
ALLOWED = {
    "95%": "the confidence level of every interval: a convention fixed before any run, not a result",
    "90%": "the held-out accuracy a question-answering model is trained to reach: a target set before training",
    "5 minutes": "the step reading times are rounded up to (@read_minutes), a convention",
    **{b: "an eviction budget (a share of the image KV kept): a parameter chosen before the run" for b in
       ("10%", "25%", "50%", "75%")},
}


def unmarked_measurements(text: str) -> list[tuple[int, str]]:
    """``(line, number with its unit)`` for every measurement-looking number outside markers, HTML comments,
    fenced code blocks and inline code, minus :data:`ALLOWED`."""
    def blank(m):  # keep line numbers: replace the span by its newlines
        return "\n" * m.group(0).count("\n")

    text = MARKER.sub("", text)  # markers hold no newline
    text = CONSTANT.sub("", text)
    text = re.sub(r"^```.*?^```[ \t]*$", blank, text, flags=re.M | re.S)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for m in MEASUREMENT.finditer(text):
        if m.group(0) not in ALLOWED:
            out.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
    return out


# a number that reads like a measurement but is a constant fixed before any run (a rule's threshold, a parameter),
# with its reason in the comment: <!--const the rule's threshold, written before the numbers-->0.02<!--/const-->
CONSTANT = re.compile(r"<!--const (?P<why>[^>]*?)-->(?P<shown>[^<]*?)<!--/const-->")

# in a notebook's prose a bare decimal (0.23, 1.8) reads as measured too
DECIMAL = re.compile(r"(?<![\w.]-)(?<![\w.])[-+−]?\d+\.\d+(?![\w.]|\s?(?:×(?!\s?\d)|x\b|dB\b|%|minutes?\b|min\b|hours?\b|h\b|seconds?\b"
                     r"|s\b|GB\b|MB\b|pt\b))")


def notebook_prose_numbers(nb: Path) -> list[tuple[int, str]]:
    """``(markdown cell index, number)`` for every measurement-looking number in the committed notebook's markdown
    outside markers and code: a number with a unit (:data:`MEASUREMENT`) or a bare decimal, minus :data:`ALLOWED`."""
    out = []
    for i, cell in enumerate(json.loads(Path(nb).read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        out += [(i, n) for _, n in unmarked_measurements(text)]
        bare = re.sub(r"`[^`\n]*`", "", re.sub(r"<!--.*?-->", "", CONSTANT.sub("", MARKER.sub("", text)), flags=re.S))
        out += [(i, m.group(0)) for m in DECIMAL.finditer(bare) if m.group(0) not in ALLOWED]
    return out


def pending_numbers(root: Path = ROOT) -> dict[str, list[str]]:
    """The numbers still typed by hand in each notebook's prose, waiting to become markers (the list only shrinks:
    tests/test_doc_numbers.py fails on a number not in it, and on an entry no longer in the prose)."""
    folder = root / "notebooks" / "src" / "pending_numbers"  # one file per notebook, so lessons are edited apart
    return {f"{p.stem}.ipynb": json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="refresh every marker from its source")
    ap.add_argument("--list", action="store_true", help="list every marker with its source and value")
    ap.add_argument("--prose", action="store_true", help="list the numbers typed by hand in each notebook's markdown "
                    "(cell index and number), the ones tests/test_doc_numbers.py holds to notebooks/src/pending_numbers.json")
    ap.add_argument("files", nargs="*", help="default: README.md, docs/*.md, the Makefile and the notebooks (sources "
                    "and .ipynb)")
    a = ap.parse_args(argv)
    files = [Path(f) for f in a.files] or all_files()
    if a.prose:
        for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            for cell, n in notebook_prose_numbers(nb):
                print(f"{nb.name} cell {cell}: {n}")
        return 0
    if a.list:
        for f in files:
            for mk in find_markers(f.read_text(), _name(f, ROOT)):
                print(f"{mk.file}:{mk.line}: {_unescape(mk.shown, mk.file)!r} <- {_unescape(mk.spec, mk.file)}")
        return 0
    if a.write:
        changes = write(files)
        print("\n".join(changes) if changes else "every number already matches its source")
        return 0
    problems = check(files)
    n = sum(len(find_markers(f.read_text())) for f in files)
    if problems:
        print("\n".join(problems) + f"\n{len(problems)} of {n} numbers differ from their sources: `make docs` "
              "refreshes them (then read the sentences around them)", file=sys.stderr)
        return 1
    print(f"{n} numbers in {len(files)} files match their sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
