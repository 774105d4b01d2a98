"""README.md is an onboarding page and the docs/ pages hold the reference: README stays short and says what a new
reader needs, and every link between README.md and docs/ (a file, a folder or a #heading) resolves."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 250


def anchor(heading: str) -> str:
    """GitHub's heading anchor: markdown marks dropped, lower case, punctuation other than hyphens and underscores
    dropped, spaces -> '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # a '#' in a code block is no heading
    out, seen = set(), {}
    for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        a = anchor(h)
        n = seen.get(a, 0)
        out.add(a if n == 0 else f"{a}-{n}")  # GitHub numbers repeated headings
        seen[a] = n + 1
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto: are not checked


def test_anchor_rule():
    assert anchor("What `make benchmark` measures") == "what-make-benchmark-measures"
    assert anchor("Your own model: families, device, dtype, masks") == "your-own-model-families-device-dtype-masks"
    assert anchor("01 · Capturing attention") == "01--capturing-attention"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if t.startswith("docs/")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages README.md does not link: {unlinked}"


def test_every_docs_page_links_back_to_the_readme():
    missing = [p.name for p in PAGES[1:] if p.name != "GLOSSARY.md" and "](../README.md)" not in p.read_text()]
    assert not missing, f"docs pages without a link back to README.md: {missing}"


def test_the_readme_onboards():
    text = (ROOT / "README.md").read_text()
    n = text.count("\n")
    assert n <= README_MAX_LINES, f"README.md has {n} lines; reference material belongs in docs/ (at most {README_MAX_LINES})"
    flat = re.sub(r"\s+", " ", text)
    for must in ("Who it is for", "inference-optimisation", "interpretability", "The study it implements",
                 "UniCache 1/3", "solutions/", "recap", "exercises", "The lesson path", "make run", "make test",
                 "Where to go next"):
        assert must.lower() in flat.lower(), f"README.md does not say {must!r}"
    # the lesson path: one row per notebook, with a generated reading and run time
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        row = next((line for line in text.splitlines() if f"(notebooks/{nb.name})" in line), None)
        assert row, f"no lesson-path row for {nb.name}"
        assert f"@read_minutes:{nb.stem}" in row and f"data/results/{nb.stem}.run.json" in row, row


def test_no_page_says_make_lab_serves_only_the_notebooks_folder():
    """`make lab` serves the repository root and opens on notebooks/ (Makefile LAB_FLAGS)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "--ServerApp.root_dir=." in makefile and "--LabApp.default_url=/lab/tree/notebooks" in makefile
    bad = [(p.name, m) for p in PAGES for m in re.findall(r"make lab[^\n.]*?\bon `?notebooks/`?(?! directly)",
                                                            re.sub(r"\s+", " ", p.read_text()))
           if "opening on" not in m and "opens on" not in m]
    assert not bad, f"pages that say `make lab` serves notebooks/ only: {bad}"
