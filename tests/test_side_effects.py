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
    from unicache_lib.zoo.loaders import load_understanding  # once disabled the bars at import

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
