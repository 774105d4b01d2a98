"""One home per measurement (#46): a notebook number named in prose exists, and where a sentence sends the reader to a
notebook for one of the measurements below, it names the notebook that measures it."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.name[:2]: p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}

HOMES = {  # a measurement -> the lesson that measures it (every other lesson refers to it)
    "neglect detector": "07",
    "U12": "07",
    "text_side": "06",
    "MagCache": "06",
    "key_coverage": "05",
    "DivPrune": "05",
    "knee": "03",
    "single-0": "02",
}
REF = re.compile(r"(?:\bnotebooks? |\blessons? |\]\(|\b)(0\d)(?=_[a-z]|'s\b|: |\b(?! ?[%×x]))")
SENTENCE = r"(?<=[.!?])\s+|\n\n|\n(?=\|)"  # sentences, paragraphs and table rows
NEAR = 80  # characters between a measurement's name and the notebook number that sends the reader on
NAMED = re.compile(r"\b(?:notebook|lesson) (\d\d)\b")


def prose() -> list[tuple[str, str]]:
    """(where, sentence) for the prose of every notebook source's markdown, README.md and docs/*.md."""
    out = []
    for src in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")):
        md = "\n".join(line[2:] for line in src.read_text().splitlines() if line.startswith("# ") and "%%" not in line)
        out += [(src.name, s) for s in re.split(SENTENCE, md)]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out += [(doc.name, s) for s in re.split(SENTENCE, doc.read_text())]
    return [(w, re.sub(r"<!--.*?-->", "", s)) for w, s in out]


def test_every_named_notebook_exists():
    missing = [(w, n) for w, s in prose() for n in NAMED.findall(s) if n not in NOTEBOOKS and int(n) < 20]
    assert missing == [], f"prose names notebooks that do not exist: {missing}"


def misrouted(topic: str, sentences) -> list[str]:
    """Sentences outside the topic's home that send the reader to another notebook for it (a notebook number within
    NEAR characters of the topic's name, and not the home's)."""
    home, wrong = HOMES[topic], []
    for where, s in sentences:
        if topic not in s or where.startswith(home):
            continue
        refs = {m.group(1) for t in re.finditer(re.escape(topic), s)
                for m in REF.finditer(s, max(0, t.start() - NEAR), t.end() + NEAR) if m.group(1) in NOTEBOOKS}
        if refs and home not in refs:
            wrong.append(f"{where}: {s.strip()[:160]!r} names {sorted(refs)}, not {home}")
    return wrong


def test_the_check_catches_a_misrouted_reference():
    """The slip the course once had (02 sent readers to 06 for the neglect detector and U12, which 07 measures)."""
    slip = [("02_understanding_maps.py", "Notebook 06 turns this into the neglect detector (U12).")]
    assert len(misrouted("neglect detector", slip)) == 1 and len(misrouted("U12", slip)) == 1
    assert misrouted("neglect detector", [("02_understanding_maps.py", "Notebook 07 runs the neglect detector.")]) == []


@pytest.mark.parametrize("topic", sorted(HOMES))
def test_a_measurement_is_referred_to_its_home(topic):
    wrong = misrouted(topic, prose())
    assert wrong == [], "\n".join(wrong)
