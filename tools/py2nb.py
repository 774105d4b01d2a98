"""Build a notebook from its percent-format source (``notebooks/src/NN_topic.py``).

Cells start with ``# %%`` (code) or ``# %% [markdown]``; ``# %% tags=["parameters"]`` sets tags.
Markdown lines drop their leading ``# ``. Outputs are produced by executing the notebook
(``make notebooks``), never written by hand.

    python tools/py2nb.py notebooks/src/01_capture.py notebooks/01_capture.ipynb
"""
import json
import re
import sys

import nbformat


def convert(src: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells, cur, kind, tags = [], [], None, []

    def flush():
        if kind is None:
            return
        text = "\n".join(cur).strip("\n")
        if kind == "markdown":
            text = "\n".join(re.sub(r"^# ?", "", line) for line in text.splitlines())
            c = nbformat.v4.new_markdown_cell(text)
        else:
            c = nbformat.v4.new_code_cell(text)
        if tags:
            c.metadata["tags"] = tags
        cells.append(c)

    for line in src.splitlines():
        m = re.match(r"^# %%(.*)$", line)
        if m:
            flush()
            rest = m.group(1).strip()
            kind = "markdown" if rest.startswith("[markdown]") else "code"
            t = re.search(r"tags=(\[.*\])", rest)
            tags = json.loads(t.group(1)) if t else []
            cur = []
        elif kind is not None:
            cur.append(line)
    flush()
    for i, c in enumerate(cells):
        c.id = f"cell-{i:03d}"  # stable ids: rebuilding a notebook does not churn its JSON
    nb.cells = cells
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(convert(open(src).read()), dst)
