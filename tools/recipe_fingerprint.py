"""Fingerprint every training recipe on a few steps: run each shipped recipe tiny (a few steps, small batches, the
in-training evaluation and logging exercised) and print a SHA-256 of its weights and of its training log. Two
commits that print the same lines train the same models: the check behind a refactor of the training code that must
not change what ``make models`` produces.

    python tools/recipe_fingerprint.py /tmp/fp-new                      # this checkout
    python tools/recipe_fingerprint.py /tmp/fp-new llava clip           # some recipes only
    python tools/recipe_fingerprint.py --of /tmp/fp-new                 # the fingerprint of runs already made
    cp tools/recipe_fingerprint.py /tmp/fp.py && git worktree add /tmp/old <rev> && \
        (cd /tmp/old && PYTHONPATH=. python /tmp/fp.py /tmp/fp-old)       # a commit from before the tool

(``PYTHONPATH``: the package is installed editable from this checkout, which would otherwise be imported.)

About two minutes on one core for all seven.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

RUNS = {
    "llava": ("unicache_lib.zoo.train.llava", "--steps-a 3 --steps-b 4 --batch-a 4 --batch-b 4 --n-heldout 10 "
                                              "--eval-every 2 --n-captions 2"),
    "mllama": ("unicache_lib.zoo.train.vlm", "--family Mllama --steps-a 3 --steps-b 4 --batch-a 4 --batch-b 4 "
                                             "--n-heldout 10 --eval-every 2 --n-captions 2"),
    "clip": ("unicache_lib.zoo.train.clip", "--steps 4 --batch 4 --n-heldout 10 --eval-every 2"),
    "vilt": ("unicache_lib.zoo.train.vilt", "--steps 4 --batch 4 --n-heldout 10 --eval-every 2"),
    "janus": ("unicache_lib.zoo.train.janus", "--steps-vq 3 --steps-a 3 --steps-b 4 --batch-vq 4 --batch-a 4 "
                                              "--batch-b 4 --n-heldout 10 --n-generate 2 --eval-every 2 --n-captions 2"),
    "sd3": ("unicache_lib.zoo.train.generator", "--family sd3 --steps 4 --batch 4 --n-eval 4 --eval-every 2"),
    "pixart": ("unicache_lib.zoo.train.generator", "--family pixart --steps 4 --batch 4 --n-eval 4 --eval-every 2"),
}


def fingerprint(folder: Path) -> dict[str, str]:
    """``{file: sha256}`` of every weight file under ``folder`` (tensors by name, so the file layout does not count)
    and of each model card's training log."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.rglob("*.safetensors")):
        h = hashlib.sha256()
        for name, t in sorted(load_file(f).items()):
            h.update(name.encode())
            h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        out[str(f.relative_to(folder))] = h.hexdigest()[:16]
    for c in sorted(folder.rglob("model_card.json")):
        log = json.dumps(json.loads(c.read_text()).get("log"), sort_keys=True)
        out[f"{c.relative_to(folder).parent}/log"] = hashlib.sha256(log.encode()).hexdigest()[:16]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    import contextlib

    import torch

    if argv[0] == "--of":  # the fingerprint of runs already made
        for path, digest in fingerprint(Path(argv[1])).items():
            print(f"{digest}  {path}")
        return 0
    torch.set_num_threads(1)
    root, names = Path(argv[0]), argv[1:] or list(RUNS)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for name in names:
        module, args = RUNS[name]
        with contextlib.redirect_stdout(sys.stderr):  # the recipes' own reports; stdout is the fingerprint
            importlib.import_module(module).main(args.split() + ["--out", str(root / name), "--seed", "0"])
    for path, digest in fingerprint(root).items():
        print(f"{digest}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
