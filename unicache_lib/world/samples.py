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
import codecs
import collections
import difflib
import hashlib
import io
import json
import math
import os
import posixpath
import re
import shlex
import shutil
import tempfile
import unicodedata
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.errors import ImageError, InputError, InputTypeError, MissingFileError, UnicacheError, UnknownNameError
from ..core.untrusted import RepeatedKeyError, decode_utf8, json_loads, open_inside, stat_inside
from ..paths import OUTPUT_MARKER, OutputFolder, _content, _marker, _not_ours, _written_by, output_folder, project_path
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
    if (lacking := [s.id for s in samples if s.answer is None or not str(s.answer).strip()]):
        raise InputError(f"{len(lacking)} of {len(samples)} samples have no answer ({', '.join(lacking[:3])}"
                         f"{', ...' if len(lacking) > 3 else ''}): KV eviction is scored on the answers; add an 'answer' "
                         f"to every line of metadata.jsonl")
    if (long := [s.id for s in samples if len(str(s.answer).split()) != 1]):
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
    return None if not lacking else (f"not measurable with these samples: {len(lacking)} of {len(samples)} have no {what} "
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
    """Write ``samples`` in the shipped layout (PNGs, ``manifest.json``, ``masks.npz``) into ``out``: a new or empty
    folder, or one this generator wrote before (:func:`_generator_folder`); every id must be a plain name."""
    _check_ids(samples)
    if _is_shipped(out):
        _into_shipped(samples, lambda folder: save(samples, folder, seed))
        return
    folder, names = _write_images(samples, out, [MANIFEST], lambda s: s.id)
    (folder.path / MANIFEST).write_text(json.dumps(
        {"seed": seed, "n": len(samples), "image_size": int(samples[0].image.shape[0]), "scene_types": list(SCENE_TYPES),
         "samples": [{"id": s.id, "scene_type": s.scene_type, "image": f"{s.id}.png", "objects": s.objects,
                      "question": s.question, "answer": s.answer, "qtype": s.qtype, "caption": s.caption,
                      "short_prompt": s.short_prompt, "long_prompt": s.long_prompt} for s in samples]}, indent=1))
    folder.record(names, wrote=names)  # their SHA-256: a later run replaces only files that still hold this


def _write_images(samples, out, files: list[str], mask_key) -> tuple[OutputFolder, list[str]]:
    """``(folder, names)``: the folder :func:`save` / :func:`export_folder` write ``samples`` to
    (:func:`_generator_folder`), what the generator wrote there before removed, then ``names`` (every ``<id>.png``,
    ``masks.npz`` and ``files``) listed before any is written (a run cut short leaves nothing unlisted), and the
    images and ``masks.npz`` (keyed by ``mask_key(sample)``) written."""
    folder = _generator_folder(out, samples)
    names = [f"{s.id}.png" for s in samples] + ["masks.npz", *files]
    folder.clean()
    folder.record(names)
    folder.path.mkdir(parents=True, exist_ok=True)
    for s in samples:
        Image.fromarray(s.image).save(folder.path / f"{s.id}.png")
    np.savez_compressed(folder.path / "masks.npz", **{mask_key(s): s.masks for s in samples})
    return folder, names


MANIFEST = "manifest.json"  # the shipped set's layout (what save writes): a seed and one entry per sample
METADATA = "metadata.jsonl"  # the Hugging Face imagefolder layout: one JSON object per image, keyed by file_name
FOLDER_KEYS = ("file_name", "question")  # required; answer, qtype, objects, caption, prompts and masks are optional
MAX_PER_TYPE = 1000  # samples per scene type a set is built with in memory (5000 in all; 10**6 would fill it)
_WRITTEN = {MANIFEST, METADATA, METADATA + ".tmp", "masks.npz"}  # what save / export_folder write beside the PNGs
_GENERATED_PNG = re.compile(rf"(?:{'|'.join(map(re.escape, SCENE_TYPES))})-[0-9]+\.png")  # a standard sample's image
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


TOOL = "the sample generator"  # the name in the .unicache-output marker of the folders it writes
MAX_ID_BYTES = 200  # a sample id becomes a file name (<id>.png): a plain name well under the file system's 255 bytes


def _id_problem(sid: str) -> str | None:
    """Why ``sid`` cannot be a sample id (None: it can): an id names the sample's records and its file
    (``<id>.png`` when the set is written), so it is a plain name: no path separator, not ``.`` or ``..``, no NUL
    byte or other control character (a newline, a tab, DEL), no leading dot (a hidden file), at most
    :data:`MAX_ID_BYTES` bytes."""
    if "\x00" in sid:
        return "holds a NUL byte"
    if "/" in sid or "\\" in sid:
        return "holds a path separator ('/' or '\\')"
    if sid.strip() in (".", ".."):
        return f"is {sid.strip()!r}, a folder's name"
    bad = next((c for c in sid if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        return f"holds the control character {bad!r} (U+{ord(bad):04X})"
    if sid.startswith("."):
        return "starts with a dot (its file <id>.png would be hidden)"
    return (f"is {len(sid.encode('utf-8', 'surrogatepass')):,} bytes long, more than the {MAX_ID_BYTES} an id may be"
            if len(sid.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES else None)


def _id_key(sid: str) -> str:
    """The file an id names on every file system: NFC-normalised and case-folded (macOS and Windows file systems
    ignore case, and macOS also normalisation), so two ids with one key would be one file ``<id>.png``."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", sid).casefold())


TWIN_IDS = ("differ only in case or Unicode normalisation (NFC / NFD): on a case-insensitive file system (macOS, "
            "Windows) their images <id>.png are one file; rename one")  # why two ids of one _id_key are refused


def _check_ids(samples) -> None:
    """Refuse a set whose ids could not be file names inside the output folder (:func:`_id_problem`), repeat, or
    collide once normalised and case-folded (:func:`_id_key`)."""
    seen: dict[str, str] = {}
    for s in samples:
        if (why := _id_problem(str(s.id))):
            raise InputError(f"sample id {str(s.id)[:80]!r} {why}: an id becomes a file name (<id>.png), so it must be a "
                             f"plain name such as 'cat-1'; nothing was written")
        other = seen.get(_id_key(str(s.id)))
        if other == s.id:
            raise InputError(f"sample id {s.id!r} is given twice: each sample's image is written as <id>.png, so one "
                             f"would replace the other; nothing was written")
        if other is not None:
            raise InputError(f"sample ids {other!r} and {s.id!r} {TWIN_IDS}; nothing was written")
        seen[_id_key(str(s.id))] = s.id


def _is_shipped(out) -> bool:
    """Whether ``out`` names the shipped set's own folder (``data/samples``)."""
    return out is not None and bool(str(out).strip()) and \
        Path(os.path.abspath(os.path.expanduser(str(out)))).resolve() == SAMPLES_DIR.resolve()


def _generator_folder(out, samples) -> OutputFolder:
    """The folder the generator may write ``samples`` to (:func:`unicache_lib.paths.output_folder`): not empty, not
    the repository or a folder of it but outputs/, and new, empty, or holding only what the generator wrote there
    (its ``.unicache-output`` lists it with each file's SHA-256; a folder an earlier version wrote without a marker
    is recognised by its contents, :func:`_earlier_output`, and refused with its own message), so it never replaces
    your ``manifest.json`` or ``metadata.jsonl``. The shipped set's own folder (``data/samples``) is handled apart
    (:func:`_into_shipped`)."""
    try:
        return output_folder(out, TOOL, option="--out", legacy=_earlier_output)
    except InputError as e:
        if "did not write" not in str(e):
            raise
        raise InputError(f"{e}. The generator never writes beside your own files; for your own images write a "
                         f"{METADATA} beside them instead (samples.load(folder) says how)") from e


def _into_shipped(samples, write) -> Path:
    """Regenerate the shipped set's own folder (``data/samples``, committed, no marker) by content, not by name: the
    set is written into a temporary folder by ``write(folder)``, then each of its files must hold, byte for byte,
    what ``data/samples`` holds under that name (the SHA-256 of the committed files: another ``--seed``, the
    ``--folder`` layout's ``masks.npz`` or a local edit all differ and are refused, nothing written); a file that is
    missing there is restored, unless it would make a second layout beside the first (``metadata.jsonl`` beside
    ``manifest.json``)."""

    _refuse_foreign(SAMPLES_DIR, samples)
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="unicache-samples-") as tmp:
        made = Path(tmp) / "set"
        write(made)
        files = sorted(p.name for p in made.iterdir() if p.is_file() and p.name != OUTPUT_MARKER)
        there = {p.name for p in SAMPLES_DIR.iterdir()} if SAMPLES_DIR.is_dir() else set()
        if (changed := [n for n in files if n in there and sha(_read_own(SAMPLES_DIR, n, MAX_MASK_BYTES))
                        != sha((made / n).read_bytes())]):
            raise InputError(f"{SAMPLES_DIR} is the shipped sample set (committed files): this run would change "
                             f"{', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''} (another --seed, the "
                             f"--folder layout or a local edit: their SHA-256 differ), so nothing was written; it is "
                             f"only ever regenerated byte for byte. Pass another --out (e.g. outputs/samples-seed), or "
                             f"restore the committed files with git checkout -- data/samples")
        added = [n for n in files if n not in there]
        if len({MANIFEST, METADATA} & (there | set(added))) > 1:  # both layouts in one folder
            raise InputError(f"{SAMPLES_DIR} holds the shipped set's {MANIFEST}: writing {METADATA} beside it would "
                             f"leave two layouts in one folder (load() refuses that), so nothing was written; pass "
                             f"another --out (e.g. outputs/samples-folder)")
        SAMPLES_DIR.mkdir(parents=True, exist_ok=True)
        for n in added:  # a committed file that went missing: restored, byte for byte
            shutil.copyfile(made / n, SAMPLES_DIR / (n + ".tmp"))
            os.replace(SAMPLES_DIR / (n + ".tmp"), SAMPLES_DIR / n)
    return SAMPLES_DIR


_SAVED_KEYS = {"id", "scene_type", "image", "objects", "question", "answer", "qtype", "caption", "short_prompt",
               "long_prompt"}  # a manifest entry as save() writes it
_EXPORTED_KEYS = (_SAVED_KEYS - {"image"}) | {"file_name"}  # a metadata.jsonl line as export_folder() writes it


def _earlier_output(folder: Path) -> set[str] | None:
    """The files an earlier generator (before the marker) wrote in ``folder``, recognised by content, not by name: a
    ``manifest.json`` or ``metadata.jsonl`` exactly as :func:`save` / :func:`export_folder` write it (every entry with
    their keys, its image ``<id>.png``), and beside it only the PNGs it names, ``masks.npz`` and the other layout's
    file as written. None for anything else (your own ``manifest.json`` or ``metadata.jsonl`` included)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    names = {p.name for p in entries}
    if any(p.is_symlink() or not p.is_file() for p in entries) or not names & {MANIFEST, METADATA}:
        return None
    images = set()
    try:
        if MANIFEST in names:
            data = json.loads(_read_own(folder, MANIFEST, MAX_TEXT_BYTES))
            if not (isinstance(data, dict) and set(data) == {"seed", "n", "image_size", "scene_types", "samples"}
                    and isinstance(data["samples"], list)):
                return None
            for e in data["samples"]:
                if not (isinstance(e, dict) and set(e) == _SAVED_KEYS and e["image"] == f"{e['id']}.png"):
                    return None
                images.add(e["image"])
        if METADATA in names:
            for line in _read_own(folder, METADATA, MAX_TEXT_BYTES).decode("utf-8").split("\n"):
                if line.strip():
                    row = json.loads(line)
                    if not (isinstance(row, dict) and set(row) == _EXPORTED_KEYS and row["file_name"] == f"{row['id']}.png"):
                        return None
                    images.add(row["file_name"])
    except (UnicacheError, ValueError, RecursionError, TypeError):
        return None
    return names if names <= _WRITTEN | images else None


def _refuse_foreign(out: Path, samples) -> None:
    """The shipped set's own folder (``data/samples``): refused when it holds anything the generator would not have
    written there (your images, a subfolder, a symlink)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise InputError(f"{out} is a file, not a folder: pass --out a new folder")
    own = _WRITTEN | {f"{s.id}.png" for s in samples}
    if (foreign := sorted(p.name for p in out.iterdir() if p.is_symlink() or not p.is_file()
                          or not (p.name in own or _GENERATED_PNG.fullmatch(p.name)))):
        raise InputError(f"{out} already holds files the sample generator did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}): it writes only into a new or empty folder, never "
                         f"beside your own files; pass another --out (e.g. {out.name}-standard). For your own images, "
                         f"write a {METADATA} beside them instead (samples.load({str(out)!r}) says how)")


def load(path: str | Path | None = None, ids=None, scene_types=None, per_type: int | None = None,
         seed: int | None = None) -> list[Sample]:
    """Load the committed set, or your own folder at ``path`` (:func:`read_folder`), optionally a subset: by id, by
    scene type, or the first ``per_type`` samples of every scene type, so a small subset still covers all five types.

    ``seed``: ``None`` or the committed set's seed loads the files at ``path``; any other seed builds
    that set in memory with the same recipe (same ids, scene types and question-type rotation), with ``per_type``
    samples of each type where that is more than the committed set has (the settling runs of ``make settle``).

    Every layout (``manifest.json``, ``metadata.jsonl``, a LLaVA-style JSON) is parsed into the same records and
    checked by the same function (:func:`_samples_from_records`), so one rule holds for all of them."""
    if path is not None and not isinstance(path, (str, Path)):
        raise InputTypeError(f"the samples folder must be a path (str or Path) or None (the shipped set), got "
                             f"{type(path).__name__} {path!r}")
    per_type = None if per_type is None else _whole(per_type, "per_type", 1, 10**9)
    seed = None if seed is None else _whole(seed, "seed", 0, 2**32 - 1)
    path = SAMPLES_DIR if path is None else project_path(path)  # None: the shipped set; relative: from the repository
    layout, llava = _layout(path)
    if layout is None:
        raise MissingFileError(_no_sample_set(path))
    set_seed, rows = _rows_from_manifest(path) if layout == "manifest" else (None, None)
    if (why := _seed_problem(path, layout, seed, set_seed, rows)):
        raise InputError(why)
    if layout == "folder":
        return _select(read_folder(path, llava), ids, scene_types, per_type, own=True)
    n_per = max(collections.Counter(row.get("scene_type") for _, row in rows).values(), default=0)
    if seed is not None and seed != set_seed:
        _whole(max(n_per, per_type or 0), "per_type", 0, MAX_PER_TYPE)  # built in memory: bounded
        return _select(build(seed, max(n_per, per_type or 0)), ids, scene_types, per_type)  # larger when asked
    if per_type is not None and per_type > n_per:
        raise InputError(f"the committed set at {path} has {n_per} samples per scene type, {per_type} were asked for: "
                         f"pass another SAMPLE_SEED (a set of the same recipe is built with {per_type} per type), or "
                         f"PER_TYPE <= {n_per}")
    return _select(_samples_from_records(path, rows, path / MANIFEST, "image", "id"), ids, scene_types, per_type,
                   own=not _generated(path, rows, set_seed))


def _generated(path: Path, rows, seed: int = SEED) -> bool:
    """Whether the manifest folder ``path`` is a standard set (the shipped folder, one the generator marked, or every
    entry a standard sample ``<scene type>-<n>`` of its scene type): only such a set has a recipe another seed can
    draw from. A manifest of your own images is your own folder, as a metadata.jsonl is."""
    try:
        if path.resolve() == SAMPLES_DIR.resolve():
            return True
    except OSError:
        return False

    info = _marker(path) if os.path.lexists(path / OUTPUT_MARKER) else None
    if info is not None and info.get("written_by") == TOOL:  # while every file holds what the generator wrote
        content = _content(info)  # (a picture replaced, a sample added: the folder is yours now)
        return not any(_not_ours(path, rel, content.get(rel), TOOL) for rel in _written_by(info, TOOL))
    if not (rows and all(isinstance(r.get("id"), str) and _GENERATED_PNG.fullmatch(f"{r['id']}.png")
                         and r["id"].rsplit("-", 1)[0] == r.get("scene_type") for _, r in rows)):
        return False
    # no marker (copied without it): standard only if it holds every sample the recipe draws, each field, picture and
    # mask as drawn (an edited mask, object or prompt, or a subset, is your own folder, as the marked rule has it)
    per = max(sum(r["scene_type"] == t for _, r in rows) for t in SCENE_TYPES)
    built = {s.id: s for s in build(seed, per)} if isinstance(seed, int) and 0 < per <= MAX_PER_TYPE else {}
    try:
        mine = _samples_from_records(path, rows, path / MANIFEST, "image", "id")
        return sorted(s.id for s in mine) == sorted(built) and all(
            np.array_equal(x, y) if isinstance(y, np.ndarray) else json.dumps(x, sort_keys=True) == json.dumps(
                y, sort_keys=True) for s in mine for x, y in ((v, getattr(built[s.id], k)) for k, v in vars(s).items()))
    except (UnicacheError, OSError, KeyError):
        return False


def _seed_problem(path: Path, layout: str, seed, set_seed, rows) -> str | None:
    """Why ``seed`` cannot be used with the samples at ``path`` (one rule for every layout): another seed draws another
    standard set, so it is refused for your own folder (a metadata.jsonl, a LLaVA JSON or a manifest of your own
    images), which has no recipe to draw from; None when it can."""
    if seed is None or seed == (set_seed if layout == "manifest" else SEED):
        return None
    if layout == "manifest" and _generated(path, rows, set_seed):
        return None
    return (f"{path} is your own sample folder: it has no seed to draw another set from (SAMPLE_SEED={seed} would "
            f"measure a synthetic standard set in place of your samples); pass "
            + (f"SAMPLE_SEED={set_seed} (its manifest's)" if layout == "manifest" else f"SAMPLE_SEED={SEED} (the default)")
            + f" with it (in code: seed=None)")


def seed_refusal(path, seed) -> str | None:
    """For a notebook's check cell: why ``SAMPLE_SEED=seed`` cannot go with ``SAMPLES=path`` (:func:`_seed_problem`),
    or None."""
    path = project_path(path)
    layout, _ = _layout(path)
    if layout is None:
        return None
    set_seed, rows = _rows_from_manifest(path) if layout == "manifest" else (None, None)
    return _seed_problem(path, layout, seed, set_seed, rows)


def _whole(value, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]`` (numpy integers too), or a refusal naming ``what`` and the range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(f"{what} must be a whole number in {lo}..{hi}, got {type(value).__name__} {value!r}")
    if not lo <= int(value) <= hi:
        raise InputError(f"{what}={value} is outside {lo}..{hi}" + (f": a set of {MAX_PER_TYPE} per scene type "
                         f"({MAX_PER_TYPE * len(SCENE_TYPES)} samples) is the most one run builds" if what == "per_type"
                         and int(value) > hi else ": keep at least one sample of each scene type" if what == "per_type"
                         else ""))
    return int(value)


def _layout(path: Path) -> tuple[str | None, tuple | None]:
    """``("manifest", None)``, ``("folder", None)`` (a metadata.jsonl), ``("folder", (json file, parsed))`` (a LLaVA
    JSON) or ``(None, None)``; a folder that cannot even be listed is refused in one line."""
    try:
        if os.path.lexists(path / MANIFEST):
            if os.path.lexists(path / METADATA):
                raise InputError(f"{path} holds both {MANIFEST} (the generator's layout) and {METADATA} (your samples' "
                                 f"layout): only one would be read, the other's samples silently left out; keep one "
                                 f"(move the other and its images to a folder of their own)")
            _no_llava_beside(path, MANIFEST, "the generator's layout")
            return "manifest", None
        if not path.is_dir():
            return None, None
        if os.path.lexists(path / METADATA):
            _no_llava_beside(path, METADATA, "your samples' layout")
            return "folder", None
        llava = _llava_json(path)
        return ("folder", llava) if llava else (None, None)
    except OSError as e:
        raise InputError(f"{path}: cannot be read as a samples folder ({e.strerror or e}): pass an existing folder "
                         f"with a short path") from e


def _no_llava_beside(path: Path, name: str, what: str) -> None:
    """Refuse a folder holding ``name`` (``manifest.json`` or ``metadata.jsonl``) and a LLaVA-style conversations JSON
    too: only one layout would be read, the other's samples left out without a word."""
    llava = _llava_json(path)
    if llava is not None:
        raise InputError(f"{path} holds both {name} ({what}) and {llava[0].name} (a LLaVA-style conversations file): "
                         f"only one would be read, the other's samples silently left out; keep one (move the other and "
                         f"its images to a folder of their own)")


def metadata_command(path: Path, suffixes=_IMAGE_SUFFIXES) -> str:
    """A shell command that writes a first ``metadata.jsonl`` for the images (``suffixes``) in ``path``, one line per
    image asking "what is in the image ?": the folder is a Python literal inside the program, and the program one
    shell word (shlex.quote), so any folder name (quotes, ``$(...)``, spaces) is taken as it is, never run."""
    kinds = "(" + "".join(json.dumps(x) + ", " for x in suffixes) + ")"
    code = (f'import json, pathlib; d = pathlib.Path({str(path)!r}); (d / "{METADATA}").write_text("".join(json.dumps('
            f'{{"file_name": p.name, "question": "what is in the image ?"}}) + chr(10) for p in sorted(d.iterdir()) if '
            f'p.suffix.lower() in {kinds}))')
    return f"python -c {shlex.quote(code)}"


def _no_sample_set(path: Path) -> str:
    """What to do with a folder that has no sample file: for a folder of your own images, how to write its
    metadata.jsonl (the generator never writes into it); otherwise where a sample set comes from."""
    try:
        images = sorted(p.name for p in path.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES) if path.is_dir() else []
    except OSError:
        images = []
    if images:
        suffixes = tuple(sorted({Path(n).suffix.lower() for n in images}))
        return (f"{path} holds {len(images)} image{'s' * (len(images) != 1)} ({', '.join(images[:2])}{', ...' if len(images) > 2 else ''}) but "
                f"no {METADATA} saying what to ask about each: write one JSON line per image beside them, e.g. "
                f'{{"file_name": "{images[0]}", "question": "what colour is the circle ?", "answer": "red"}} (answer, '
                f"scene_type and objects optional), for instance with the shell command  {metadata_command(path, suffixes)}  "
                f"(then edit each question and add its answer); your images stay as they are")
    return (f"no sample set at {path}: pass a folder in the Hugging Face imagefolder layout (your images and a "
            f"{METADATA} with file_name and question per line, answer optional) or a LLaVA-style conversations JSON "
            f"beside its images; `python -m unicache_lib.world.samples --folder --out <a new folder>` writes an example "
            f"of the layout")


def export_folder(samples: list[Sample], out: str | Path) -> Path:
    """Write ``samples`` in the Hugging Face ``imagefolder`` layout: the PNGs, a ``metadata.jsonl`` (``file_name``,
    ``question``, ``answer`` and the rest of each sample) and the object masks in ``masks.npz`` (keyed by
    ``file_name``). ``datasets.load_dataset("imagefolder", data_dir=out)`` reads it, and so does :func:`load`.
    ``out`` is a new or empty folder, or one this generator wrote before (:func:`_generator_folder`); every id must be
    a plain name (:func:`_id_problem`)."""
    _check_ids(samples)
    if _is_shipped(out):
        return _into_shipped(samples, lambda folder: export_folder(samples, folder))
    folder, names = _write_images(samples, out, [METADATA, METADATA + ".tmp"], lambda s: f"{s.id}.png")
    tmp = folder.path / (METADATA + ".tmp")
    tmp.write_text("\n".join(json.dumps({"file_name": f"{s.id}.png", "id": s.id, "question": s.question,
                                         "answer": s.answer, "qtype": s.qtype, "scene_type": s.scene_type,
                                         "objects": s.objects, "caption": s.caption, "short_prompt": s.short_prompt,
                                         "long_prompt": s.long_prompt}) for s in samples) + "\n")
    tmp.replace(folder.path / METADATA)
    folder.record(names, wrote=names)  # their SHA-256: a later run replaces only files that still hold this
    return folder.path


# ---- a folder's files: inside it, regular files, of a bounded size --------------------------------------------
MAX_TEXT_BYTES = 64 << 20  # metadata.jsonl, a LLaVA JSON, manifest.json
MAX_IMAGE_BYTES = 256 << 20  # one image file as stored
MAX_MASK_BYTES = 1 << 30  # masks.npz as stored, and unpacked


def _how(where: str, key: str, listed: bool) -> tuple[str, str]:
    """``(what, fix)`` for :func:`~unicache_lib.core.untrusted.open_inside`'s one-line refusals: a path from a line of
    data (``where``, its ``key``), or one of the folder's own files (``metadata.jsonl``, ``masks.npz``, ...)."""
    if listed:
        return (f"{where}: {key}", f"Only regular files inside the folder are read: put the file in it and give {key} "
                                   f"relative to it, e.g. 'images/x.png'")
    return "the samples file", ("Only regular files inside the folder are read: put the file itself there (not a link, "
                                "a pipe or a device)")


def _locate(root: Path, rel, where: str, key: str, limit: int, listed: bool = True):
    """``rel`` once it is known to name a regular file inside ``root`` (after every symlink; a NUL byte, an over-long
    name, a loop, a link out, a FIFO, device or folder each refused in its own words, nothing opened) of at most
    ``limit`` bytes. ``listed``: ``rel`` came from a line of data (``where``, its ``key``); else it is one of the
    folder's own files."""
    what, fix = _how(where, key, listed)
    st = stat_inside(root, rel, what=what, fix=fix)
    if st is None:
        raise MissingFileError(f"{where}: {root / rel} is listed but not there: put the file in the folder or fix {key}"
                               if listed else f"{root / rel} is not there")
    _check_size(st.st_size, f"{what} {rel!r}", limit)
    return rel


def _check_size(size: int, label: str, limit: int) -> None:
    if size > limit:
        raise InputError(f"{label} is {size:,} bytes, more than the {limit:,} read from a samples folder for such a "
                         f"file: shrink it (or split the folder)")


def _read_bytes(root: Path, rel: str, where: str, key: str, limit: int, listed: bool = True) -> bytes:
    """The bytes of the file :func:`_locate` found, opened by :func:`~unicache_lib.core.untrusted.open_inside` (the
    same checks again, without blocking and without following a part swapped for a link meanwhile), at most
    ``limit``."""
    what, fix = _how(where, key, listed)
    fd = open_inside(root, rel, what=what, fix=fix)
    with os.fdopen(fd, "rb") as f:
        _check_size(os.fstat(fd).st_size, f"{what} {rel!r}", limit)
        data = f.read(limit + 1)
    _check_size(len(data), f"{what} {rel!r}", limit)  # grew while it was read
    return data


def _read_own(root: Path, name: str, limit: int) -> bytes:
    """One of the folder's own files (``metadata.jsonl``, ``masks.npz``, a LLaVA JSON, ``manifest.json``)."""
    _locate(root, name, str(root), name, limit, listed=False)
    return _read_bytes(root, name, str(root), name, limit, listed=False)


def _json(data: bytes, path: Path):
    """``data`` parsed as one JSON document, refused naming the file (nesting too deep to parse included)."""
    text = decode_utf8(data, path)
    try:
        return json_loads(text)
    except RepeatedKeyError as e:
        raise InputError(f"{path}: {e}: keep one") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}, line {e.lineno}: not JSON ({e.msg}): fix the file, or write the samples as a "
                         f"{METADATA} (one JSON object per line)") from e
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read as JSON: write flat records") from None


# ---- every layout parsed into the same records: (where, row) with row["file_name"] the image ------------------
def _rows_from_manifest(path: Path) -> tuple[int, list[tuple[str, dict]]]:
    """The seed and the ``(where, row)`` records of a ``manifest.json`` (the shipped layout): each entry's ``image``
    is its ``file_name``; every other field is checked as a metadata.jsonl line is."""
    mf = path / MANIFEST
    data = _json(_read_own(path, MANIFEST, MAX_TEXT_BYTES), mf)
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise InputError(f"{mf}: a manifest is an object with a 'samples' list (what `python -m unicache_lib.world."
                         f"samples` writes); for your own images write a {METADATA} instead")
    seed = data.get("seed", SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"{mf}: 'seed' must be a whole number >= 0, got {seed!r}")
    rows = []
    for i, e in enumerate(data["samples"]):
        where = f"{mf}, sample {i}"
        if not isinstance(e, dict) or "image" not in e or "question" not in e:
            raise InputError(f"{where}: every sample needs an 'image' and a 'question' (id, answer, objects and the "
                             f"rest are optional); fix the entry")
        if "file_name" in e:  # a manifest names its image 'image': which of the two was meant is not ours to guess
            raise InputError(f"{where}: both 'image' and 'file_name': a manifest entry names its image 'image'; "
                             f"remove 'file_name'")
        rows.append((where, {k: v for k, v in e.items() if k != "image"} | {"file_name": e["image"]}))
    return seed, rows


def _rows_from_metadata(path: Path) -> list[tuple[str, dict]]:
    """The ``(where, row)`` records of a ``metadata.jsonl``: one JSON object per line (split on newlines only, so a
    U+2028 inside a string stays in it)."""
    meta = path / METADATA
    rows = []
    for n, row in jsonl_rows(meta, decode_utf8(_read_own(path, METADATA, MAX_TEXT_BYTES), meta)):
        where = f"{meta}, line {n}"
        if (missing := [k for k in FOLDER_KEYS if not isinstance(row, dict) or k not in row]):
            raise InputError(f"{where}: no {' or '.join(repr(k) for k in missing)}: every line needs "
                             f"{', '.join(FOLDER_KEYS)} (answer, objects and masks are optional)")
        rows.append((where, row))
    return rows


def _llava_json(path: Path) -> tuple[Path, list] | None:
    """The one LLaVA-style conversations JSON of a folder (a list of ``{"image", "conversations"}``) and its parsed
    entries, if any. JSON files that parse but are not such a list (``manifest.json``, a ``dataset_info.json``) are
    passed over; a ``*.json`` that does not parse (cut short, UTF-16, not JSON) is refused naming it, since it may be a
    conversations file whose samples would be left out without a word; a UTF-8 byte-order mark (Windows tools write
    one) is read past. One that is a symlink out of the folder, a FIFO, a device or too large is refused (it is never
    opened)."""
    found = []
    for f in sorted(path.glob("*.json")):
        if f.is_dir() and not f.is_symlink():
            continue
        data = _read_own(path, f.name, MAX_TEXT_BYTES)
        why = (f"a *.json in a samples folder is read as a LLaVA-style conversations file if it is one, and one that "
               f"cannot be read would leave its samples out without a word")
        try:
            entries = json_loads(data.decode("utf-8-sig"))
        except RepeatedKeyError as e:
            raise InputError(f"{f}: {e}: keep one") from None
        except UnicodeDecodeError as e:
            utf16 = ", a UTF-16 file" if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else ""
            raise InputError(f"{f}: not UTF-8 text (byte {e.start}{utf16}): {why}; save it as UTF-8, or move it out of "
                             f"the folder") from None
        except json.JSONDecodeError as e:
            raise InputError(f"{f}, line {e.lineno}: not JSON ({e.msg}): {why}; fix it (a list of {{\"image\", "
                             f"\"conversations\"}} objects), or move it out of the folder") from None
        except RecursionError:
            raise InputError(f"{f}: nested too deeply to read as JSON: {why}; write flat records, or move it out of "
                             f"the folder") from None
        if isinstance(entries, list) and entries and isinstance(entries[0], dict) and "conversations" in entries[0]:
            found.append((f, entries))
    if len(found) > 1:
        raise InputError(f"{path} holds {len(found)} LLaVA-style conversation files ({', '.join(f.name for f, _ in found[:3])}"
                         f"{', ...' if len(found) > 3 else ''}): only one would be read, the others' samples silently "
                         f"left out; put each in a folder of its own beside its images (e.g. train/ and val/) and pass "
                         f"that folder")
    return found[0] if found else None


def _rows_from_llava(f: Path, entries: list) -> list[tuple[str, dict]]:
    """``(where, row)`` per entry: ``where`` names the file and the entry for every refusal."""
    rows = []
    for i, e in enumerate(entries):
        where = f"{f}, entry {i}"
        turns = e.get("conversations") if isinstance(e, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            turns = None
        human = next((t.get("value") for t in turns or [] if t.get("from") == "human"), None)
        if turns is None or "image" not in e or not isinstance(human, str):
            raise InputError(f"{where}: a LLaVA-style entry is an object with an 'image' and a 'conversations' list "
                             "whose 'human' turn has a text 'value'; fix it, or convert the file to metadata.jsonl "
                             "(file_name, question)")
        n_q = sum(t.get("from") == "human" for t in turns)
        n_a = sum(t.get("from") == "gpt" for t in turns)
        if n_q > 1 or n_a > 1:
            raise InputError(f"{where}: a conversation of {n_q} questions and {n_a} answers; a sample is one question "
                             f"and its answer, and the later turns would be dropped: split the entry into one entry "
                             f"per turn (the same image, each with its own 'id')")
        answer = next((t.get("value") for t in turns if t.get("from") == "gpt"), None)
        rows.append((where, {"file_name": e["image"], "question": human.replace("<image>", "").strip(), "answer": answer}
                     | ({"id": e["id"]} if "id" in e else {})))
    return rows


# what a record may hold beside file_name and question, and the type each must have
_TEXT_FIELDS = ("qtype", "scene_type", "caption", "short_prompt", "long_prompt")
_OBJECT_KEYS = ("colour", "shape", "position")
_HIGH_BIT_MODES = {"I": 32, "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16, "F": 32}


def _check_row(where: str, row: dict) -> dict:
    """The fields of one record, type by type; a wrong one is refused naming ``where``, the field and the fix. A key
    of your own is left alone, but one that looks like a misspelt field (``anwser``, ``Question``) is refused: its
    value would be ignored, and the sample left unscored, without a word."""
    for k in row:
        low = str(k).lower()  # a short key (qid, type) is more likely one of your own than a misspelling
        if (near := [] if k in _EXPORTED_KEYS else
                difflib.get_close_matches(low, _EXPORTED_KEYS, 1, 0.82 if len(low) > 4 else 1)):
            raise InputError(f"{where}: key {str(k)[:40]!r} is not a field; did you mean {near[0]!r}? (rename it; a "
                             f"misspelt field is ignored)")
    if not isinstance(q := row.get("question"), str) or not q.strip():
        raise InputError(f"{where}: 'question' must be a non-empty text, got {q!r}: write the question the model is "
                         f"asked about the image")
    if (a := row.get("answer")) is not None and not isinstance(a, str):
        hint = (f": write it as the text the model should answer, e.g. \"{int(a)}\" (a number from a spreadsheet export "
                f"reads as {str(a)!r}, which is never scored right)" if isinstance(a, (int, float)) and not isinstance(a, bool)
                and math.isfinite(a) and float(a).is_integer() else ": write it as the text the model should answer, "
                "e.g. \"red\" or \"2\"")
        raise InputError(f"{where}: 'answer' must be a text (or left out), got {type(a).__name__} {a!r}{hint}")
    if "id" in row and (isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)) or not str(row["id"]).strip()):
        raise InputError(f"{where}: 'id' must be a non-empty text, got {row['id']!r}")
    for k in _TEXT_FIELDS:
        if row.get(k) is not None and not isinstance(row[k], str):
            raise InputError(f"{where}: {k!r} must be a text, got {row[k]!r}")
    if (st := row.get("scene_type")) and st not in SCENE_TYPES:
        raise InputError(f"{where}: scene_type {st!r} is not one of {SCENE_TYPES}: leave it out for your own images")
    if (objs := row.get("objects")) is not None:
        if not isinstance(objs, list) or not all(isinstance(o, dict) for o in objs):
            raise InputError(f"{where}: 'objects' must be a list of objects such as "
                             '{"colour": "red", "shape": "circle", "position": "left"}, got ' + repr(objs)[:80])
        for o in objs:
            if (bad := {k: o.get(k) for k in _OBJECT_KEYS if k in o and not isinstance(o[k], str)}):
                raise InputError(f"{where}: an object's {', '.join(bad)} must be text, got {bad}")
    return row


def _read_image(data: bytes, name: str, where: str) -> np.ndarray:
    """The image file's bytes as ``[H, W, 3]`` uint8 RGB; refused naming the file for what cannot be converted exactly
    (16- and 32-bit images, decompression bombs, unreadable files); transparent pixels warned about as ``inputs_for``
    does."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode in _HIGH_BIT_MODES:
                kind = "32-bit floating-point" if im.mode == "F" else f"{_HIGH_BIT_MODES[im.mode]}-bit"
                raise ImageError(f"{where}: {name} is a {kind} image (mode {im.mode}): only 8-bit images are read "
                                 f"exactly; save it as 8-bit RGB PNG, e.g. Image.fromarray((arr / arr.max() * 255)"
                                 f".round().astype('uint8')).convert('RGB').save(...)")
            if getattr(im, "n_frames", 1) > 1 or im.mode in ("LAB", "HSV"):  # read as frame 0 / converted inexactly
                raise ImageError(f"{where}: {name} " + (f"holds {im.n_frames} frames (an animation or pages): only the "
                                 f"first would be read" if getattr(im, "n_frames", 1) > 1 else f"is in mode {im.mode}, "
                                 f"which PIL converts to RGB inexactly") + ": save the picture you mean as an 8-bit "
                                 f"RGB PNG")
            turned = im.getexif().get(0x0112, 1)  # EXIF orientation: the pixels are stored rotated or mirrored
            if turned not in (1, None):
                raise ImageError(f"{where}: {name} carries EXIF orientation {turned}: its pixels are stored turned and "
                                 f"viewers show it upright, but models (and transformers' processors) read the stored "
                                 f"pixels, so 'left' and 'top' would be wrong; save it upright first, e.g. "
                                 f"PIL.ImageOps.exif_transpose(Image.open(path)).save(path)")
            im.load()
            alpha = im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info
            rgba = np.asarray(im.convert("RGBA")) if alpha else None
            img = np.asarray(im.convert("RGB"))
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageError(f"{where}: {name} has more pixels than PIL's decompression-bomb limit "
                         f"(Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS:,}): resize it first ({e})") from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:  # SyntaxError: PIL's broken-file error
        raise ImageError(f"{where}: {name} is not a readable image ({e}): re-save it as PNG or JPEG") from e
    if rgba is not None and (rgba[..., 3] < 255).any():
        share = float((rgba[..., 3] == 0).mean())
        warnings.warn(f"{Path(name).name}: {share:.0%} of its pixels are fully transparent; the alpha channel is dropped "
                      "(as PIL's convert('RGB') and transformers' convert_to_rgb do), so they show their stored colour. "
                      "Composite it on a background first, e.g. PIL.Image.alpha_composite(PIL.Image.new('RGBA', "
                      "img.size, 'white'), img).convert('RGB')", UserWarning, stacklevel=4)
    return img


def _read_masks(path: Path) -> dict:
    """``masks.npz`` as ``{key: bool [n, H, W]}``: read inside the folder, no pickles, at most :data:`MAX_MASK_BYTES`
    unpacked, 3-D boolean (or 0/1) arrays, or a refusal naming the file and the array."""
    f = path / "masks.npz"
    if not os.path.lexists(f):
        return {}
    data = _read_own(path, "masks.npz", MAX_MASK_BYTES)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise InputError(f"{f} is a single array, not an .npz archive: save it with np.savez_compressed(path, "
                                 f"**{{file_name: masks}})")
            unpacked = sum(i.file_size for i in z.zip.infolist())
            if unpacked > MAX_MASK_BYTES:
                raise InputError(f"{f} unpacks to {unpacked:,} bytes, more than the {MAX_MASK_BYTES:,} read: save one "
                                 f"boolean mask per object at the image's size")
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
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError, MemoryError) as e:
        raise InputError(f"{f} is not a readable .npz of boolean masks ({type(e).__name__}: {e}); pickled or object "
                         f"arrays are never loaded. Save it with np.savez_compressed(path, **{{file_name: bool masks}}) "
                         f"or remove it (masks are optional)") from e


def read_folder(path: str | Path, llava: tuple | None = None) -> list[Sample]:
    """Your own samples: a folder in the imagefolder layout (:data:`METADATA`) or with a LLaVA-style conversations
    JSON (``llava``: that file and its parsed entries, when already found). Every line is checked before anything
    loads, field by field, by the same function as every layout (:func:`_samples_from_records`). What a folder lacks
    stays empty (``answer`` None, no objects, no masks), and the claims that need it say so instead of measuring."""
    path = Path(path)
    if llava is None and not os.path.lexists(path / METADATA):
        llava = _llava_json(path)
    elif llava is None:
        _no_llava_beside(path, METADATA, "your samples' layout")
    rows, source, key = ((_rows_from_llava(*llava), llava[0], "image") if llava is not None
                         else (_rows_from_metadata(path), path / METADATA, "file_name"))
    return _samples_from_records(path, rows, source, key, "file_name")


def _samples_from_records(path: Path, rows: list[tuple[str, dict]], source: Path, key: str,
                          masks_by: str) -> list[Sample]:
    """The one check every samples layout goes through: each record's fields (:func:`_check_row`), its image file
    (inside the folder, a regular file, an 8-bit image), unique ids (both records named), masks that fit their image
    (``masks.npz`` keyed by ``masks_by``: ``"file_name"`` for your folders, ``"id"`` for the manifest). ``key``: what
    the records call the image (``file_name`` or ``image``), for the messages."""
    if not rows:
        raise InputError(f"{source} lists no samples: add one line per image")
    for where, row in rows:
        _check_row(where, row)
    for where, row in rows:  # every image file located before any is read
        _locate(path, row["file_name"], where, key, MAX_IMAGE_BYTES)
    seen: dict[str, str] = {}
    keys: dict[str, tuple[str, str]] = {}  # _id_key -> (id, where)
    for where, row in rows:
        sid = str(row.get("id", Path(str(row["file_name"])).stem))
        if (why := _id_problem(sid)):
            raise InputError(f"{where}: sample id {sid[:80]!r} {why}: an id names the sample's records and its file when "
                             f"the set is written (<id>.png), so it must be a plain name such as 'cat-1'; give the line "
                             f"its own 'id'")
        if sid in seen:
            raise InputError(f"{where}: sample id {sid!r} is also {seen[sid]}'s: ids name a sample's records, so two "
                             f"samples cannot share one; give every line its own 'id'")
        if _id_key(sid) in keys:
            other, there = keys[_id_key(sid)]
            raise InputError(f"{where}: sample id {sid!r} and {there}'s {other!r} {TWIN_IDS} (give it its own "
                             f"'id')")
        seen[sid] = where
        keys[_id_key(sid)] = (sid, where)
    masks = _masks_by_sample(path, rows, list(seen), masks_by)
    out = []
    for (where, row), sid in zip(rows, seen):
        img = _read_image(_read_bytes(path, row["file_name"], where, key, MAX_IMAGE_BYTES), row["file_name"], where)
        mk, m = masks.get(sid, (None, np.zeros((0, *img.shape[:2]), bool)))
        objects = list(row.get("objects") or [])
        if mk is not None and objects and len(m) != len(objects):
            raise InputError(f"{where}: masks.npz[{mk!r}] holds {len(m)} mask(s) but the line lists {len(objects)} "
                             f"object(s) ({', '.join(map(str, objects[:3]))}{', ...' if len(objects) > 3 else ''}): "
                             f"mask i is object i's, so save one mask per listed object, in the same order")
        if m.shape[1:] != img.shape[:2]:
            raise InputError(f"masks.npz[{mk!r}] is {tuple(m.shape)}, not [n_objects, {img.shape[0]}, "
                             f"{img.shape[1]}] like its image: save one boolean mask per object at the image's size")
        out.append(Sample(sid, row.get("scene_type") or "", img, m, objects, row["question"],
                          None if row.get("answer") is None else str(row["answer"]), row.get("qtype") or "",
                          row.get("caption") or "",
                          row.get("short_prompt") or "", row.get("long_prompt") or ""))
    return out


def _masks_by_sample(path: Path, rows, ids: list[str], masks_by: str) -> dict[str, tuple[str, np.ndarray]]:
    """``{sample id: (masks.npz key, masks)}``, one rule for every layout: a key names a sample by its ``file_name``
    (as a path: ``./a.png`` is ``a.png``) or by its ``id`` (the shipped manifest's convention, ``masks_by``); every
    key must name exactly one sample, and a sample be named by one key: a key that matches no sample (``A.png`` for
    ``a.png``, a typo, another folder's masks) is refused naming it, never silently ignored."""

    masks = _read_masks(path)
    if not masks:
        return {}
    by_name: dict[str, list[str]] = {}  # one picture, several questions: its masks are every such sample's
    for (_, row), sid in zip(rows, ids):
        by_name.setdefault(posixpath.normpath(str(row["file_name"])), []).append(sid)
    by_id = {sid: sid for sid in ids}
    out: dict[str, tuple[str, np.ndarray]] = {}
    for k, m in masks.items():
        via_name, via_id = by_name.get(posixpath.normpath(k), []), by_id.get(k)
        named = set(via_name) or ({via_id} if via_id else set())
        if not named:
            close = difflib.get_close_matches(k, sorted(set(by_name) | (set(by_id) if masks_by == "id" else set())), 3)
            raise InputError(f"{path / 'masks.npz'}: key {k[:80]!r} names no sample of the folder (keys are the "
                             f"samples' file_name{', or their id' if masks_by == 'id' else ''}, exactly, case "
                             f"included)" + (f"; did you mean {' or '.join(map(repr, close))}?" if close else "")
                             + ": rename the key or remove it; a mask no sample uses is never silently dropped")
        if len({json.dumps(rows[ids.index(sid)][1].get("objects"), sort_keys=True) for sid in named}) > 1:  # a mask is the i-th listed object's: two lists would give one of them the wrong masks
            raise InputError(f"{path / 'masks.npz'}: key {k[:80]!r} is the picture of {' and '.join(sorted(named))}, "
                             f"whose lines list other objects: list the same objects in the same order on every line "
                             f"about one picture")
        if via_name and via_id and via_id not in via_name:
            raise InputError(f"{path / 'masks.npz'}: key {k[:80]!r} is one sample's file_name and another's id "
                             f"({' and '.join(sorted(named | {via_id}))}): key the masks by file_name only")
        for sid in sorted(named):
            if sid in out:
                raise InputError(f"{path / 'masks.npz'}: sample {sid!r} has masks under two keys ({out[sid][0]!r} and "
                                 f"{k!r}): keep one")
            out[sid] = (k, m)
    return out


def _names(value, what: str, e_g: str, allowed=None) -> set | None:
    """``ids`` / ``scene_types`` as a set of exact names: a list (tuple, set) of texts; a single string is refused (it
    would be matched character by character, or as a substring), and so is a scene type that does not exist."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise InputTypeError(f"{what} must be a list of exact names, e.g. {what}={e_g}, got {type(value).__name__} "
                             f"{value!r}" + (f": pass [{value!r}] for one, or split a comma-separated string"
                                             if isinstance(value, str) else ""))
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise InputTypeError(f"{what} must be a list of names (texts), got {bad[0]!r} in it")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise UnknownNameError(f"{what}: no scene type {unknown[0]!r}; the scene types are {list(allowed)}")
    return set(value)


def _select(samples: list[Sample], ids=None, scene_types=None, per_type: int | None = None,
            own: bool = False) -> list[Sample]:
    """The samples asked for; ``own``: a folder of yours, which PER_TYPE never thins without a word."""
    ids = _names(ids, "ids", "['single-0', 'clutter-1']")
    scene_types = _names(scene_types, "scene_types", "['single', 'clutter']", SCENE_TYPES)
    rank, seen = [], {}
    for s in samples:  # the i-th sample of its scene type (the standard sets' "type-i" ids; your folder's order)
        rank.append(seen.get(s.scene_type, 0))
        seen[s.scene_type] = rank[-1] + 1
    out = [s for s, r in zip(samples, rank) if (ids is None or s.id in ids)
           and (scene_types is None or s.scene_type in scene_types) and (per_type is None or r < per_type)]
    chosen = {t: k for t, k in seen.items() if scene_types is None or t in scene_types}  # only these were thinned
    untyped, most, of = seen.get("", 0), max(chosen.values(), default=0), sum(chosen.values())
    if own and per_type is not None and most > per_type and ids is None:  # your folder thinned: say so
        kept = (f"the first {per_type} of your {untyped} samples without a scene_type (per_type / PER_TYPE={per_type} "
                f"counts them as one type)" if untyped == len(samples) else f"{len(out)} of your {of} samples"
                f"{' of these scene types' if scene_types else ''}, the first {per_type} of each scene type (per_type "
                f"/ PER_TYPE={per_type})")
        warnings.warn(f"kept {kept}: pass PER_TYPE={most} to take them all", UserWarning, stacklevel=3)
    if ids is not None and (missing := set(ids) - {s.id for s in out}):
        if unknown := missing - {s.id for s in samples}:
            raise UnknownNameError(f"unknown sample ids {sorted(unknown)}; known: {[s.id for s in samples]}")
        by_type = scene_types is not None and any(s.scene_type not in scene_types for s in samples if s.id in missing)
        raise InputError(f"sample ids {sorted(missing)} are in the folder but left out by " + (
            "scene_types" if by_type else f"PER_TYPE={per_type}, which keeps the first {per_type} of each scene type")
            + ": drop them from ids, or widen that choice")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(SAMPLES_DIR))
    ap.add_argument("--seed", type=int, default=SEED, help=f"another standard set (the shipped one: {SEED})")
    ap.add_argument("--folder", action="store_true", help="write the imagefolder layout (metadata.jsonl), the layout "
                    "your own samples take, instead of the shipped manifest")
    args = ap.parse_args(argv)
    try:  # a folder holding files the generator did not write is refused in one line, nothing written
        samples = build(_whole(args.seed, "--seed", 0, 2**32 - 1))
        if args.folder:
            print(f"wrote {len(samples)} samples to {export_folder(samples, args.out)} (imagefolder layout)")
            return
        save(samples, args.out, args.seed)
    except UnicacheError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    print(f"wrote {len(samples)} samples to {args.out}")


if __name__ == "__main__":
    main()
