"""One guard for the tests that open hostile files: fail instead of hanging the suite when the body blocks (a FIFO
opened for reading waits for a writer that never comes)."""
from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def deadline(seconds: int = 20):
    """Raise ``TimeoutError`` in the body after ``seconds`` (SIGALRM, main thread); the earlier handler restored."""
    def alarm(*_):
        raise TimeoutError(f"blocked for {seconds} s: something waited on a FIFO or a device")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
