"""No global side effect outside an explicit context: importing the workbench or loading a model leaves
transformers' progress bars and every logger as they were; :func:`unicache_lib.core.models.quiet` silences only
inside its block and restores on exit, also on error."""
import logging
import warnings

import pytest
from transformers.utils import logging as hf_logging

from unicache_lib.core.models import quiet


def test_importing_and_loading_change_no_global_setting():
    import unicache_lib.kv.peers  # noqa: F401 - once set the kvpress logger to ERROR at import
    from unicache_lib.kv.peers import press_factories
    from unicache_lib.runtime.loaders import load_understanding  # once disabled the bars at import

    before = logging.getLogger("kvpress").level
    press_factories()
    load_understanding("tiny-llava")
    assert hf_logging.is_progress_bar_enabled() and logging.getLogger("kvpress").level == before


def test_quiet_restores_on_exit_and_on_error():
    with quiet(loading_bars=True):
        pass  # the first call imports diffusers, whose import adds its own warning filters
    filters, level = list(warnings.filters), logging.getLogger("kvpress").level
    with pytest.raises(ZeroDivisionError):
        with quiet(loggers=("kvpress",), warning_messages=("torch.meshgrid",), loading_bars=True):
            assert logging.getLogger("kvpress").level == logging.ERROR and not hf_logging.is_progress_bar_enabled()
            1 / 0
    assert warnings.filters == filters and logging.getLogger("kvpress").level == level
    assert hf_logging.is_progress_bar_enabled()


def test_forward_hooks_install_all_or_nothing_and_always_come_off():
    """core.hooks.forward_hooks: a failed registration removes the hooks already registered; an error inside the
    block removes them all; the hooks fire in order while installed."""
    import torch

    from unicache_lib.core.errors import UnicacheError
    from unicache_lib.core.hooks import forward_hooks

    lin = torch.nn.Linear(2, 2)
    seen = []
    pre = (lin, "forward_pre", lambda m, a, k: seen.append("pre"))
    post = (lin, "forward", lambda m, a, k, o: seen.append("post"))
    with forward_hooks([pre, post]):
        lin(torch.zeros(1, 2))
    assert seen == ["pre", "post"] and not lin._forward_hooks and not lin._forward_pre_hooks
    with pytest.raises(UnicacheError, match="hook kind must be one of"):
        with forward_hooks([pre, (lin, "backward", None)]):
            pass
    assert not lin._forward_pre_hooks  # the first one, already registered, was removed
    with pytest.raises(RuntimeError, match="boom"), forward_hooks([pre, post]):
        raise RuntimeError("boom")
    assert not lin._forward_hooks and not lin._forward_pre_hooks


def test_processor_wrappers_come_off_and_show_the_original_signature():
    """core.hooks.processors: every wrapper in place inside the block, the originals back after it, also when
    installing fails half-way or the block raises; a ProcessorWrapper advertises the original's signature (diffusers
    passes a processor only the keyword arguments it names) and names positional arguments."""
    import inspect

    from unicache_lib.core.hooks import ProcessorWrapper, innermost, processors

    class Proc:
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
            return hidden_states

    class Mod:
        def __init__(self):
            self.processor = Proc()

    mods = {"a": Mod(), "b": Mod()}
    originals = {n: m.processor for n, m in mods.items()}
    seen = []

    class Spy(ProcessorWrapper):
        def __call__(self, attn, *args, **kwargs):
            seen.append(sorted(self.arguments(args, kwargs)))
            return self.orig(attn, *args, **kwargs)

    with processors(mods, lambda name, orig: Spy(orig)):
        w = mods["a"].processor
        assert isinstance(w, Spy) and innermost(w) is originals["a"]
        assert "image_rotary_emb" in inspect.signature(w.__call__).parameters
        assert w(None, 1, 2, image_rotary_emb=3) == 1
    assert seen == [["encoder_hidden_states", "hidden_states", "image_rotary_emb"]]
    assert all(m.processor is originals[n] for n, m in mods.items())

    def fail_on_b(name, orig):
        if name == "b":
            raise RuntimeError("cannot wrap b")
        return Spy(orig)

    with pytest.raises(RuntimeError, match="cannot wrap b"), processors(mods, fail_on_b):
        pass
    assert all(m.processor is originals[n] for n, m in mods.items())  # "a", already wrapped, was put back
    with pytest.raises(ZeroDivisionError), processors(mods, lambda name, orig: Spy(orig)):
        1 / 0
    assert all(m.processor is originals[n] for n, m in mods.items())


    class Plain:  # not a ProcessorWrapper: diffusers would hand it fewer arguments without a word
        def __init__(self, orig):
            self.orig = orig

        def __call__(self, attn, *args, **kwargs):
            return self.orig(attn, *args, **kwargs)

    from unicache_lib.core.errors import InputError

    with pytest.raises(InputError, match="subclass unicache_lib.core.hooks.ProcessorWrapper"), \
            processors(mods, lambda name, orig: Plain(orig)):
        pass
    assert all(m.processor is originals[n] for n, m in mods.items())


def test_model_hook_sits_in_diffusers_registry_and_comes_off():
    """core.hooks.model_hook: the forward replaced through diffusers' HookRegistry (where its caches register), a
    second hook of the same name refused, removed on exit and on error."""
    import torch

    from unicache_lib.core.errors import InputError
    from unicache_lib.core.hooks import model_hook

    lin = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    plain = lin(x)
    with model_hook(lin, "double", lambda forward, *a, **k: 2 * forward(*a, **k)):
        assert torch.equal(lin(x), 2 * plain)
        assert list(lin._diffusers_hook.hooks) == ["double"]
        with pytest.raises(InputError, match="already on this Linear"), model_hook(lin, "double", lambda f, *a: f(*a)):
            pass
        assert torch.equal(lin(x), 2 * plain)  # the refusal left the first one in place
    assert torch.equal(lin(x), plain) and not lin._diffusers_hook.hooks
    with pytest.raises(ZeroDivisionError), model_hook(lin, "double", lambda forward, *a, **k: 2 * forward(*a, **k)):
        1 / 0
    assert torch.equal(lin(x), plain) and not lin._diffusers_hook.hooks
