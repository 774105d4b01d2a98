"""Drop volatile metadata from executed notebooks, so a re-execution that computes the same numbers
leaves the committed file unchanged, and so that the jupytext pairing (notebooks/jupytext.toml) writes
clean sources: papermill's run timings and paths, per-cell execution timestamps, and the empty
``papermill`` / ``tags`` entries papermill adds to every cell (left in, a notebook saved in JupyterLab
would write ``tags=[]`` into every cell header of its source).

    python tools/clean_nb.py notebooks/01_capture.ipynb ...

Not nbstripout: it cannot drop a ``tags`` entry only when it is empty, and by default drops the
widget state the committed notebooks keep."""
import sys

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    for k in ("start_time", "end_time", "duration", "input_path", "output_path"):
        pm.pop(k, None)
    for c in nb.cells:
        c.metadata.pop("execution", None)
        c.metadata.pop("papermill", None)
        if c.metadata.get("tags") == []:
            del c.metadata["tags"]
    nbformat.write(nb, path)
