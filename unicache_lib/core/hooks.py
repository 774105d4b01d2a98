"""PyTorch module hooks installed all or nothing and removed on exit, even on error.

    with forward_hooks([(model, "forward_pre", read_ids), (layer.self_attn, "forward", compress)]):
        model(**inputs)

Each entry is ``(module, kind, fn)`` with ``kind`` ``"forward"`` (``fn(module, args, kwargs, output)``) or
``"forward_pre"`` (``fn(module, args, kwargs)``); both are registered ``with_kwargs=True``. The hooks are
registered in order (so several on one module fire in that order); if one registration fails, the ones
already registered are removed before the error propagates.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

from .errors import InputError

_REGISTER = {"forward": "register_forward_hook", "forward_pre": "register_forward_pre_hook"}


@contextmanager
def forward_hooks(entries):
    """Install every ``(module, kind, fn)`` of ``entries`` for the block; remove them all on exit."""
    with ExitStack() as stack:
        for module, kind, fn in entries:
            if kind not in _REGISTER:
                raise InputError(f"hook kind must be one of {sorted(_REGISTER)}, got {kind!r}")
            handle = getattr(module, _REGISTER[kind])(fn, with_kwargs=True)
            stack.callback(handle.remove)
        yield
