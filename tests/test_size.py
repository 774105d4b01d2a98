"""#61 item 7: the library stays small enough to read: ``unicache_lib`` at most :data:`MOST` code lines, counted as
statements (a docstring, a comment or a blank line is not one; a statement over several lines is one)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "unicache_lib"
MOST = 14_000


def _docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def code_lines(root: Path = PACKAGE) -> dict[str, int]:
    """Statements per module under ``root`` (relative path -> count), docstrings left out."""
    return {p.relative_to(root).as_posix(): sum(isinstance(x, ast.stmt) and not _docstring(x)
                                                for x in ast.walk(ast.parse(p.read_text())))
            for p in sorted(root.rglob("*.py"))}


def test_the_library_is_at_most_14000_code_lines():
    counts = code_lines()
    largest = ", ".join(f"{m} {n}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5])
    assert sum(counts.values()) <= MOST, (f"unicache_lib has {sum(counts.values()):,} code lines (statements), more "
                                          f"than {MOST:,}: delete dead code or collapse repeats (largest: {largest})")


def test_the_count_leaves_docstrings_comments_and_blank_lines_out(tmp_path):
    (tmp_path / "m.py").write_text('"""a module docstring"""\n# a comment\n\nx = (1 +\n     2)\n\n\ndef f():\n'
                                   '    """a docstring"""\n    "a string statement is a docstring too"\n    return x\n')
    assert code_lines(tmp_path) == {"m.py": 3}  # x = ..., def f, return x
