"""Progress bars for the long loops (capture over samples, sampling, sweeps, training), one decision for all.

:func:`bar` wraps ``tqdm.auto`` (a widget in JupyterLab, text on a terminal). Whether bars show is decided
once per process by :func:`enabled`: off when ``UNICACHE_PROGRESS=0``, or when ``CI`` is set, or when
stderr is not a terminal and we are not in a Jupyter kernel (logs, pipes); on when ``UNICACHE_PROGRESS=1``,
in a Jupyter kernel, or on a terminal. ``make run`` / ``make notebooks`` / ``make test`` and the papermill
runs of the tests set ``UNICACHE_PROGRESS=0`` so executed notebooks carry no bar output.
Library functions take ``progress=None`` (this decision); ``True`` / ``False`` override it.
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache

from tqdm.auto import tqdm

from .core.errors import InputError

ENV = "UNICACHE_PROGRESS"


def _in_jupyter_kernel() -> bool:
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def decide(environ=None, stderr=None, in_kernel: bool | None = None) -> bool:
    """Whether bars show by default, from the environment (``os.environ``), stderr and the kernel."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    if value:
        raise InputError(f"{ENV}={env[ENV]!r}: set it to 1 (show progress bars) or 0 (hide them)")
    if env.get("CI", "").strip().lower() not in ("", "0", "false"):
        return False
    return bool((_in_jupyter_kernel() if in_kernel is None else in_kernel)
                or getattr(sys.stderr if stderr is None else stderr, "isatty", lambda: False)())


@lru_cache(maxsize=1)
def enabled() -> bool:
    """:func:`decide` for this process, computed once."""
    return decide()


def shown(progress: bool | None) -> bool:
    """An explicit ``progress`` argument wins; None means :func:`enabled`."""
    return enabled() if progress is None else bool(progress)


def bar(iterable=None, progress: bool | None = None, **kw):
    """``tqdm.auto.tqdm(iterable, **kw)``, shown as :func:`shown` says."""
    return tqdm(iterable, disable=not shown(progress), **kw)


write = tqdm.write  # print without breaking a bar that is showing
