"""One piece of advice per finding (#62): what a claim's result means for the reader's model is written once, beside
the claim (``unicache_lib/claims.py``: ``Advice``), and every decision-table row about the claim, in any lesson, is
made from it. Read from the committed notebooks' outputs (no notebook runs here):

- a row whose measurement names a claim with advice says the claim's advice (then, at most, this run's verdict's
  meaning and what the lesson measured) and points where the advice points, so two lessons' rows for one claim
  cannot differ;
- every place a row points to exists: a section ``§N`` (a ``## N.`` heading of that lesson's source), a parameter
  (a name in that lesson's parameters cell), a policy (a name in ``kv.POLICIES`` or ``reuse.REUSE_POLICIES``); the
  claims' own places likewise.
"""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.test_params import parameters
from unicache_lib import claims
from unicache_lib.kv import POLICIES
from unicache_lib.reuse import REUSE_POLICIES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {p.stem[:2]: p for p in sorted((ROOT / "notebooks" / "src").glob("0*.py"))}
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
ADVICE, WHERE = claims.DECISION_COLUMNS[2], claims.DECISION_COLUMNS[3]
ADVISED = [c for c in claims.REGISTRY.values() if c.advice is not None]

# A section a claim's advice already points to while its lesson is being written: listed here, it is not yet required;
# once the heading exists, test_awaited_sections_are_still_awaited asks for the entry to go.
AWAITED: dict = {}
# A committed notebook whose decision table predates its library function's change: its rows are checked all the
# same, and expected to fail until the notebook is re-executed (`make notebooks NB=..`), then the entry must go.
STALE: dict = {}


def sections(lesson: str) -> set[int]:
    return {int(n) for n in re.findall(r"^# ## (\d+)\. ", SOURCES[lesson].read_text(), flags=re.M)}


def params(lesson: str) -> set[str]:
    return set(parameters(SOURCES[lesson]))


POLICY_NAMES = set(POLICIES) | set(REUSE_POLICIES)


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _markdown_rows(text: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", ln.strip())]
    return [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]] for ln in lines]


def decision_rows(nb_path: Path) -> list[dict]:
    """Every row of every decision table (a table with an advice column) the committed notebook shows: its outputs'
    HTML and markdown tables, and tables written in its markdown cells."""
    nb, out = json.loads(nb_path.read_text()), []
    for cell in nb["cells"]:
        tables = []
        if cell["cell_type"] == "markdown":
            tables.append(_markdown_rows("".join(cell["source"])))
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "text/html" in data and "<table" in "".join(data["text/html"]):
                p = _Tables()
                p.feed("".join(data["text/html"]))
                tables.append(p.rows)
            elif "text/markdown" in data:
                tables.append(_markdown_rows("".join(data["text/markdown"])))
        for rows in tables:
            if rows and ADVICE in rows[0]:
                out += [dict(zip(rows[0], r)) for r in rows[1:]]
    return out


def about(row: dict) -> list[claims.Claim]:
    """The claims with advice a row's measurement names."""
    return [c for c in ADVISED if re.search(rf"\b{re.escape(c.id)}\b", row[claims.DECISION_COLUMNS[0]])]


def places(text: str, lesson: str) -> list[tuple[str, str, str]]:
    """``(lesson, kind, name)`` for each section, parameter and policy a "where" cell names, in order: a lesson number
    (``05``, ``notebook 05``) switches to that lesson; ``§N`` a section, an upper-case name a parameter, ``POLICIES['x']``
    a policy, a back-quoted lower-case name a policy where the lesson is one of the caching lessons (05, 06)."""
    out, cur = [], lesson
    token = re.compile(r"(?:notebook )?\b(0\d)\b(?![.\d%])|§(\d+)|POLICIES\['(\w+)'\]|`([a-z][a-z0-9_:]*)`|`?\b([A-Z][A-Z0-9_]{2,})\b`?")
    for m in token.finditer(text):
        nb, sec, pol, tick, par = m.groups()
        if nb:
            cur = nb
        elif sec:
            out.append((cur, "section", sec))
        elif pol or (tick and cur in ("05", "06")):
            out.append((cur, "policy", pol or tick))
        elif par and par not in claims.REGISTRY:
            out.append((cur, "parameter", par))
    return out


def missing(lesson: str, kind: str, name: str) -> str | None:
    """Why ``lesson`` lacks the place, or None when it has it (or the section is awaited)."""
    if lesson not in SOURCES:
        return f"no lesson {lesson}"
    if kind == "section" and int(name) not in sections(lesson) and (lesson, int(name)) not in AWAITED:
        return f"{lesson} has no section §{name} (its sections: {sorted(sections(lesson))})"
    if kind == "parameter" and name not in params(lesson):
        return f"{lesson} has no parameter {name} (its parameters: {', '.join(sorted(params(lesson)))})"
    if kind == "policy" and name.split(":")[0] != "kvpress" and name not in POLICY_NAMES:
        return f"no policy {name!r} (kv.POLICIES, reuse.REUSE_POLICIES)"
    return None


def _stale(nb: Path):
    reason = STALE.get(nb.stem)
    return pytest.param(nb, id=nb.stem, marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else [])


@pytest.mark.parametrize("claim", ADVISED, ids=lambda c: c.id)
def test_each_claims_advice_points_where_its_lesson_has_it(claim):
    bad = []
    for p in claim.advice.where:
        named = [(p.lesson, "section", str(p.section))] * bool(p.section)
        named += [(p.lesson, "parameter", x) for x in p.params] + [(p.lesson, "policy", x) for x in p.policies]
        bad += [why for why in (missing(*n) for n in named) if why]
    for lesson, sec in re.findall(r"\b(0\d) §(\d+)", claim.advice.act):  # "05 §2" in the advice's own words
        bad += [why for why in [missing(lesson, "section", sec)] if why]
    assert not bad, f"{claim.id}'s advice (unicache_lib/claims.py): " + "; ".join(bad)


def test_awaited_sections_are_still_awaited():
    landed = [f"{lesson} §{n}" for lesson, n in AWAITED if n in sections(lesson)]
    assert not landed, f"{', '.join(landed)} now exist: delete them from AWAITED in tests/test_advice.py"


@pytest.mark.parametrize("nb", [_stale(nb) for nb in NOTEBOOKS])
def test_a_row_about_a_claim_is_the_claims_advice(nb):
    bad = []
    for row in decision_rows(nb):
        cs = about(row)
        if not cs:
            continue
        says, at = row[ADVICE], row.get(WHERE)
        if not any(says.startswith(c.advice.act) and at in (None, claims.where(c.id, nb.stem)) for c in cs):
            c = cs[0]
            bad.append(f"row {row[claims.DECISION_COLUMNS[0]]!r}:\n  says   {says!r} at {at!r}\n  advice "
                       f"{c.advice.act!r} at {claims.where(c.id, nb.stem)!r}")
    assert not bad, (f"{nb.stem}: rows about a claim that are not made from its advice (claims.decision_rows):\n"
                     + "\n".join(bad))


def test_two_lessons_rows_for_one_claim_agree():
    said: dict[str, dict[str, str]] = {}
    for nb in NOTEBOOKS:
        if nb.stem in STALE:
            continue
        for row in decision_rows(nb):
            for c in about(row)[:1]:
                text = row[ADVICE]
                said.setdefault(c.id, {})[nb.stem] = text[:len(c.advice.act)] if text.startswith(c.advice.act) else text
    differ = {cid: by for cid, by in said.items() if len(set(by.values())) > 1}
    assert not differ, "one claim, different advice:\n" + "\n".join(
        f"{cid}:\n" + "\n".join(f"  {nb}: {text!r}" for nb, text in by.items()) for cid, by in differ.items())
    assert {"00_primer", "02_understanding_maps"} <= {nb for by in said.values() for nb in by}  # the parse finds them


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_row_points_where_the_lesson_has_it(nb):
    bad = []
    for row in decision_rows(nb):
        named = places(row.get(WHERE, ""), nb.stem[:2])
        named += [(lesson, "section", sec) for lesson, sec in re.findall(r"\b(0\d) §(\d+)", row[ADVICE])]
        bad += [f"row {row[claims.DECISION_COLUMNS[0]]!r}: {why}" for why in (missing(*n) for n in named) if why]
    assert not bad, f"{nb.stem}'s decision table points where no lesson has it:\n" + "\n".join(bad)


def test_the_parse_reads_places():
    assert places("05 §3 (`key_coverage`), `BUDGETS`", "08") == [
        ("05", "section", "3"), ("05", "policy", "key_coverage"), ("05", "parameter", "BUDGETS")]
    assert places("MEMORY_BUDGET_GB, 02: LAYERS", "01") == [("01", "parameter", "MEMORY_BUDGET_GB"), ("02", "parameter", "LAYERS")]
    assert places("§2, notebook 02 (Gini, anchors)", "05") == [("05", "section", "2")]
    assert places("§3 (controls), POLICIES['pooling']", "05") == [("05", "section", "3"), ("05", "policy", "pooling")]
    assert missing("05", "section", "99") and missing("05", "parameter", "NOPE") and missing("05", "policy", "nope")
    assert claims.Place("05", 3, ("key_coverage",), params=("BUDGETS",)).text("08") == "05 §3 (`key_coverage`), `BUDGETS`"
    assert claims.Place("05", 5).text("05_kv_eviction") == "§5" and claims.Place("05", params=("BUDGETS",)).text() == "05: `BUDGETS`"


def test_a_row_names_its_claim_and_a_verdict_reads_forwards():
    with pytest.raises(claims.InputError, match="names it in its measurement"):
        claims.decision_rows([("U4", "a sink column", "0.8")])
    row = claims.decision_rows([("M1", "fp16 bias (M1)", "3e-05", "measured here")], "01_capture", {"M1": "does not hold"})[0]
    assert row[ADVICE] == (claims.REGISTRY["M1"].advice.act + ". Here: does not hold — no fp16 bias: fp16 arithmetic is "
                           "safe for these statistics (measured here)")
    assert row[WHERE] == "§7, `DTYPE`, exercise 3"
    assert claims.read("M1", "does not hold") == "does not hold — no fp16 bias: fp16 arithmetic is safe for these statistics"
    assert claims.read("M2", "holds") == "holds"  # no meaning written: the verdict alone
    with pytest.raises(claims.InputError, match="a meaning is for"):
        claims.Claim("X1", "s", "w", "01_capture", "r", {"": {"above": 0}}, meaning={"maybe": "?"})
