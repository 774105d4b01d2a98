"""Registries of pluggable pieces (head scorers, eviction policies, reuse policies, model families):
each piece is a class with a ``name``, in its own module, decorated once with the registry's
``register``; the package's ``__init__`` calls :func:`discover`, so a new piece is one new file.
A :class:`Registry` is a dict whose unknown names raise :class:`UnknownNameError` listing the registered names
(and the closest one), not a bare ``KeyError: 'nope'``."""
import difflib
import importlib
import pkgutil

from .errors import DuplicateNameError, UnknownNameError


class Registry(dict):
    """``name -> piece``; looking up a missing name raises :class:`UnknownNameError` naming the
    ``kind`` of piece, the registered names and the closest match."""

    def __init__(self, kind: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind = kind

    def __missing__(self, name):
        known = sorted(self)
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5) if isinstance(name, str) else []
        raise UnknownNameError(f"unknown {self.kind} {name!r}.{f' Did you mean {close[0]!r}?' if close else ''} "
                               f"Registered: {', '.join(map(repr, known)) or 'none'}.", name, known)

    def __reduce__(self):  # pickle / copy keep the kind
        return (type(self), (self.kind, dict(self)))


def registrar(registry: dict, kind: str, instance: bool = False):
    """A ``register`` class decorator that adds ``cls`` to ``registry`` under ``cls.name`` (``instance``: one
    instance of it, ``cls()``); a second class with the same name is an error, not a silent replacement."""

    def register(cls):
        if cls.name in registry:
            held = registry[cls.name] if isinstance(registry[cls.name], type) else type(registry[cls.name])
            raise DuplicateNameError(f"{kind} {cls.name!r} registered twice: {held.__qualname__} holds "
                                     f"the name already; give {cls.__qualname__} another name")
        registry[cls.name] = cls() if instance else cls
        return cls

    return register


def discover(package: str, path, first: tuple = ()) -> list[str]:
    """Import every module of ``package`` (its ``__name__`` and ``__path__``) except ``base``, so each registers
    its pieces: the modules named in ``first`` in that order, then the others in name order. The import order is
    the registry's order (the order of every table that loops over it). Returns the module names imported."""
    found = {m.name for m in pkgutil.iter_modules(path)} - {"base"}
    missing = [m for m in first if m not in found]
    if missing:
        raise UnknownNameError(f"{package}: no module {missing[0]!r} to import first", missing[0], sorted(found))
    names = list(first) + sorted(found - set(first))
    for m in names:
        importlib.import_module(f"{package}.{m}")
    return names
