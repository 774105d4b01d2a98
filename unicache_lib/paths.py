"""Where a notebook's relative paths point: the repository root, wherever the kernel was started."""
import tomllib
from pathlib import Path

from .core.errors import InputTypeError

PROJECT_NAME = "unicache-workbench"  # [project] name in this repository's pyproject.toml


def project_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: the current directory) holding this
    project's ``pyproject.toml`` (its ``[project] name`` is ``unicache-workbench``; another
    project's pyproject is walked past), or ``None`` when there is none, e.g. the library installed
    and used from an unrelated folder."""
    here = Path.cwd() if start is None else Path(start).resolve()
    for folder in (here, *here.parents):
        toml = folder / "pyproject.toml"
        if not toml.is_file():
            continue
        try:
            name = tomllib.loads(toml.read_text()).get("project", {}).get("name")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if name == PROJECT_NAME:
            return folder
    return None


def project_path(path: str | Path) -> Path:
    """``path`` as the notebooks mean it: an absolute path unchanged; a relative one (``OUT_DIR =
    "outputs/02_understanding_maps"``, a store written by an earlier notebook) taken from the
    repository root, so ``make run`` (kernel in the root) and ``make lab`` (kernel in
    ``notebooks/``) read and write the same ``outputs/``. Outside the repository (no
    ``unicache-workbench`` pyproject.toml at or above the current directory) it is taken from the
    current directory, as ``Path(path)`` would be."""
    if path is None:
        raise InputTypeError("project_path needs a path (str or Path), got None: pass a folder such as 'outputs/x'")
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    root = project_root()
    return p if root is None else root / p
