"""Relative notebook paths (OUT_DIR, stores of earlier notebooks) point into the repository root
wherever the kernel starts: `make run` starts it in the root, `make lab` in notebooks/."""
import ast
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


def _names_the_folder(n, parent) -> bool:
    """``X.name`` or ``Path(X).name``: the folder's name, not a path opened."""
    up = parent.get(n)
    if isinstance(up, ast.Call) and getattr(up.func, "id", None) == "Path" and up.args == [n]:
        up = parent.get(up)
    return isinstance(up, ast.Attribute) and up.attr == "name"


@pytest.mark.parametrize("src", sorted(SRC.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_every_notebook_resolves_its_path_parameters_with_project_path(src):
    """Every path parameter of the parameters cell is opened only through project_path: `Path(X)` or a
    bare X handed to a reader would take it from the kernel's cwd (notebooks/ under `make lab`)."""
    params, body = src.read_text().split('tags=["parameters"]', 1)[1].split("\n# %%", 1)
    # code only: markdown cells and comments may name a parameter ("under `OUT_DIR`") without opening it
    body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))
    names = PATH_PARAMS.findall(params)
    assert "OUT_DIR" in names
    tree = ast.parse(body)  # as code: a name inside a string ("no store at UNDERSTANDING_STORE") is text, not a use
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    tests = {id(n.test) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))}
    for name in names:
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        resolved = [n for n in uses if isinstance(parent.get(n), ast.Call) and n in parent[n].args
                    and getattr(parent[n].func, "id", None) == "project_path"]
        assert resolved, f"{src.name}: {name} never resolved"
        bare = [f"line {n.lineno}: {ast.get_source_segment(body, parent.get(n, n))}" for n in uses if n not in resolved
                and not _names_the_folder(n, parent)                                               # `X.name`
                and id(n) not in tests]                                                          # `if X:`
        assert not bare, f"{src.name}: {name} used without project_path: {bare}"
