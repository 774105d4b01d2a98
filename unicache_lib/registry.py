"""Registries of pluggable pieces (head scorers, eviction policies, reuse policies): each piece is a
class with a ``name``, in its own module, decorated once with the registry's ``register``."""
from __future__ import annotations


def registrar(registry: dict, kind: str):
    """A ``register`` class decorator that adds ``cls`` to ``registry`` under ``cls.name``; a second
    class with the same name is an error, not a silent replacement."""

    def register(cls):
        if cls.name in registry:
            raise KeyError(f"{kind} {cls.name!r} registered twice")
        registry[cls.name] = cls
        return cls

    return register
