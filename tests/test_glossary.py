"""docs/GLOSSARY.md: every `GLOSSARY.md#anchor` link in the notebooks' sources, the solutions, the README and
the docs points at a `## term` heading of the glossary (GitHub's anchors: lower case, spaces as hyphens,
punctuation dropped), and the terms the notebooks rely on are there."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "GLOSSARY.md"
LINK = re.compile(r"GLOSSARY\.md#([A-Za-z0-9_-]+)")


def anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation other than hyphens and underscores dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors() -> set[str]:
    return {anchor(m) for m in re.findall(r"^## (.+)$", GLOSSARY.read_text(), re.M)}


def jupyter_anchor(heading: str) -> str:
    """JupyterLab's (and nbconvert's) heading id: the text with spaces as hyphens, case and punctuation kept."""
    return heading.strip().replace(" ", "-")


def test_anchor_rule():
    assert anchor("PSNR and SSIM") == "psnr-and-ssim" and anchor("Top-10% share") == "top-10-share"
    assert anchor("KV cache") == "kv-cache"
    assert jupyter_anchor("KV cache") == "KV-cache" != anchor("KV cache")  # why the headings are lower case


def test_glossary_anchors_are_the_same_on_github_and_in_jupyterlab():
    """A link `GLOSSARY.md#kv-cache` opened in JupyterLab scrolls to the heading whose id is exactly `kv-cache`:
    a heading `KV cache` would get `KV-cache` there and the link would open the page at its top."""
    bad = [h for h in re.findall(r"^## (.+)$", GLOSSARY.read_text(), re.M) if jupyter_anchor(h) != anchor(h)]
    assert not bad, f"glossary headings whose JupyterLab anchor differs from GitHub's (write them in lower case, " \
                    f"letters, digits, spaces and hyphens only): {bad}"


def test_notebooks_link_into_markdown_pages_only_where_jupyterlab_can_follow():
    """Outside the glossary, a notebook's link into a .md page carries no #fragment (README and docs headings are
    capitalised: their GitHub anchor does not exist in JupyterLab)."""
    bad = [(f.name, m) for f in ROOT.glob("notebooks/src/*.py")
           for m in re.findall(r"\]\(([^)\s]*\.md#[^)\s]*)\)", f.read_text()) if "GLOSSARY.md#" not in m]
    assert not bad, f"links with a fragment into a markdown page other than the glossary: {bad}"


def test_every_glossary_link_resolves():
    have = anchors()
    files = [*ROOT.glob("notebooks/src/*.py"), *ROOT.glob("solutions/*.py"), ROOT / "README.md",
             *(p for p in ROOT.glob("docs/*.md") if p != GLOSSARY)]
    broken = [(f.relative_to(ROOT).as_posix(), a) for f in files for a in LINK.findall(f.read_text()) if a not in have]
    broken += [("docs/GLOSSARY.md", a) for a in re.findall(r"\]\(#([\w-]+)\)", GLOSSARY.read_text()) if a not in have]
    assert not broken, f"links to glossary anchors that do not exist (add a `## term` heading or fix the link): {broken}"


def test_the_terms_the_notebooks_rely_on_are_defined():
    need = {"jaccard", "anchors", "sink", "gini", "depth-bands", "knee", "phase", "redundancy", "cfg", "psnr-and-ssim",
            "h2o", "snapkv", "fastv", "kvpress-presses", "streamingllm", "normalised-entropy", "read-frequency", "selectivity",
            "cross-modal-share", "head-roles", "kv-cache", "eviction", "reuse", "stand-in", "interval",
            "inconclusive", "modality-blocks", "image-share", "streamingllm", "divprune", "oracle", "pareto", "kl"}
    assert need <= anchors(), f"missing from docs/GLOSSARY.md: {sorted(need - anchors())}"
    text = re.sub(r"\s+", " ", GLOSSARY.read_text())  # phrases may wrap across lines
    assert "100 dB" in text and "shallow band is one layer" in text
    assert "text→image share of all attention" in text and "image share of text queries' reads" in text
    assert "docs/GLOSSARY.md" in (ROOT / "README.md").read_text()


# Terms of art the lessons use, as they are written in the notebooks' prose -> their glossary anchor. A lesson that
# uses one needs its entry; the test names every missing one (add a `## term` heading, lower case, to docs/GLOSSARY.md).
TERMS = {"eager": "eager", "observation window": "observation-window", "teacher-forced": "teacher-forced",
         "binding": "binding", "diffusers cache": "diffusers-caches", "FirstBlockCache": "diffusers-caches",
         "MagCache": "diffusers-caches", "sink": "sink", "anchor": "anchors", "Gini": "gini", "knee": "knee",
         "CFG": "cfg", "PSNR": "psnr-and-ssim", "H2O": "h2o", "SnapKV": "snapkv", "FastV": "fastv", "DivPrune": "divprune",
         "StreamingLLM": "streamingllm", "kvpress": "kvpress-presses", "oracle": "oracle", "Pareto": "pareto",
         "KL": "kl", "AUROC": "auroc", "stand-in": "stand-in", "depth band": "depth-bands", "modality block": "modality-blocks",
         "cross-modal share": "cross-modal-share", "selectivity": "selectivity", "lag-1": "lag-1-correlation",
         "Jaccard": "jaccard", "KV cache": "kv-cache", "normalised entropy": "normalised-entropy"}


def _uses(text: str, term: str) -> bool:
    return re.search(r"\b" + re.escape(term), text) is not None


def test_every_term_a_lesson_uses_is_in_the_glossary():
    sources = {p.stem: p.read_text() for p in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))}
    have = anchors()
    missing = [(t, a, [n for n, s in sources.items() if _uses(s, t)]) for t, a in TERMS.items() if a not in have]
    missing = [(t, a, used) for t, a, used in missing if used]
    assert not missing, "terms the notebooks use with no glossary entry: " + ", ".join(
        f"{t!r} (used in {', '.join(used)}; add '## {a.replace('-', ' ')}')" for t, a, used in missing)
    assert have >= {"eager", "observation-window", "teacher-forced", "binding", "diffusers-caches"}
