"""nbval plugin: the workbook's one rule for checked outputs (docs/TESTING.md, "Checked outputs").

A cell tagged ``nbval-check-output`` prints only what the computation guarantees, and this plugin compares
its printed numbers accordingly:

- the text around the numbers must be identical (a verdict, a word such as "above", a count);
- an integer (no decimal point, no exponent, no ``%`` after it) must be identical: counts are exact;
- a rounded number (``0.975``, ``-3.2e-05``, ``97%``) may differ from the committed one by at most one unit in
  its last printed digit, which is what rounding a value whose error is below half that unit can do. A value
  that moves further prints too many digits for what computes it: print fewer, or print a tolerance check.

Loaded by ``make test`` (``-p tests.nbval_digits``). It only widens nbval's comparison when the exact comparison
failed, so an output that matches exactly is never touched.
"""
from __future__ import annotations

import copy
import math
import re
from collections import defaultdict

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+|\d+)(?:[eE][-+]?\d+)?%?")


def _is_rounded(tok: str) -> bool:
    return "." in tok or "e" in tok.lower() or tok.endswith("%")


def _unit(tok: str) -> float:
    """The value of one unit in the last printed digit of ``tok`` (``0.975`` -> 0.001, ``-3.2e-05`` -> 1e-06)."""
    mant, _, exp = tok.rstrip("%").lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 10.0 ** (int(exp or 0) - decimals)


def _value(tok: str) -> float:
    return float(tok.rstrip("%"))


def same_to_last_digit(ref: str, test: str) -> bool:
    """True when ``test`` reads as ``ref``: same text, same integers, rounded numbers within one last-digit unit."""
    if ref == test:
        return True
    if NUMBER.split(ref) != NUMBER.split(test):
        return False
    for a, b in zip(NUMBER.findall(ref), NUMBER.findall(test)):
        if a == b:
            continue
        if not (_is_rounded(a) and _is_rounded(b)) or a.endswith("%") != b.endswith("%"):
            return False
        # the finer unit: '%.3g' prints 0.970 as '0.97', which still means 0.970 to the last unit
        unit = min(_unit(a), _unit(b))
        if not math.isfinite(_value(a)) or abs(_value(a) - _value(b)) > unit * (1 + 1e-9):
            return False
    return True


def _flatten(cell, outputs, skip) -> dict:
    """nbval's own reshaping of a cell's outputs: output key (MIME type for data) -> sanitized values in order."""
    from nbval.plugin import transform_streams_for_comparison

    flat = defaultdict(list)
    for out in transform_streams_for_comparison(copy.deepcopy(outputs)):
        for key, val in out.items():
            if key in skip:
                continue
            if key == "data":
                for mime, v in val.items():
                    if mime not in skip:
                        flat[mime].append(cell.sanitize(v))
            else:
                flat[key].append(cell.sanitize(val))
    return flat


def _equal(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return same_to_last_digit(a, b)
    return a == b


def pytest_configure(config):
    from nbval.plugin import IPyNbCell

    if getattr(IPyNbCell.compare_outputs, "_last_digit_rule", False):
        return
    exact = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        if exact(self, copy.deepcopy(test), copy.deepcopy(ref), skip_compare):
            return True
        skip = skip_compare or self.parent.skip_compare
        t, r = _flatten(self, test, skip), _flatten(self, ref, skip)
        if set(t) != set(r) or any(len(t[k]) != len(r[k]) for k in r):
            return False
        if all(_equal(rv, tv) for k in r for rv, tv in zip(r[k], t[k])):
            self.comparison_traceback = []
            return True
        return False  # nbval's traceback from the exact comparison stays, so the reader sees the difference

    compare_outputs._last_digit_rule = True
    IPyNbCell.compare_outputs = compare_outputs
