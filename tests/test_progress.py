"""Progress bars: one decision (unicache_lib/progress.py) for every long loop, quiet in CI and under papermill."""
import io

import pytest

from unicache_lib import progress as P


class _Tty(io.StringIO):
    def isatty(self):
        return True


TTY, PIPE = _Tty(), io.StringIO()


@pytest.mark.parametrize("env, stderr, kernel, shown", [
    ({}, TTY, False, True),                                   # a terminal
    ({}, PIPE, False, False),                                 # a log file or a pipe
    ({}, PIPE, True, True),                                   # JupyterLab (stderr is never a tty there)
    ({"CI": "true"}, TTY, False, False),
    ({"CI": "1"}, PIPE, True, False),
    ({"CI": "false"}, TTY, False, True),                      # CI=false is not CI
    ({"UNICACHE_PROGRESS": "0"}, TTY, True, False),           # make run / notebooks / test, papermill tests
    ({"UNICACHE_PROGRESS": "1"}, PIPE, False, True),
    ({"UNICACHE_PROGRESS": "1", "CI": "1"}, PIPE, False, True),  # asked for explicitly: shown even in CI
    ({"UNICACHE_PROGRESS": "0", "CI": ""}, TTY, False, False),
])
def test_decision(env, stderr, kernel, shown):
    assert P.decide(env, stderr, kernel) is shown


def test_decision_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("UNICACHE_PROGRESS", "0")
    assert P.decide(in_kernel=True, stderr=TTY) is False
    monkeypatch.setenv("UNICACHE_PROGRESS", "1")
    monkeypatch.setenv("CI", "1")
    assert P.decide(stderr=PIPE, in_kernel=False) is True


def test_bad_value_says_what_to_set():
    with pytest.raises(ValueError, match="set it to 1 .* or 0"):
        P.decide({"UNICACHE_PROGRESS": "maybe"}, TTY, False)
    assert P.decide({"UNICACHE_PROGRESS": "1"}, TTY, False)  # the fix the message names


def test_explicit_argument_overrides_the_decision(monkeypatch):
    P.enabled.cache_clear()
    monkeypatch.setenv("UNICACHE_PROGRESS", "0")
    try:
        assert P.shown(None) is False and P.shown(True) is True
        P.enabled.cache_clear()
        monkeypatch.setenv("UNICACHE_PROGRESS", "1")
        assert P.shown(None) is True and P.shown(False) is False
    finally:
        P.enabled.cache_clear()


@pytest.mark.parametrize("setting, progress, drawn", [("1", None, True), ("0", None, False), ("0", True, True),
                                                       ("1", False, False)])
def test_capture_loop_draws_a_bar_only_when_enabled(llava, samples, monkeypatch, capsys, setting, progress, drawn):
    from unicache_lib.capture.runner import capture_samples

    P.enabled.cache_clear()
    monkeypatch.setenv("UNICACHE_PROGRESS", setting)
    try:
        res = capture_samples(*llava, samples[:2], mode="stats", progress=progress)
    finally:
        P.enabled.cache_clear()
    assert len(res.samples) == 2
    err = capsys.readouterr().err
    if drawn:
        assert "capture (stats)" in err and "2/2" in err
    else:
        assert "capture" not in err and "2/2" not in err
