"""The standard sample set: 20 fixed samples, four of each scene type, shared by every notebook.

    python -m unicache_lib.world.samples --out data/samples      # regenerate (byte-identical)
    load(seed=7)                                                 # another standard set, built in memory

The shipped set is the one built from :data:`SEED`; notebooks take a ``SAMPLE_SEED`` parameter
(default :data:`SEED`) so their results can be replicated on further sets of the same recipe.

Each sample has a 64x64 image, per-object masks, one question with its answer (question types
rotate), a caption, and a short and a long generation prompt for the same objects. The manifest
(``manifest.json``) describes them; images are PNG, masks one ``masks.npz``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import MissingFileError, UnknownNameError
from .scenes import SCENE_TYPES
from .text import caption, long_prompt, make_qa, short_prompt

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "data" / "samples"
PER_TYPE = 4
QTYPES = ("colour", "shape", "position", "exists")
SEED = 2024


@dataclass
class Sample:
    """One standard sample. ``image``: uint8 ``[64, 64, 3]``; ``masks``: bool ``[n_objects, 64, 64]``."""

    id: str
    scene_type: str
    image: np.ndarray
    masks: np.ndarray
    objects: list[dict]
    question: str
    answer: str
    qtype: str
    caption: str
    short_prompt: str
    long_prompt: str


def build(seed: int = SEED, per_type: int = PER_TYPE) -> list[Sample]:
    """Generate the set deterministically."""
    rng = np.random.default_rng(seed)
    out = []
    for st in SCENE_TYPES:
        for i in range(per_type):
            qa = make_qa(rng, QTYPES[i % len(QTYPES)], scene_type=st)
            objs = qa.scene.describe()
            gen_objs = [{k: o[k] for k in ("colour", "shape", "position")} for o in objs]
            out.append(Sample(
                id=f"{st}-{i}", scene_type=st, image=qa.scene.uint8(), masks=qa.scene.masks, objects=objs,
                question=qa.question, answer=qa.answer, qtype=qa.qtype, caption=caption(qa.scene),
                short_prompt=short_prompt(gen_objs), long_prompt=long_prompt(gen_objs, rng),
            ))
    return out


def save(samples: list[Sample], out: Path, seed: int = SEED) -> None:
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    manifest = {"seed": seed, "n": len(samples), "image_size": int(samples[0].image.shape[0]),
                "scene_types": list(SCENE_TYPES), "samples": []}
    masks = {}
    for s in samples:
        Image.fromarray(s.image).save(out / f"{s.id}.png")
        masks[s.id] = s.masks
        manifest["samples"].append({
            "id": s.id, "scene_type": s.scene_type, "image": f"{s.id}.png", "objects": s.objects,
            "question": s.question, "answer": s.answer, "qtype": s.qtype, "caption": s.caption,
            "short_prompt": s.short_prompt, "long_prompt": s.long_prompt,
        })
    np.savez_compressed(out / "masks.npz", **masks)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def load(path: str | Path = SAMPLES_DIR, ids=None, scene_types=None, per_type: int | None = None,
         seed: int | None = None) -> list[Sample]:
    """Load the committed set (optionally a subset: by id, by scene type, or the first ``per_type``
    samples of every scene type, so a small subset still covers all five types).

    ``seed``: ``None`` or the committed set's seed loads the files at ``path``; any other seed builds
    that set in memory with the same recipe (same ids, scene types and question-type rotation)."""
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise MissingFileError(f"no sample set at {path}: run `python -m unicache_lib.world.samples --out {path}`")
    manifest = json.loads(mf.read_text())
    if seed is not None and int(seed) != int(manifest.get("seed", SEED)):
        n_per = max(int(e["id"].rsplit("-", 1)[1]) for e in manifest["samples"]) + 1
        return _select(build(int(seed), n_per), ids, scene_types, per_type)
    from PIL import Image

    masks = np.load(path / "masks.npz")
    out = []
    for e in manifest["samples"]:
        img = np.asarray(Image.open(path / e["image"]).convert("RGB"))
        out.append(Sample(e["id"], e["scene_type"], img, masks[e["id"]], e["objects"], e["question"], e["answer"],
                          e["qtype"], e["caption"], e["short_prompt"], e["long_prompt"]))
    return _select(out, ids, scene_types, per_type)


def _select(samples: list[Sample], ids=None, scene_types=None, per_type: int | None = None) -> list[Sample]:
    out = [s for s in samples if (ids is None or s.id in ids) and (scene_types is None or s.scene_type in scene_types)
           and (per_type is None or int(s.id.rsplit("-", 1)[1]) < per_type)]
    if ids is not None:
        unknown = set(ids) - {s.id for s in out}
        if unknown:
            raise UnknownNameError(f"unknown sample ids {sorted(unknown)}; known: {[s.id for s in samples]}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SAMPLES_DIR))
    ap.add_argument("--seed", type=int, default=SEED, help=f"another standard set (the shipped one: {SEED})")
    args = ap.parse_args(argv)
    samples = build(args.seed)
    save(samples, Path(args.out), args.seed)
    print(f"wrote {len(samples)} samples to {args.out}")


if __name__ == "__main__":
    main()
