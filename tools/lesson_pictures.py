"""Each lesson opens on its picture: the first figure the lesson draws, copied from the committed, executed notebook
into ``docs/figures/<lesson>.png``, which the lesson's first cell shows under "What you will learn".

    python tools/lesson_pictures.py                       # every lesson
    python tools/lesson_pictures.py notebooks/05_kv_eviction.ipynb

Each lesson's record (``first_figure`` in its source's header, :mod:`unicache_lib.lessons`) names its first figure
(the name ``plots.save`` writes it under; two names where the lesson draws one per generator, the first shown). The picture is taken from the output of the cell that saves it, so
it is the run's own figure and cannot drift from it: ``make notebooks`` runs this after each execution, and
``tests/test_notebook_sources.py`` checks every ``docs/figures`` file equals its notebook's output and that cell 0
shows it.
"""
from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"

def first_figure(notebook: Path) -> tuple:
    """(the names the lesson's first figure is saved under, what it must show to teach): the lesson's record, in the
    header of its source beside the notebook (``src/<lesson>.py``; unicache_lib/lessons.py)."""
    from unicache_lib import lessons

    lesson = lessons.read(Path(notebook).parent / "src" / f"{Path(notebook).stem}.py")
    return lesson.first_figure, lesson.figure_kind


SAVE = re.compile(r"plots\.save\(\s*\w+\s*,\s*[^,]+,\s*(f?)\"([^\"]+)\"")


def _saves(source: str, name: str) -> bool:
    """Whether a cell's ``plots.save`` call writes ``name`` (an f-string's ``{...}`` matches any text)."""
    for f, pattern in SAVE.findall(source):
        rx = re.escape(pattern) if not f else ".+".join(map(re.escape, re.split(r"\{[^}]*\}", pattern)))
        if re.fullmatch(rx, name):
            return True
    return False


def picture(notebook: Path) -> bytes:
    """The PNG bytes of the lesson's first figure, from the output of the cell that saves it."""
    name = first_figure(notebook)[0][0]
    for cell in json.loads(Path(notebook).read_text())["cells"]:
        if cell["cell_type"] == "code" and _saves("".join(cell["source"]), name):
            for o in cell.get("outputs", []):
                png = o.get("data", {}).get("image/png")
                if png:
                    return base64.b64decode("".join(png) if isinstance(png, list) else png)
            raise SystemExit(f"{notebook}: the cell that saves {name!r} has no figure output (not executed?)")
    raise SystemExit(f"{notebook}: no cell saves {name!r} (the lesson's record, first_figure, names it)")


def link(lesson: str) -> str:
    """The markdown image line cell 0 ends with."""
    return f"![This lesson's first figure, from its last run](../docs/figures/{lesson}.png)"


def write(notebook: Path, out: Path = OUT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{Path(notebook).stem}.png"
    data = picture(notebook)
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def main(argv: list[str]) -> int:
    from unicache_lib import lessons

    books = [Path(a) for a in argv] or [lesson.notebook for lesson in lessons.discover(ROOT).values()]
    for nb in books:
        print("wrote", write(nb).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
