"""What configuration cannot do for the course site (book/conf.py): every picture gets an alt text.

A notebook figure takes its alt text from its cell's metadata where the cell has it (myst-nb reads
``mystnb: {image: {alt: ...}}`` and ``mystnb: {figure: {caption: ...}}`` itself); otherwise from the prose just before
it: the lessons put the sentence that says what the picture shows right before the picture's cell. A picture in a
page's markdown without one gets its file name. A screen reader then reads the lesson's words, never the image's
address or "No description has been provided for this image"."""
from __future__ import annotations

import re

from docutils import nodes

ALT_CHARS = 300


def _plain(text: str) -> str:
    return " ".join(text.split())


def _short(text: str) -> str:
    text = _plain(text)
    if len(text) <= ALT_CHARS:
        return text
    cut = text[:ALT_CHARS].rsplit(" ", 1)[0]
    return cut + " …"


def _in_cell(node) -> bool:
    while node is not None:
        if isinstance(node, nodes.container) and node.get("nb_element", "").startswith("cell_code"):
            return True
        node = node.parent
    return False


def give_alt_text(app, doctree) -> None:
    """Every image node without an alt text gets one: the last paragraph before it outside code cells, or its
    file name."""
    last = ""
    for node in doctree.findall(lambda n: isinstance(n, (nodes.paragraph, nodes.image))):
        if isinstance(node, nodes.paragraph):
            if not _in_cell(node):
                last = node.astext()
            continue
        if node.get("alt"):
            continue
        if _in_cell(node) and last:
            node["alt"] = "Figure: " + _short(last)
        else:
            name = re.sub(r"[_-]+", " ", node.get("uri", "").rsplit("/", 1)[-1].rsplit(".", 1)[0])
            node["alt"] = _short(name) or "figure"


def setup(app):
    app.connect("doctree-read", give_alt_text)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
