"""One error root: every ``raise`` in the package raises a :class:`~unicache_lib.core.errors.UnicacheError` (read
from the source, so a new bare ``raise ValueError`` fails here), and ``except UnicacheError`` catches what bad input
meets, while the built-in bases callers already catch still work."""
import ast
import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

from unicache_lib.core import errors as E
from unicache_lib.core.errors import UnicacheError

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {SystemExit: "a command line's exit status",
           ImportError: "an optional dependency that is not installed (the message names the pip install)"}


def _raised_classes():
    """(module, line, class or callable) of every ``raise X(...)`` in the package."""
    out = []
    for path in sorted((ROOT / "unicache_lib").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)
        mod = importlib.import_module(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                out.append((name, node.lineno, getattr(mod, node.exc.func.id, None) or getattr(__builtins__, node.exc.func.id, None)
                            if not isinstance(__builtins__, dict) else getattr(mod, node.exc.func.id, None) or
                            __builtins__.get(node.exc.func.id)))
    return out


def test_every_raise_in_the_package_raises_a_unicache_error():
    """An unsupported case is an error of the root that names the fix (UnsupportedError); an abstract method is an
    ``abc.abstractmethod`` and raises nothing (next test)."""
    found = _raised_classes()
    assert len(found) > 300  # the scan sees the package
    bad = [f"{m}:{line} raises {getattr(c, '__name__', c)}" for m, line, c in found
           if not (inspect.isclass(c) and (issubclass(c, UnicacheError) or c in ALLOWED))]
    assert not bad, "raise a kind from unicache_lib.core.errors instead:\n" + "\n".join(bad)



def test_no_not_implemented_error_in_the_package():
    """No ``NotImplementedError``, bare or called, anywhere in the package: an interface method is an
    ``abc.abstractmethod`` (a subclass without it cannot be built), an unsupported case an :class:`UnsupportedError`."""
    hits = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in sorted((ROOT / "unicache_lib").rglob("*.py"))
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Raise) and n.exc is not None and "NotImplementedError" in ast.unparse(n.exc)]
    assert hits == []

def test_the_kinds_keep_the_builtin_bases_callers_catch():
    assert issubclass(E.InputError, ValueError) and issubclass(E.InputTypeError, TypeError)
    assert issubclass(E.UnknownNameError, KeyError) and str(E.UnknownNameError("no 'x' here")) == "no 'x' here"
    assert issubclass(E.DuplicateNameError, E.InputError) and not issubclass(E.DuplicateNameError, E.UnknownNameError)
    assert issubclass(E.ContractError, RuntimeError) and issubclass(E.CaptureError, E.ContractError)
    assert issubclass(E.LayerError, E.InputError) and not issubclass(E.LayerError, RuntimeError)  # one kind
    assert issubclass(E.ModelNotFoundError, FileNotFoundError) and issubclass(E.ChecksumError, OSError)
    assert all(issubclass(c, E.UnsupportedError) for c in (E.UnsupportedModelError, E.PeerUnsupported,
                                                             E.PrefillPruningUnsupported))
    # the old homes still hand out the same classes
    from unicache_lib.capture import CaptureError
    from unicache_lib.inputs import InputError
    from unicache_lib.store import StoreError
    assert (CaptureError, InputError, StoreError) == (E.CaptureError, E.InputError, E.StoreError)


def _bad_inputs():
    from unicache_lib.core.modality import Spans
    from unicache_lib.families import family_for_type
    from unicache_lib.inputs import check_fraction, prepare_image
    from unicache_lib.kv import POLICIES
    from unicache_lib.params import check_params
    from unicache_lib.paths import project_path
    from unicache_lib.runtime.loaders import load_generator, load_understanding
    from unicache_lib.store import Store

    return {
        "an image of the wrong shape": lambda: prepare_image(np.zeros((2, 2, 7), np.uint8)),
        "a fraction above 1": lambda: check_fraction(1.5, "budget"),
        "a policy name nothing is registered under": lambda: POLICIES["nope"],
        "a model type no family knows": lambda: family_for_type("not-a-model"),
        "a model name that is nowhere": lambda: load_understanding("no-such-model-anywhere"),
        "a VLM handed to the generator loader": lambda: load_generator("tiny-llava"),
        "spans longer than the sequence": lambda: Spans.joint(4, 5).check(3),
        "a notebook parameter of the wrong kind": lambda: check_params({"SEED": "x"}),
        "no path": lambda: project_path(None),
        "a file where a store should be": lambda: Store(ROOT / "README.md"),
    }


def test_a_name_registered_twice_is_its_own_error():
    """A clash is not an unknown name: DuplicateNameError names both classes; the registry keeps the first."""
    from unicache_lib.core.registry import Registry, registrar

    reg = Registry("thing")
    register = registrar(reg, "thing")

    @register
    class A:
        name = "x"

    class B:
        name = "x"

    with pytest.raises(E.DuplicateNameError, match=r"thing 'x' registered twice: .*A holds the name already; give .*B "
                                                   r"another name"):
        register(B)
    assert reg["x"] is A


@pytest.mark.parametrize("what", list(_bad_inputs()))
def test_except_unicache_error_catches_bad_input(what):
    with pytest.raises(UnicacheError):
        _bad_inputs()[what]()
