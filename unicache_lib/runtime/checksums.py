"""sha256 of a model folder's weight files: recorded in its ``model_card.json``, checked when it loads.

Every writer of a model card (the training scripts, the stand-ins) goes through :func:`write_card`,
which adds ``"checksums": {"relative/path": "sha256hex", ...}`` for each weight file under the folder
(``*.safetensors``, ``*.bin``; for a generator the files under ``transformer/``, ``text_encoder/``, ...).
The loaders call :func:`verify_checksums`. After changing a model's weights on purpose, record the new
ones with

    python -m unicache_lib.runtime.checksums FOLDER [FOLDER ...]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
from pathlib import Path

from ..core.errors import ChecksumError, InputError
from ..core.untrusted import write_inside

CARD = "model_card.json"
KEY = "checksums"
WEIGHT_SUFFIXES = (".safetensors", ".bin")

# (path, inode, size, mtime_ns, ctime_ns) -> sha256: a notebook reloading rehashes nothing. ctime is in the key because
# an in-place edit that restores size and mtime (os.utime) cannot restore it: the change time moves with every write.
_digests: dict[tuple[str, int, int, int, int], str] = {}


def read_json(f: Path) -> dict:
    """A model folder's JSON file; a truncated or hand-broken one names itself and the fix."""
    try:
        return json.loads(Path(f).read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{f} is not valid JSON ({e.msg}, line {e.lineno} column {e.colno}): the file was cut short "
                         f"or edited by hand; copy it again from the original checkpoint") from e


def sha256_file(path: str | Path) -> str:
    """The sha256 hex digest of a file, cached within the process (see ``_digests``)."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _digests:
        with open(path, "rb") as f:
            _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _digests[key]


def weight_files(folder: str | Path) -> list[str]:
    """The relative posix paths of the weight files under ``folder``, sorted: a linked component folder directly in it
    (a text encoder shared with ``ln -s``) is listed too, its own files only, as the loader reads it; no other link to a
    folder is followed (a link to ``/`` or back up would walk the disk, or loop)."""
    out = []
    for d, dirs, names in os.walk(folder, followlinks=True):
        top = os.path.normpath(os.path.dirname(d)) == os.path.normpath(folder)  # a component folder (text_encoder/)
        dirs[:] = [] if top and os.path.islink(d) else [x for x in dirs if not os.path.islink(os.path.join(d, x))
                                                         or os.path.normpath(d) == os.path.normpath(folder)]
        out += [Path(d, f).relative_to(folder).as_posix() for f in names if f.endswith(WEIGHT_SUFFIXES)
                and Path(d, f).is_file()]
    return sorted(out)


def weight_checksums(folder: str | Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every weight file under ``folder``, sorted by path."""
    return {rel: sha256_file(Path(folder) / rel) for rel in weight_files(folder)}


def write_card(folder: str | Path, card: dict) -> Path:
    """Write ``card`` as ``folder/model_card.json`` (``indent=1``) with the checksums of the weights now in
    ``folder`` under ``"checksums"`` (last key; a previous value is replaced). Returns the card's path."""
    folder = Path(folder)
    card = {k: v for k, v in card.items() if k != KEY} | {KEY: weight_checksums(folder)}
    return write_inside(folder, CARD, json.dumps(card, indent=1).encode(), what="model card", fix=(
        "it may be another folder's (a `cp -rs` copy): replace the link by a copy of the file (cp --remove-destination)"
        " before recording new checksums"))  # atomic: a hard-linked card is replaced, never written through


def verify_checksums(folder: str | Path, remedy: str | None = None, required: bool = False) -> int:
    """Check the weight files of ``folder`` against its card's ``"checksums"``; returns how many were checked.

    A folder without a card, or whose card records no checksums, passes (0 checked) unless ``required``.
    Raises :class:`ChecksumError` naming the first file that differs (with both digests), is missing, or
    is a weight file the card does not record. ``remedy``: what the message tells the user to do.
    """
    folder = Path(folder)
    card_path = folder / CARD
    card = read_json(card_path) if card_path.is_file() else {}
    remedy = remedy or (f"re-copy or re-save the model; if you changed its weights on purpose, load it with "
                        f"verify=False or record the new checksums with "
                        f"`python -m unicache_lib.runtime.checksums {shlex.quote(str(folder))}`")
    expected = card.get(KEY)
    if expected is None:
        if required:
            raise ChecksumError(f"{card_path} records no weight checksums. To fix: {remedy}")
        return 0
    listed = set(weight_files(folder))  # a card names only these: never a file outside the folder, never opened
    for rel, digest in expected.items():
        f = folder / rel
        if rel not in listed and (Path(rel).is_absolute() or ".." in Path(rel).parts):
            raise ChecksumError(f"{card_path} names {rel!r}, outside the model folder: re-copy the model")
        if rel not in listed:
            raise ChecksumError(f"weight file {f} is missing (recorded in {card_path}). To fix: {remedy}")
        actual = sha256_file(f)
        if actual != digest:
            raise ChecksumError(f"weight file {f} is corrupted or changed: sha256 {actual}, but {card_path} records "
                                f"{digest}. To fix: {remedy}")
    extra = sorted(listed - set(expected))
    if extra:
        raise ChecksumError(f"weight file {folder / extra[0]} is not recorded in {card_path}'s checksums. "
                            f"To fix: {remedy}")
    return len(expected)


def main(argv=None) -> None:
    """Record the current weights' checksums in each folder's card (the rest of the card is kept)."""
    ap = argparse.ArgumentParser(description="Record the sha256 of each weight file in FOLDER/model_card.json.")
    ap.add_argument("folders", nargs="+", type=Path)
    for folder in ap.parse_args(argv).folders:
        if not folder.is_dir():
            raise SystemExit(f"no such folder: {folder}")
        card_path = folder / CARD
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        try:
            n = len(json.loads(write_card(folder, card).read_text())[KEY])
        except InputError as e:
            raise SystemExit(f"checksums: {e}") from None  # one line, nothing written
        print(f"{card_path}: {n} weight files recorded")


if __name__ == "__main__":
    main()
