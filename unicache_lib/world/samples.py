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
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.errors import ImageError, InputError, MissingFileError, UnknownNameError
from ..core.untrusted import file_inside, read_utf8
from ..paths import project_path
from .questions import TRAIN_QTYPES
from .scenes import SCENE_TYPES
from .text import QA, caption, jsonl_rows, long_prompt, make_qa, short_prompt

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "data" / "samples"
PER_TYPE = 4
QTYPES = TRAIN_QTYPES  # the standard samples rotate through the question types the shipped models learned
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

    @property
    def has_masks(self) -> bool:
        """One object mask per listed object (your folder's ``masks.npz``): what object-placement claims need."""
        return len(self.objects) > 0 and len(self.masks) == len(self.objects)


@dataclass
class Picture:
    """A sample's picture as the eviction code reads a scene: ``uint8()``, ``masks``, ``objects``, ``scene_type``."""

    image: np.ndarray
    masks: np.ndarray
    objects: list
    scene_type: str

    def uint8(self) -> np.ndarray:
        return self.image


def as_questions(samples) -> list:
    """Your samples as the held-out questions notebook 05 scores (:class:`~unicache_lib.world.text.QA`: ``scene``,
    ``qtype``, ``question``, ``answer``). Eviction is scored on the answers, so every sample needs one: a folder
    without them is refused, naming the samples and the fix (never scored against an empty answer)."""
    lacking = [s.id for s in samples if s.answer is None or not str(s.answer).strip()]
    if lacking:
        raise InputError(f"{len(lacking)} of {len(samples)} samples have no answer ({', '.join(lacking[:3])}"
                         f"{', ...' if len(lacking) > 3 else ''}): KV eviction is scored on the answers; add an 'answer' "
                         f"to every line of metadata.jsonl")
    long = [s.id for s in samples if len(str(s.answer).split()) != 1]
    if long:
        raise InputError(f"{len(long)} of {len(samples)} answers are not one word ({', '.join(long[:3])}"
                         f"{', ...' if len(long) > 3 else ''}): eviction is scored on the first answer token; give a "
                         f"one-word 'answer' (e.g. 'red', 'yes', '2') and ask for it ('answer with one word')")
    return [QA(Picture(s.image, s.masks, s.objects, s.scene_type), s.qtype or "own", s.question, str(s.answer).strip(), None)
            for s in samples]


def missing(samples, what: str) -> str | None:
    """Why claims needing ``what`` (``"masks"`` or ``"answers"``) cannot be scored on ``samples``, as the scoreboard
    note "not measurable with these samples: ..." (None: every sample has it)."""
    if what == "masks":
        lacking = [s.id for s in samples if not s.has_masks]
        fix = "add a masks.npz with one mask per listed object (make samples writes an example)"
    elif what == "answers":
        lacking = [s.id for s in samples if not s.answer]
        fix = "add an 'answer' to every line of metadata.jsonl"
    else:
        raise InputError(f"what must be 'masks' or 'answers', got {what!r}")
    if not lacking:
        return None
    return (f"not measurable with these samples: {len(lacking)} of {len(samples)} have no {what} "
            f"({', '.join(lacking[:3])}{', ...' if len(lacking) > 3 else ''}); {fix}")


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


def load(path: str | Path | None = None, ids=None, scene_types=None, per_type: int | None = None,
         seed: int | None = None) -> list[Sample]:
    """Load the committed set, or your own folder at ``path`` (:func:`read_folder`), optionally a subset: by id, by
    scene type, or the first ``per_type`` samples of every scene type, so a small subset still covers all five types.

    ``seed``: ``None`` or the committed set's seed loads the files at ``path``; any other seed builds
    that set in memory with the same recipe (same ids, scene types and question-type rotation), with ``per_type``
    samples of each type where that is more than the committed set has (the settling runs of ``make settle``)."""
    path = SAMPLES_DIR if path is None else project_path(path)  # None: the shipped set; relative: from the repository
    mf = path / "manifest.json"
    if not mf.exists() and path.is_dir() and ((path / METADATA).exists() or _llava_json(path)):
        if seed is not None and int(seed) != SEED:
            raise InputError(f"{path} is your own sample folder: it has no seed to draw another set from; pass "
                             f"SAMPLE_SEED=None or {SEED} (the default) with it")
        return _select(read_folder(path), ids, scene_types, per_type)
    if not mf.exists():
        raise MissingFileError(f"no sample set at {path}: pass a folder in the Hugging Face imagefolder layout (images "
                               f"and a {METADATA} with file_name and question per line; see export_folder), a LLaVA-style "
                               f"conversations JSON beside its images, or run `python -m unicache_lib.world.samples --out {path}`")
    manifest = json.loads(mf.read_text())
    n_per = max(int(e["id"].rsplit("-", 1)[1]) for e in manifest["samples"]) + 1
    if seed is not None and int(seed) != int(manifest.get("seed", SEED)):
        return _select(build(int(seed), max(n_per, per_type or 0)), ids, scene_types, per_type)  # larger when asked
    if per_type is not None and per_type > n_per:
        raise InputError(f"the committed set at {path} has {n_per} samples per scene type, {per_type} were asked for: "
                         f"pass another SAMPLE_SEED (a set of the same recipe is built with {per_type} per type), or "
                         f"PER_TYPE <= {n_per}")

    masks = np.load(path / "masks.npz")
    out = []
    for e in manifest["samples"]:
        img = np.asarray(Image.open(file_inside(path, e["image"], f"{mf}, sample {e['id']!r}", "image")).convert("RGB"))
        out.append(Sample(e["id"], e["scene_type"], img, masks[e["id"]], e["objects"], e["question"], e["answer"],
                          e["qtype"], e["caption"], e["short_prompt"], e["long_prompt"]))
    return _select(out, ids, scene_types, per_type)


METADATA = "metadata.jsonl"  # the Hugging Face imagefolder layout: one JSON object per image, keyed by file_name
FOLDER_KEYS = ("file_name", "question")  # required; answer, qtype, objects, caption, prompts and masks are optional


def export_folder(samples: list[Sample], out: str | Path) -> Path:
    """Write ``samples`` in the Hugging Face ``imagefolder`` layout: the PNGs, a ``metadata.jsonl`` (``file_name``,
    ``question``, ``answer`` and the rest of each sample) and the object masks in ``masks.npz`` (keyed by
    ``file_name``). ``datasets.load_dataset("imagefolder", data_dir=out)`` reads it, and so does :func:`load`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines, masks = [], {}
    for s in samples:
        name = f"{s.id}.png"
        Image.fromarray(s.image).save(out / name)
        masks[name] = s.masks
        lines.append(json.dumps({"file_name": name, "id": s.id, "question": s.question, "answer": s.answer,
                                 "qtype": s.qtype, "scene_type": s.scene_type, "objects": s.objects, "caption": s.caption,
                                 "short_prompt": s.short_prompt, "long_prompt": s.long_prompt}))
    np.savez_compressed(out / "masks.npz", **masks)
    tmp = out / (METADATA + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out / METADATA)
    return out


def _llava_json(path: Path) -> Path | None:
    """The one LLaVA-style conversations JSON of a folder (a list of ``{"image", "conversations"}``), if any."""
    for f in sorted(path.glob("*.json")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, list) and data and isinstance(data[0], dict) and "conversations" in data[0]:
            return f
    return None


def _rows_from_llava(f: Path) -> list[tuple[str, dict]]:
    """``(where, row)`` per entry: ``where`` names the file and the entry for every refusal."""
    rows = []
    for i, e in enumerate(json.loads(read_utf8(f))):
        where = f"{f}, entry {i}"
        turns = e.get("conversations") if isinstance(e, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            turns = None
        human = next((t.get("value") for t in turns or [] if t.get("from") == "human"), None)
        if turns is None or "image" not in e or not isinstance(human, str):
            raise InputError(f"{where}: a LLaVA-style entry is an object with an 'image' and a 'conversations' list "
                             "whose 'human' turn has a text 'value'; fix it, or convert the file to metadata.jsonl "
                             "(file_name, question)")
        answer = next((t.get("value") for t in turns if t.get("from") == "gpt"), None)
        row = {"file_name": e["image"], "question": human.replace("<image>", "").strip(), "answer": answer}
        if "id" in e:
            row["id"] = e["id"]
        rows.append((where, row))
    return rows


# what a folder's line may hold beside file_name and question, and the type each must have
_TEXT_FIELDS = ("qtype", "scene_type", "caption", "short_prompt", "long_prompt")
_OBJECT_KEYS = ("colour", "shape", "position")
_HIGH_BIT_MODES = {"I": 32, "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16, "F": 32}


def _check_row(where: str, row: dict) -> dict:
    """The fields of one line, type by type; a wrong one is refused naming ``where``, the field and the fix."""
    q = row.get("question")
    if not isinstance(q, str) or not q.strip():
        raise InputError(f"{where}: 'question' must be a non-empty text, got {q!r}: write the question the model is "
                         f"asked about the image")
    a = row.get("answer")
    if a is not None and (isinstance(a, bool) or not isinstance(a, (str, int, float))):
        raise InputError(f"{where}: 'answer' must be a text (or left out), got {a!r}")
    if "id" in row and (isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)) or not str(row["id"]).strip()):
        raise InputError(f"{where}: 'id' must be a non-empty text, got {row['id']!r}")
    for k in _TEXT_FIELDS:
        if row.get(k) is not None and not isinstance(row[k], str):
            raise InputError(f"{where}: {k!r} must be a text, got {row[k]!r}")
    st = row.get("scene_type")
    if st and st not in SCENE_TYPES:
        raise InputError(f"{where}: scene_type {st!r} is not one of {SCENE_TYPES}: leave it out for your own images")
    objs = row.get("objects")
    if objs is not None:
        if not isinstance(objs, list) or not all(isinstance(o, dict) for o in objs):
            raise InputError(f"{where}: 'objects' must be a list of objects such as "
                             '{"colour": "red", "shape": "circle", "position": "left"}, got ' + repr(objs)[:80])
        for o in objs:
            bad = {k: o.get(k) for k in _OBJECT_KEYS if k in o and not isinstance(o[k], str)}
            if bad:
                raise InputError(f"{where}: an object's {', '.join(bad)} must be text, got {bad}")
    return row


def _read_image(f: Path, where: str) -> np.ndarray:
    """``f`` as ``[H, W, 3]`` uint8 RGB; refused naming the file for what cannot be converted exactly (16- and
    32-bit images, decompression bombs, unreadable files); transparent pixels warned about as ``inputs_for`` does."""
    try:
        with Image.open(f) as im:
            if im.mode in _HIGH_BIT_MODES:
                raise ImageError(f"{where}: {f.name} is a {_HIGH_BIT_MODES[im.mode]}-bit image (mode {im.mode}): only 8-bit "
                                 f"images are read exactly; save it as 8-bit RGB PNG, e.g. "
                                 f"(arr / arr.max() * 255).round().astype('uint8')")
            im.load()
            alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
            rgba = np.asarray(im.convert("RGBA")) if alpha else None
            img = np.asarray(im.convert("RGB"))
    except Image.DecompressionBombError as e:
        raise ImageError(f"{where}: {f.name} has more pixels than PIL's decompression-bomb limit "
                         f"(Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS:,}): resize it first ({e})") from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ImageError(f"{where}: {f} is not a readable image ({e}): re-save it as PNG or JPEG") from e
    if rgba is not None and (rgba[..., 3] < 255).any():
        share = float((rgba[..., 3] == 0).mean())
        warnings.warn(f"{f.name}: {share:.0%} of its pixels are fully transparent; the alpha channel is dropped (as "
                      "PIL's convert('RGB') and transformers' convert_to_rgb do), so they show their stored colour. "
                      "Composite it on a background first, e.g. PIL.Image.alpha_composite(PIL.Image.new('RGBA', "
                      "img.size, 'white'), img).convert('RGB')", UserWarning, stacklevel=3)
    return img


def _read_masks(path: Path) -> dict:
    """``masks.npz`` as ``{file_name: bool [n, H, W]}``: no pickles, 3-D boolean (or 0/1) arrays, or a refusal naming
    the file and the array."""
    f = path / "masks.npz"
    if not f.exists():
        return {}
    try:
        with np.load(f, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise InputError(f"{f} is a single array, not an .npz archive: save it with np.savez_compressed(path, "
                                 f"**{{file_name: masks}})")
            out = {}
            for k in z.files:
                m = z[k]
                if m.ndim != 3 or not (m.dtype == np.bool_ or (np.issubdtype(m.dtype, np.integer)
                                                               and m.size and set(np.unique(m)) <= {0, 1})
                                       or (m.size == 0 and m.ndim == 3)):
                    raise InputError(f"{f}[{k!r}] is {m.dtype} of shape {m.shape}: save one boolean mask per object, "
                                     f"[n_objects, H, W]")
                out[k] = m.astype(bool)
            return out
    except InputError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise InputError(f"{f} is not a readable .npz of boolean masks ({type(e).__name__}: {e}); pickled or object "
                         f"arrays are never loaded. Save it with np.savez_compressed(path, **{{file_name: bool masks}}) "
                         f"or remove it (masks are optional)") from e


def read_folder(path: str | Path) -> list[Sample]:
    """Your own samples: a folder in the imagefolder layout (:data:`METADATA`) or with a LLaVA-style conversations
    JSON. Every line is checked before anything loads, field by field: a bad line, a path that leaves the folder,
    a missing or unreadable image, an id used twice, or masks that do not fit name the file, the line and the fix.
    What a folder lacks stays empty (``answer`` None, no objects, no masks), and the claims that need it say so
    instead of measuring."""
    path = Path(path)
    meta, llava = path / METADATA, None if (path / METADATA).exists() else _llava_json(path)
    if llava is not None:
        rows = _rows_from_llava(llava)
    else:
        rows = []
        for n, row in jsonl_rows(meta):
            where = f"{meta}, line {n}"
            missing = [k for k in FOLDER_KEYS if not isinstance(row, dict) or k not in row]
            if missing:
                raise InputError(f"{where}: no {' or '.join(repr(k) for k in missing)}: every line needs "
                                 f"{', '.join(FOLDER_KEYS)} (answer, objects and masks are optional)")
            rows.append((where, row))
    if not rows:
        raise InputError(f"{llava or meta} lists no samples: add one line per image")
    files = {}
    for where, row in rows:
        _check_row(where, row)
        files[where] = file_inside(path, row["file_name"], where, "file_name" if llava is None else "image")
    seen: dict[str, str] = {}
    for where, row in rows:
        sid = str(row.get("id", Path(str(row["file_name"])).stem))
        if sid in seen:
            raise InputError(f"{where}: sample id {sid!r} is also {seen[sid]}'s: ids name a sample's records, so two "
                             f"samples cannot share one; give every line its own 'id'")
        seen[sid] = where
    masks = _read_masks(path)
    out = []
    for (where, row), sid in zip(rows, seen):
        img = _read_image(files[where], where)
        m = masks[row["file_name"]] if row["file_name"] in masks else np.zeros((0, *img.shape[:2]), bool)
        if m.shape[1:] != img.shape[:2]:
            raise InputError(f"masks.npz[{row['file_name']!r}] is {tuple(m.shape)}, not [n_objects, {img.shape[0]}, "
                             f"{img.shape[1]}] like its image: save one boolean mask per object at the image's size")
        a = row.get("answer")
        out.append(Sample(sid, row.get("scene_type") or "", img, m, list(row.get("objects") or []), row["question"],
                          None if a is None else str(a), row.get("qtype") or "", row.get("caption") or "",
                          row.get("short_prompt") or "", row.get("long_prompt") or ""))
    return out


def _select(samples: list[Sample], ids=None, scene_types=None, per_type: int | None = None) -> list[Sample]:
    rank, seen = [], {}
    for s in samples:  # the i-th sample of its scene type (the standard sets' "type-i" ids; your folder's order)
        rank.append(seen.get(s.scene_type, 0))
        seen[s.scene_type] = rank[-1] + 1
    out = [s for s, r in zip(samples, rank) if (ids is None or s.id in ids)
           and (scene_types is None or s.scene_type in scene_types) and (per_type is None or r < per_type)]
    untyped = seen.get("", 0)
    if per_type is not None and untyped > per_type and ids is None:  # your folder without scene types: say so
        warnings.warn(f"kept the first {per_type} of your {untyped} samples without a scene_type (per_type / PER_TYPE="
                      f"{per_type} counts them as one type): pass PER_TYPE={untyped} to take them all", UserWarning,
                      stacklevel=3)
    if ids is not None:
        unknown = set(ids) - {s.id for s in out}
        if unknown:
            raise UnknownNameError(f"unknown sample ids {sorted(unknown)}; known: {[s.id for s in samples]}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SAMPLES_DIR))
    ap.add_argument("--seed", type=int, default=SEED, help=f"another standard set (the shipped one: {SEED})")
    ap.add_argument("--folder", action="store_true", help="write the imagefolder layout (metadata.jsonl), the layout "
                    "your own samples take, instead of the shipped manifest")
    args = ap.parse_args(argv)
    samples = build(args.seed)
    if args.folder:
        print(f"wrote {len(samples)} samples to {export_folder(samples, Path(args.out))} (imagefolder layout)")
        return
    save(samples, Path(args.out), args.seed)
    print(f"wrote {len(samples)} samples to {args.out}")


if __name__ == "__main__":
    main()
