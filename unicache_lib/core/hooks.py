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
wrapper subclasses :class:`ProcessorWrapper`. ``model_hook`` (and :func:`add_model_hook` /
:func:`remove_model_hook` for a hook that stays, as ``apply_step_skip``'s): a :class:`~diffusers.hooks.ModelHook` in
the module's ``HookRegistry``, the registry diffusers' own caches use, so the workbench's reuse and theirs sit side by
side, and one duplicate check refuses a second hook under the same name or of the same kind.
"""
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
            stack.callback(getattr(module, _REGISTER[kind])(fn, with_kwargs=True).remove)
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
        sig = inspect.signature(orig.forward if isinstance(orig, torch.nn.Module) else orig.__call__)
        self.names = [p.name for p in sig.parameters.values()
                      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)][1:]
        call = functools.partial(type(self).__call__, self)
        functools.update_wrapper(call, orig.__call__)
        self.__call__ = call  # what inspect.signature(processor.__call__) sees; calls go through the class

    def __call__(self, attn, *args, **kwargs):
        return self.orig(attn, *args, **kwargs)

    def arguments(self, args, kwargs) -> dict:
        """The call's arguments after ``attn`` by name."""
        return {**dict(zip(self.names, args)), **kwargs}


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


@functools.cache
def _model_hook_class():
    """The diffusers ``ModelHook`` every workbench forward replacement is registered as (made on first use, so that
    importing the workbench does not import diffusers)."""
    class WorkbenchHook(diffusers.hooks.ModelHook):
        def __init__(self, forward):
            super().__init__()
            self.replacement = forward
            self._is_stateful = hasattr(forward, "reset_state")  # diffusers pipelines reset it after each call

        def initialize_hook(self, module):
            init = getattr(self.replacement, "initialize_hook", None)
            return module if init is None else init(module)

        def new_forward(self, module, *args, **kwargs):
            return self.replacement(self.fn_ref.original_forward, *args, **kwargs)

        def reset_state(self, module):
            return self.replacement.reset_state(module) if self._is_stateful else module

    return WorkbenchHook


def add_model_hook(module: torch.nn.Module, name: str, new_forward, fix: str = "remove it first"):
    """Replace ``module``'s forward, registered as ``name`` in the module's diffusers ``HookRegistry`` (where
    diffusers' own caches register; forward hooks still run around it); returns ``new_forward``.

    ``new_forward(original_forward, *args, **kwargs)``: a function, or an object with that ``__call__`` and, where it
    needs them, ``initialize_hook(module)`` (at registration) and ``reset_state(module)`` (a stateful hook: diffusers
    pipelines reset it at the end of each call). The one duplicate check of the workbench's hooks: a hook already
    under ``name``, or an object of the same class under any name (two drivers of step reuse on one transformer),
    is refused, the message ending with ``fix``."""
    registry = diffusers.hooks.HookRegistry.check_if_exists_or_initialize(module)
    for other, hook in registry.hooks.items():
        # the same name, or an object of the same class (not a plain function) under any name
        if other == name or (not inspect.isfunction(new_forward)
                             and type(getattr(hook, "replacement", None)) is type(new_forward)):
            raise InputError(f"a hook named {other!r} is already on this {type(module).__name__}: {fix}")
    registry.register_hook(_model_hook_class()(new_forward), name)
    return new_forward


def remove_model_hook(module: torch.nn.Module, name: str):
    """Remove the hook :func:`add_model_hook` registered as ``name``; returns its ``new_forward`` (None when there
    was none)."""
    registry = diffusers.hooks.HookRegistry.check_if_exists_or_initialize(module)
    hook = registry.get_hook(name)
    if hook is None:
        return None
    registry.remove_hook(name, recurse=False)
    return getattr(hook, "replacement", hook)


@contextmanager
def model_hook(module: torch.nn.Module, name: str, new_forward):
    """:func:`add_model_hook` for the block: removed on exit, also on error."""
    add_model_hook(module, name, new_forward)
    try:
        yield
    finally:
        remove_model_hook(module, name)
