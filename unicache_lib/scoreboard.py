"""The claims scoreboard that closes every analysis notebook; verdicts are decided on intervals.

A notebook fixes each claim's rule *before* it measures (``board.rule``): a threshold, which side of
it the claim needs, and in words which 95% interval decides. It then records the measurement
(``board.measure``): the value, its interval (:mod:`unicache_lib.intervals`), n and the unit the
interval is over. The verdict is computed, never typed in:

- **holds**: the whole interval clears the threshold;
- **does not hold**: the whole interval lies on the other side;
- **inconclusive**: the interval straddles the threshold; the note gives a rough n that would settle
  it (see :func:`unicache_lib.intervals.n_to_settle`);
- **partly**: only for a rule of two or more criteria, each decided on its own interval, where some
  hold and the others do not (any inconclusive criterion makes the row inconclusive);
- **not measurable here**: no value (the note says why);
- **not meaningful (random weights)**: every row of a board built for a random-weight stand-in model
  (``Scoreboard(random_weights=True)``); values and intervals are still shown.

Claim texts paraphrase the study's write-ups; each claim, with its rule, is one entry of :mod:`unicache_lib.claims`.
"""
import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .claims import CLAIMS, read
from .core.untrusted import html_text
from .core.errors import ContractError, InputError, UnknownNameError
from .intervals import Interval, n_to_settle
from .tables import wrap
from .store import _atomic_write_bytes

HOLDS, NOT, INCONCLUSIVE, PARTLY = "holds", "does not hold", "inconclusive", "partly"
NOT_MEASURABLE, RANDOM_WEIGHTS = "not measurable here", "not meaningful (random weights)"
VERDICTS = (HOLDS, PARTLY, NOT, INCONCLUSIVE, NOT_MEASURABLE, RANDOM_WEIGHTS)
UNSTABLE = "unstable across sample sets"


def _nan_none(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


@dataclass(frozen=True)
class Criterion:
    """One threshold test on one interval: the claim needs the value ``above`` a threshold, ``below``
    it, ``between`` two bounds or ``outside`` them (exactly one of the four)."""

    above: float | None = None
    below: float | None = None
    between: tuple[float, float] | None = None
    outside: tuple[float, float] | None = None

    def __post_init__(self):
        if sum(x is not None for x in (self.above, self.below, self.between, self.outside)) != 1:
            raise InputError("a criterion needs exactly one of above=, below=, between=(lo, hi), outside=(lo, hi)")
        if (band := self.between or self.outside) is not None and not band[0] < band[1]:
            raise InputError(f"a band (lo, hi) needs lo < hi, got {band}")

    def decide(self, lo: float, hi: float) -> str:
        """HOLDS when the whole interval ``[lo, hi]`` is on the claim's side, NOT when it is wholly on the other."""
        if self.above is not None:
            holds, fails = lo > self.above, hi <= self.above
        elif self.below is not None:
            holds, fails = hi < self.below, lo >= self.below
        else:
            a, b = self.between or self.outside
            inside, beyond = a <= lo and hi <= b, hi < a or lo > b
            holds, fails = (inside, beyond) if self.between is not None else (beyond, inside)
        return HOLDS if holds else NOT if fails else INCONCLUSIVE

    def nearest_threshold(self, value: float) -> float:
        band = self.between or self.outside
        return min(band, key=lambda t: abs(value - t)) if band is not None else \
            self.above if self.above is not None else self.below

    def __str__(self) -> str:
        if self.above is not None:
            return f"> {self.above:g}"
        if self.below is not None:
            return f"< {self.below:g}"
        a, b = self.between or self.outside
        return f"{'in' if self.between else 'outside'} [{a:g}, {b:g}]"


@dataclass
class Measurement:
    value: float | None
    lo: float = math.nan
    hi: float = math.nan
    n: int | None = None
    unit: str = ""
    se: float = math.nan

    def interval(self) -> Interval:
        return Interval(self.value, self.lo, self.hi, self.n or 0, self.unit, self.se)


@dataclass
class Row:
    claim: str
    rule_text: str
    criteria: dict[str, Criterion]
    measured: dict[str, Measurement] = field(default_factory=dict)
    shown: str = ""
    note: str = ""
    random_weights: bool = False
    unstable: bool = False

    def _criterion_verdicts(self) -> dict[str, str]:
        return {k: c.decide(self.measured[k].lo, self.measured[k].hi) for k, c in self.criteria.items()}

    @property
    def complete(self) -> bool:
        return set(self.measured) == set(self.criteria) or self.not_measurable

    @property
    def not_measurable(self) -> bool:
        return any(_nan_none(m.value) is None for m in self.measured.values())

    @property
    def verdict(self) -> str:
        if self.not_measurable or not self.measured:
            return NOT_MEASURABLE
        if self.random_weights:
            return RANDOM_WEIGHTS
        vs = set(self._criterion_verdicts().values())  # holds / does not hold for every criterion, else partly
        return INCONCLUSIVE if INCONCLUSIVE in vs else vs.pop() if len(vs) == 1 else PARTLY

    def settle_note(self) -> str:
        """For an inconclusive row: per undecided criterion, the rough n that would settle it."""
        parts = []
        for k in [k for k, v in self._criterion_verdicts().items() if v == INCONCLUSIVE]:
            m, c = self.measured[k], self.criteria[k]
            need = n_to_settle(m.interval(), c.nearest_threshold(m.value))
            parts.append(f"{f'({k}) ' if len(self.criteria) > 1 else ''}interval straddles "
                         f"{c.nearest_threshold(m.value):g}: "
                         + (f"about {need:,.0f} {m.unit} would settle it" if math.isfinite(need) and need <= 100 * max(1, m.n or 1)
                            else "the value sits on the threshold: no practical n settles it"))
        return "; ".join(parts)

    def full_note(self) -> str:
        return "; ".join(filter(None, (self.note, self.settle_note() if self.verdict == INCONCLUSIVE else "",
                                       UNSTABLE if self.unstable else "")))


def _fmt(x) -> str:
    return "-" if _nan_none(x) is None else f"{x:.4g}"


def _cells(ms: list[tuple[str, Measurement | None]]) -> dict:
    """The value, interval, n and unit cells of one row from its criteria's measurements, in rule order."""
    tag = (lambda k: f"({k}) ") if len(ms) > 1 else (lambda k: "")
    value = "; ".join(f"{tag(k)}{_fmt(m.value if m else None)}" for k, m in ms)
    interval = "; ".join(f"{tag(k)}[{_fmt(m.lo)}, {_fmt(m.hi)}]" if m and m.value is not None else f"{tag(k)}-" for k, m in ms)
    ns = {m.n for _, m in ms if m and m.n is not None}
    units = {m.unit for _, m in ms if m and m.unit}
    if len(ns) <= 1 and len(units) <= 1:
        return {"value": value, "interval (95%)": interval, "n": str(ns.pop()) if ns else "-",
                "unit": units.pop() if units else ""}
    # criteria counted in different units: each count beside its own unit, "(a) 20 timing rounds; (b) 1600 prompts"
    n = "; ".join(f"{tag(k)}{m.n} {m.unit or ''}".rstrip() for k, m in ms if m and m.n is not None) or "-"
    return {"value": value, "interval (95%)": interval, "n": n, "unit": ""}


class Scoreboard:
    """Rules first, then measurements, then ``table()`` (a pandas DataFrame) or ``show()``.

    ``random_weights``: the model is a random-weight stand-in; every verdict reads
    "not meaningful (random weights)". ``unstable``: claim ids whose verdict differed across sample
    sets in the committed replication table (:func:`unicache_lib.replicate.unstable_claims`).
    """

    def __init__(self, random_weights: bool = False, unstable=()):
        self.rows: dict[str, Row] = {}
        self.random_weights, self.unstable = bool(random_weights), set(unstable)

    def rule(self, claim: str, text: str, above: float | None = None, below: float | None = None,
             between: tuple[float, float] | None = None, outside: tuple[float, float] | None = None,
             criteria: dict[str, dict] | None = None) -> None:
        """Fix the verdict rule of ``claim`` before measuring it. One criterion: ``above=`` / ``below=`` /
        ``between=`` / ``outside=``. Several (each decided on its own interval):
        ``criteria={"a": {"above": 0.8}, "b": {"below": 0.6}}``. ``text`` says what is measured, over
        which unit the interval runs and the threshold(s)."""
        if claim not in CLAIMS:
            raise UnknownNameError(f"unknown claim id {claim!r}; known: {', '.join(CLAIMS)}")
        if claim in self.rows and self.rows[claim].measured:
            raise ContractError(f"the rule for {claim} must be written before its measurement")
        if criteria is not None:
            if any(x is not None for x in (above, below, between, outside)):
                raise InputError("pass either criteria={...} or one of above= / below= / between=, not both")
            if len(criteria) < 2:
                raise InputError("criteria={...} is for two or more criteria; use above= / below= / between= for one")
            crit = {k: Criterion(**v) for k, v in criteria.items()}
        else:
            crit = {"": Criterion(above, below, between, outside)}
        self.rows[claim] = Row(claim, text, crit, random_weights=self.random_weights, unstable=claim in self.unstable)

    def declare(self, rules: dict[str, tuple[str, dict]], **fmt) -> None:
        """Write a lesson's rules as data (``claim -> (text, {criterion: {"above": x} ...})``, one criterion named
        ``""``), before any measurement; ``fmt`` fills ``{name}`` fields of the texts (e.g. a notebook parameter)."""
        for claim, (text, criteria) in rules.items():
            self.rule(claim, text.format(**fmt) if fmt else text,
                      **(criteria[""] if list(criteria) == [""] else {"criteria": criteria}))

    def measure(self, claim: str, value: float | Interval | None, interval: tuple[float, float] | None = None,
                n: int | None = None, unit: str | None = None, criterion: str | None = None, shown: str = "",
                note: str = "") -> None:
        """Record one criterion's measurement: an :class:`~unicache_lib.intervals.Interval`, or ``value``
        with ``interval=(lo, hi)``, ``n`` and ``unit``. ``value=None`` (with a ``note`` saying why) marks
        the claim "not measurable here". ``shown``: the measured numbers in words for the table."""
        if claim not in self.rows:
            raise UnknownNameError(f"write the verdict rule for {claim} (board.rule) before measuring it")
        r = self.rows[claim]
        key = "" if criterion is None else criterion
        if key not in r.criteria and value is not None:
            raise UnknownNameError(f"{claim}'s rule has criteria {list(r.criteria)}; pass criterion= one of them")
        if value is None:
            if not note:
                raise InputError(f"{claim}: say in note= why it is not measurable here")
            r.measured[key if key in r.criteria else next(iter(r.criteria))] = Measurement(None)
        else:
            if isinstance(value, Interval):
                m = Measurement(value.value, value.lo, value.hi, value.n, value.unit, value.se)
            else:
                if interval is None or n is None or not unit:
                    raise InputError(f"{claim}: a measurement needs interval=(lo, hi), n and unit (or an Interval)")
                m = Measurement(float(value), float(interval[0]), float(interval[1]), int(n), unit)
            if not (m.lo <= m.value <= m.hi):
                raise InputError(f"{claim}: value {m.value} lies outside its interval [{m.lo}, {m.hi}]")
            r.measured[key] = m
        r.shown = "; ".join(filter(None, (r.shown, shown)))
        r.note = "; ".join(filter(None, (r.note, note)))

    def _check_complete(self):
        if (missing := [c for c, r in self.rows.items() if not r.complete]):
            raise ContractError(f"claims with a rule but no (complete) measurement: {missing}")

    def table(self):
        """One row per claim: statement, measured, value, interval, n, unit, rule, verdict, note."""
        self._check_complete()
        rows = [{"claim": r.claim, "statement": CLAIMS[r.claim], "measured": r.shown,
                 **_cells([(k, r.measured.get(k)) for k in r.criteria]), "rule": r.rule_text, "verdict": r.verdict,
                 "note": r.full_note()} for r in self.rows.values()]
        return pd.DataFrame(rows).set_index("claim")

    def show(self):
        """Display :meth:`view`, nothing truncated (notebooks: the last line of the scoreboard cell); its plain text
        is what a committed notebook shows without HTML, and what nbval compares."""
        from IPython.display import display  # local: optional (Jupyter only); tests patch IPython.display.display

        display(self.view())

    def view(self) -> "ScoreboardView":
        """The board as a notebook shows it (:class:`ScoreboardView`): one line per claim (``repr``), the details
        folded away in the HTML."""
        table = self.table()
        parts, criteria = {}, {}
        for c, r in self.rows.items():
            ms = [(k, r.measured.get(k)) for k in r.criteria]
            tag = (lambda k: f"({k}) ") if len(ms) > 1 else (lambda k: "")
            if not r.not_measurable:
                each = len({(m.n, m.unit) for _, m in ms}) > 1  # criteria counted apart: each its own count
                parts[c] = [f"{tag(k)}{_fmt(m.value)} [{_fmt(m.lo)}, {_fmt(m.hi)}]"
                            + (f" (n = {m.n} {m.unit})".rstrip() if each and m.n is not None else "") for k, m in ms]
            criteria[c] = [f"{tag(k)}{crit}" + (f": {crit.decide(m.lo, m.hi)}" if m is not None and m.value is not None else "")
                           for (k, m), crit in zip(ms, r.criteria.values())]
        return ScoreboardView(table, parts, criteria)

    def save(self, path) -> None:
        """Write the rows as JSON (atomically) for tests, the report and the replication table.
        Top-level ``value`` / ``lo`` / ``hi`` / ``n`` / ``unit`` are the (first) criterion's; every
        criterion is listed under ``criteria``."""
        self._check_complete()
        out = []
        for r in self.rows.values():
            first = r.measured.get(next(iter(r.criteria)), Measurement(None))
            crit = [{"name": k, "threshold": str(c), "value": m.value, "lo": _nan_none(m.lo), "hi": _nan_none(m.hi), "n": m.n,
                     "unit": m.unit, "verdict": c.decide(m.lo, m.hi) if m.value is not None else NOT_MEASURABLE}
                    for k, c in r.criteria.items() for m in [r.measured.get(k, Measurement(None))]]
            out.append({"claim": r.claim, "value": first.value, "lo": _nan_none(first.lo), "hi": _nan_none(first.hi),
                        "n": first.n, "unit": first.unit, "shown": r.shown, "rule": r.rule_text, "verdict": r.verdict,
                        "note": r.full_note(), "criteria": crit})
        _atomic_write_bytes(Path(path), json.dumps(out, indent=1).encode())

    def verdicts(self) -> dict[str, str]:
        return {c: r.verdict for c, r in self.rows.items()}

    def criteria_lines(self, *claims: str, fmt: str = ".4g", shown: bool = True) -> str:
        """Each claim as its notebook section measured it: per criterion the value and 95% interval (``fmt``), the
        rule and the decision, then the verdict (with its note and, if ``shown``, what was measured); a line longer
        than 110 characters continues on an indented one (:func:`~unicache_lib.tables.wrap`), the numbers that open
        it stay on its first."""
        lines = []
        for c in claims:
            r = self.rows[c]
            lines += [f"{f'{c} ({k})' if k else c}: {m.value:{fmt}} [{m.lo:{fmt}}, {m.hi:{fmt}}] over {m.n} {m.unit}, "
                      f"needs {crit}: {crit.decide(m.lo, m.hi)}" for k, crit in r.criteria.items()
                      if (m := r.measured.get(k)) is not None and m.value is not None]
            lines.append(f"{c} verdict: {r.verdict}" + (f" ({r.note})" if r.note else "")
                         + (f"; measured: {r.shown}" if shown and r.shown else ""))
        return "\n".join(wrap(line) for line in lines)

    def why_inconclusive(self) -> list[str]:
        """Per inconclusive claim: each undecided criterion's interval, the threshold it straddles, which side the
        point estimate is on and how far from the threshold, then the rough n that would settle it
        (:meth:`Row.settle_note`)."""
        lines = []
        for cid, r in self.rows.items():
            if r.verdict != INCONCLUSIVE:
                continue
            for k, crit in r.criteria.items():
                m = r.measured[k]
                if crit.decide(m.lo, m.hi) != INCONCLUSIVE:
                    continue
                side = "on the claim's side" if crit.decide(m.value, m.value) == HOLDS else "on the other side"
                lines.append(f"{cid} ({k})" * (len(r.criteria) > 1) + cid * (len(r.criteria) == 1)
                             + f": {m.value:.4g} [{m.lo:.4g}, {m.hi:.4g}] over {m.n} {m.unit}, needs {crit}: the point "
                             f"estimate is {side}, {abs(m.value - crit.nearest_threshold(m.value)):.3g} from the threshold")
            lines.append(f"    -> {r.settle_note()}")
        return lines


class ScoreboardView:
    """A scoreboard (:meth:`Scoreboard.view`) as a notebook shows it: one line per claim, the details folded away.

    Plain text (what a committed notebook shows without HTML, and what nbval compares): one line per claim,
    ``id · verdict · value [95% interval] · n = count unit``, ids and verdicts padded so the columns line up; a claim of
    several criteria lists each as ``(a) value [lo, hi]`` (each with its own ``(n = ...)`` where they are counted in
    different units), and one that does not fit in ``width`` characters continues on an indented line, broken between
    criteria (a criterion too long for a line of its own between words; nothing is cut). A claim that is not
    measurable shows no value. The last line says where the details are.

    HTML: a table of the same columns, one row per claim; the claim's statement, what was measured, the rule, each
    criterion's threshold and decision, and the note are folded into a ``<details>`` in the row's last cell. Every
    text from the board is escaped (:func:`~unicache_lib.core.untrusted.html_text`): a claim's note or measurement
    can quote a reader's data.
    """

    def __init__(self, table, parts: dict[str, list[str]], criteria: dict[str, list[str]], width: int = 110):
        # table: Scoreboard.table(), indexed by claim id; parts: claim -> ["(a) 0.91 [0.9, 0.92]", ...], one per
        # criterion, in rule order; criteria: claim -> ["(a) > 0.8: holds", ...]
        self.table, self.parts, self.criteria, self.width = table, parts, criteria, int(width)

    def verdict(self, claim, row) -> str:
        """The verdict as shown (one place, so a suffix added to it shows in the text and the HTML alike): with what it
        means where the claim says (:func:`~unicache_lib.claims.read`: "does not hold — fp16 is safe for these
        statistics"), so a claim whose failure is good news reads forwards."""
        return read(claim, str(row["verdict"]))

    def count(self, row) -> str:
        n, unit = str(row["n"]).strip(), str(row["unit"]).strip()
        return "" if not n or n.startswith("-") else f"{n} {unit}" if unit not in ("", "-") else n

    def __repr__(self) -> str:
        rows = list(self.table.iterrows())
        wid = max((len(str(c)) for c, _ in rows), default=0)
        wverdict = max((len(self.verdict(c, r)) for c, r in rows), default=0)
        def fit(line, indent):  # a criterion too long for a line of its own: broken between words
            return textwrap.wrap(line, self.width, subsequent_indent=indent + "  ", break_long_words=False,
                                 break_on_hyphens=False) if len(line) > self.width else [line]

        lines = []
        for claim, row in rows:
            head = f"{str(claim):<{wid}} · {self.verdict(claim, row):<{wverdict}}"
            parts = list(self.parts.get(claim, []))
            if not parts:
                lines.append(head.rstrip())
                continue
            count = "" if "(n = " in parts[-1] else self.count(row)  # else each criterion carries its own
            pieces = [p + ";" for p in parts[:-1]] + [parts[-1]] + ([f"· n = {count}"] if count else [])
            indent, line = " " * (len(head) + 3), head + " · " + pieces[0]
            for piece in pieces[1:]:
                if len(line) + 1 + len(piece) > self.width:
                    lines += fit(line, indent)
                    line = indent + piece
                else:
                    line += " " + piece
            lines += fit(line, indent)
        return "\n".join(lines + ["(statement, rule, each criterion's decision, notes: the HTML view's details, "
                                  "Scoreboard.criteria_lines)"]) + "\n"

    def _repr_html_(self) -> str:
        td = 'style="text-align:left; vertical-align:top"'
        head = "".join(f"<th {td}>{h}</th>" for h in ("claim", "verdict", "value [95% interval]", "n", "details"))
        body = []
        for claim, row in self.table.iterrows():
            facts = [("claim", row["statement"]), ("measured", row["measured"]), ("rule", row["rule"]),
                     ("criteria", "; ".join(self.criteria.get(claim, []))), ("note", row["note"])]
            details = "".join(f"<dt><b>{k}</b></dt><dd style=\"margin:0 0 0.4em 1em; white-space:pre-wrap\">"
                              f"{html_text(v)}</dd>" for k, v in facts if str(v).strip() not in ("", "-"))
            body.append("<tr>" + "".join(f"<td {td}>{html_text(v)}</td>" for v in (
                claim, self.verdict(claim, row), "; ".join(self.parts.get(claim, [])) or "-", self.count(row) or "-"))
                        + f'<td {td}><details><summary>rule, notes</summary><dl style="margin:0; min-width:24em">'
                        f"{details}</dl></details></td></tr>")
        return f'<table class="unicache-scoreboard"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
