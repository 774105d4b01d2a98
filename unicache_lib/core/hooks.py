"""The one hook mechanism: whatever the workbench puts on a model is installed all or nothing and removed on exit,
even on error. Three kinds of site, one context manager each:

    with forward_hooks([(model, "forward_pre", read_ids), (layer.self_attn, "forward", compress)]):
        model(**inputs)                                   # PyTorch module hooks
    with processors(targets, lambda name, orig: MyWrapper(orig)):
        pipe(prompt)                                      # a diffusers attention module's processor wrapped
    with model_hook(pipe.transformer, "reuse", new_forward):
        pipe(prompt)                                      # the forward replaced, in diffusers' HookRegistry

``forward_hooks``: each entry is ``(module, kind, fn)`` with ``kind`` ``"forward"`` (``fn(module, args, kwargs,
output)``) or ``"forward_pre"`` (``fn(module, args, kwargs)``, returning None or new ``(args, kwargs)``); both are
registered ``with_kwargs=True``, in order (several on one module fire in that order). ``processors``: every
wrapper subclasses :class:`ProcessorWrapper`. ``model_hook``: a :class:`~diffusers.hooks.ModelHook` in the
module's ``HookRegistry``, the registry diffusers' own caches use, so the workbench's reuse and theirs sit side by
side and one refuses to stack on the other under the same name.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import ExitStack, contextmanager

import torch

from .compat import diffusers
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


class ProcessorWrapper:
    """Base of every processor the workbench installs on a diffusers attention module (the capture's, the reuse
    cache's, the call counter's): by default a call passes through to ``orig`` unchanged.

    diffusers' ``Attention.forward`` hands a processor only the keyword arguments named in
    ``inspect.signature(processor.__call__)`` (HunyuanDiT's ``image_rotary_emb`` among them) and ``FluxAttention``
    passes ``image_rotary_emb`` positionally: a wrapper advertises the original's signature, so nothing is dropped,
    and :meth:`arguments` names what arrived positionally. ``names``: the original's positional parameters after
    ``attn`` (``hidden_states``, ``encoder_hidden_states``, ``attention_mask``, ...)."""

    def __init__(self, orig):
        self.orig = orig
        P = inspect.Parameter
        sig = inspect.signature(orig.forward if isinstance(orig, torch.nn.Module) else orig.__call__)
        positional = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
        self.names = [p.name for p in sig.parameters.values() if p.kind in positional][1:]
        call = functools.partial(type(self).__call__, self)
        functools.update_wrapper(call, orig.__call__)
        self.__call__ = call  # what inspect.signature(processor.__call__) sees; calls go through the class

    def __call__(self, attn, *args, **kwargs):
        return self.orig(attn, *args, **kwargs)

    def arguments(self, args, kwargs) -> dict:
        """The call's arguments after ``attn`` by name."""
        a = dict(zip(self.names, args))
        a.update(kwargs)
        return a


def innermost(processor):
    """The processor doing the work under wrappers that keep it as ``.orig`` (capture, reuse, spies)."""
    while hasattr(processor, "orig"):
        processor = processor.orig
    return processor


@contextmanager
def processors(modules: dict, make):
    """Install ``make(name, original_processor)`` (a :class:`ProcessorWrapper`) as the processor of every
    ``{name: attention module}`` in ``modules`` for the block; the originals are back on exit (and whatever was
    installed is undone if installing fails half-way). A wrapper that is not a :class:`ProcessorWrapper` is refused:
    diffusers would silently drop the keyword arguments its ``__call__`` does not name."""
    with ExitStack() as stack:
        for name, mod in modules.items():
            orig = mod.processor
            wrapper = make(name, orig)
            if not isinstance(wrapper, ProcessorWrapper):
                raise InputError(f"the processor made for {name} is a {type(wrapper).__name__}: subclass "
                                 "unicache_lib.core.hooks.ProcessorWrapper, which shows diffusers the original's "
                                 "signature (else it passes the processor fewer arguments, without a word)")
            stack.callback(setattr, mod, "processor", orig)
            mod.processor = wrapper
        yield


@contextmanager
def model_hook(module: torch.nn.Module, name: str, new_forward):
    """Replace ``module``'s forward for the block, registered as ``name`` in the module's diffusers ``HookRegistry``
    (forward hooks still run around it). ``new_forward``: a function ``new_forward(original_forward, *args,
    **kwargs)``, or a :class:`~diffusers.hooks.ModelHook` registered as it is. A hook already registered under
    ``name`` is refused rather than replaced."""
    if isinstance(new_forward, diffusers.hooks.ModelHook):
        hook = new_forward
    else:
        class _Forward(diffusers.hooks.ModelHook):
            def new_forward(self, mod, *args, **kwargs):
                return new_forward(self.fn_ref.original_forward, *args, **kwargs)
        hook = _Forward()

    registry = diffusers.hooks.HookRegistry.check_if_exists_or_initialize(module)
    if registry.get_hook(name) is not None:
        raise InputError(f"a hook named {name!r} is already on this {type(module).__name__}: remove it first")
    registry.register_hook(hook, name)
    try:
        yield
    finally:
        registry.remove_hook(name, recurse=False)
