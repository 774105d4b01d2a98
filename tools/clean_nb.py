"""Drop volatile metadata (papermill timings, execution timestamps) from executed notebooks, so a
re-execution that computes the same numbers leaves the committed file unchanged."""
import sys

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    for k in ("start_time", "end_time", "duration", "input_path", "output_path"):
        pm.pop(k, None)
    for c in nb.cells:
        c.metadata.pop("execution", None)
        c.metadata.get("papermill", {}).clear()
    nbformat.write(nb, path)
