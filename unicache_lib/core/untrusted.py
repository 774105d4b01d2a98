"""Text and paths that come from a reader's data: the one place each is made safe.

A samples folder, a prompts file, a store's index or a decisive run's shard is untrusted input. Three rules, each with
one helper here, used wherever such input is read or shown:

- a path read from data names a file *inside* the folder it came from (:func:`inside`, :func:`file_inside`): no
  ``..``, no absolute path, no symlink that leaves the folder;
- text from data that meets HTML is escaped (:func:`html_text`), quotes included, so it can sit in an attribute;
- a text file from data is decoded as UTF-8 with a refusal that names the file and the line (:func:`read_utf8`).

Matplotlib text from data is drawn with math text off (``parse_math=False``), so a label such as ``$\\frac{$`` is
shown as typed instead of failing the figure.
"""
from __future__ import annotations

import html
from pathlib import Path

from .errors import InputError, MissingFileError


def inside(base: str | Path, rel) -> Path | None:
    """``base / rel`` when ``rel`` is a non-empty relative path that stays inside ``base``, also after every symlink
    is resolved; ``None`` for ``..``, an absolute path, a symlink that leaves ``base``, or anything not a string."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return None
    r = Path(rel)
    if r.is_absolute() or r.drive or ".." in r.parts:
        return None
    base = Path(base)
    p = base / r
    try:
        p.resolve().relative_to(base.resolve())
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11's resolve)
        return None
    return p


def file_inside(base: str | Path, rel, where: str, key: str = "file_name") -> Path:
    """:func:`inside`, refusing with a message that names ``where`` (a file and line) and the fix; the file must exist."""
    p = inside(base, rel)
    if p is None:
        raise InputError(f"{where}: {key} {rel!r} points outside {base} (an absolute path, '..' or a symlink that "
                         f"leaves the folder). Only files inside the folder are read: copy the image into it and give "
                         f"{key} relative to it, e.g. 'images/x.png'")
    if not p.is_file():
        raise MissingFileError(f"{where}: {p} is listed but not there: put the image beside it or fix {key}")
    return p


def html_text(text) -> str:
    """``text`` (anything: ``str()`` is taken) escaped for HTML, quotes included: safe in an element or an attribute."""
    return html.escape(str(text), quote=True)


def iframe_srcdoc(page: str, height: int = 500) -> str:
    """An ``<iframe>`` showing the HTML document ``page`` inline (``srcdoc``): the whole page escaped as the attribute's
    value, so the frame receives it exactly as written (its own escaping intact) and nothing of it runs outside."""
    return f'<iframe srcdoc="{html_text(page)}" width="100%" height="{int(height)}"></iframe>'


def read_utf8(path: str | Path) -> str:
    """The text of ``path`` decoded as UTF-8; a file in another encoding is refused naming the file and the line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(f"{path}, line {line}: not UTF-8 (byte {data[e.start]:#04x} at offset {e.start}): save the "
                         f"file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path.name} > fixed && mv fixed "
                         f"{path.name}`") from e
