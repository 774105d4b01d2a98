"""The standard sample set: 20 fixed samples, four of each scene type, shared by every notebook.

    python -m unicache_lib.world.samples --out data/samples      # regenerate (byte-identical)

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


def save(samples: list[Sample], out: Path) -> None:
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    manifest = {"seed": SEED, "n": len(samples), "image_size": int(samples[0].image.shape[0]),
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


def load(path: str | Path = SAMPLES_DIR, ids=None, scene_types=None, per_type: int | None = None) -> list[Sample]:
    """Load the committed set (optionally a subset: by id, by scene type, or the first ``per_type``
    samples of every scene type, so a small subset still covers all five types)."""
    from PIL import Image

    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise FileNotFoundError(f"no sample set at {path}: run `python -m unicache_lib.world.samples --out {path}`")
    manifest = json.loads(mf.read_text())
    masks = np.load(path / "masks.npz")
    out = []
    for e in manifest["samples"]:
        if ids is not None and e["id"] not in ids:
            continue
        if scene_types is not None and e["scene_type"] not in scene_types:
            continue
        if per_type is not None and int(e["id"].rsplit("-", 1)[1]) >= per_type:
            continue
        img = np.asarray(Image.open(path / e["image"]).convert("RGB"))
        out.append(Sample(e["id"], e["scene_type"], img, masks[e["id"]], e["objects"], e["question"], e["answer"],
                          e["qtype"], e["caption"], e["short_prompt"], e["long_prompt"]))
    if ids is not None:
        unknown = set(ids) - {s.id for s in out}
        if unknown:
            raise KeyError(f"unknown sample ids {sorted(unknown)}; known: {[e['id'] for e in manifest['samples']]}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SAMPLES_DIR))
    args = ap.parse_args(argv)
    save(build(), Path(args.out))
    print(f"wrote {len(build())} samples to {args.out}")


if __name__ == "__main__":
    main()
