"""Relative notebook paths (OUT_DIR, stores of earlier notebooks) point into the repository root
wherever the kernel starts: `make run` starts it in the root, `make lab` in notebooks/."""
import re
from pathlib import Path

import pytest

from unicache_lib.paths import PROJECT_NAME, project_path, project_root

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "notebooks" / "src"


def test_repo_root_is_found_from_the_root_and_from_notebooks(monkeypatch):
    for cwd in (ROOT, ROOT / "notebooks", ROOT / "notebooks" / "src"):
        monkeypatch.chdir(cwd)
        assert project_root() == ROOT
        assert project_path("outputs/02_understanding_maps") == ROOT / "outputs" / "02_understanding_maps"


def test_outside_the_repository_a_relative_path_stays_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert project_root() is None
    assert project_path("outputs/x") == Path("outputs/x")
    assert project_path("outputs/x").resolve() == tmp_path.resolve() / "outputs" / "x"


def test_another_projects_pyproject_is_walked_past(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert project_root() is None and project_path("out") == Path("out")
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "{PROJECT_NAME}"\n')
    assert project_root() == tmp_path.resolve() and project_path("out") == tmp_path.resolve() / "out"
    (tmp_path / "pyproject.toml").write_text("not [valid toml")  # a broken file is not ours either
    assert project_root() is None


def test_absolute_paths_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT / "notebooks")
    assert project_path(tmp_path / "o") == tmp_path / "o"
    assert project_path(str(tmp_path)) == tmp_path


def test_none_is_refused_with_what_to_pass():
    with pytest.raises(TypeError, match="needs a path"):
        project_path(None)


PATH_PARAMS = re.compile(r"^([A-Z_]*(?:OUT_DIR|_STORE)) *=", re.M)


@pytest.mark.parametrize("src", sorted(SRC.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_every_notebook_resolves_its_path_parameters_with_project_path(src):
    """Every path parameter of the parameters cell is opened only through project_path: `Path(X)` or a
    bare X handed to a reader would take it from the kernel's cwd (notebooks/ under `make lab`)."""
    params, body = src.read_text().split('tags=["parameters"]', 1)[1].split("\n# %%", 1)
    # code only: markdown cells and comments may name a parameter ("under `OUT_DIR`") without opening it
    body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))
    names = PATH_PARAMS.findall(params)
    assert "OUT_DIR" in names
    for name in names:
        uses = [m.start() for m in re.finditer(rf"\b{name}\b", body)]
        assert any(body[:i].endswith("project_path(") for i in uses), f"{src.name}: {name} never resolved"
        bare = [body[max(0, i - 30):i + len(name) + 10] for i in uses
                if not body[:i].endswith("project_path(")
                and not re.match(rf"{name}\)?\.name\b|{name}:", body[i:])   # the folder's name, or `if X:`
                and not body[:i].rstrip().endswith("if")]
        assert not bare, f"{src.name}: {name} used without project_path: {bare}"
