"""Notebook parameters, checked in each notebook's first code cell before anything loads.

    check_params(globals())      # every parameter the notebook defines, by name

Each parameter's kind follows from its name (:data:`KINDS`: one table for every notebook), so a bad value —
``SAMPLE_SEED="x"``, ``PER_TYPE=0``, ``LAYERS="0,1"``, ``OUT_DIR`` naming a file, ``MODEL=""`` — stops a papermill
run in its first cell with a :class:`ParameterError` that names the parameter, the value and what to pass,
instead of failing deep inside after the model loaded. ``tests/test_params.py`` fails for a notebook parameter
without a row in :data:`KINDS`, so a fork that adds one adds its check. (A misspelt papermill ``-p`` name is not a
parameter the notebook defines: papermill adds it and the notebook runs with its defaults — check the name.)
Lists from the command line: ``papermill ... -y 'LAYERS: [0, 15, 31]'``.
"""
from __future__ import annotations

import numbers
from pathlib import Path

from .core.errors import InputError, ParameterError
from .inputs import check_fraction, check_fractions


def _fail(name: str, value, want: str):
    raise ParameterError(f"notebook parameter {name}={value!r}: {want}")


def _integer(name, v, minimum: int):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        hint = f" (pass {name}={int(v)} without quotes)" if isinstance(v, str) and v.strip().lstrip("-").isdigit() else ""
        _fail(name, v, f"must be a whole number >= {minimum}{hint}")
    if v < minimum:
        _fail(name, v, f"must be >= {minimum}")


def count(minimum: int = 1):
    return lambda name, v: _integer(name, v, minimum)


def seed(name, v):
    _integer(name, v, 0)


def number(lo: float = 0.0, strict: bool = True):
    def check(name, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v or (v <= lo if strict else v < lo):
            _fail(name, v, f"must be a number {'>' if strict else '>='} {lo:g}")
    return check


def model(optional: bool = False):
    def check(name, v):
        if v is None and optional:
            return
        if not isinstance(v, (str, Path)) or not str(v).strip():
            _fail(name, v, "must name a model: a shipped name (e.g. 'tiny-llava'), a local folder or a hub id"
                  + (", or None to skip it" if optional else ""))
    return check


def models(empty_ok: bool = False):
    def check(name, v):
        if isinstance(v, (str, Path)) or not isinstance(v, (list, tuple)):
            _fail(name, v, f"must be a list of model names or folders, e.g. {name}=['tiny-mmdit']")
        if not v and not empty_ok:
            _fail(name, v, "must name at least one model")
        for m in v:
            model()(f"{name}[...]", m)
    return check


def device(name, v):
    if not isinstance(v, str) or not (v in ("auto", "cpu", "mps") or v == "cuda" or v.startswith("cuda:")):
        _fail(name, v, "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def dtype(name, v):
    from .zoo.loaders import DTYPES

    if not (v == "auto" or str(v).replace("torch.", "") in DTYPES):
        _fail(name, v, f"must be 'auto' or one of {sorted(DTYPES)}")


def layers(name, v):
    if v is None:
        return
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
        hint = f" (pass {name}=[{v}] as a list, not the string {v!r})" if isinstance(v, str) else ""
        _fail(name, v, f"must be None (every layer) or a non-empty list of layer indices, e.g. [0, 15, 31]{hint}")
    for i in v:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            _fail(name, v, "must hold whole-number layer indices")


def layer(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        _fail(name, v, "must be a whole-number layer index (-1: the last)")


def fraction(name, v):
    try:
        check_fraction(v, name)
    except (TypeError, InputError) as e:
        _fail(name, v, str(e))


def fractions(name, v):
    try:
        if not len(check_fractions(v, name)):
            _fail(name, v, "must hold at least one fraction")
    except (TypeError, InputError) as e:
        _fail(name, v, str(e))


def counts_or_none(name, v):
    if v is not None:
        if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
            _fail(name, v, "must be None or a non-empty list of step counts")
        for i in v:
            _integer(f"{name}[...]", i, 1)


def flag(name, v):
    if not isinstance(v, bool):
        _fail(name, v, "must be True or False")


def text(name, v):
    if not isinstance(v, str) or not v.strip():
        _fail(name, v, "must be a non-empty string")


def path_or_none(name, v):
    if v is not None and (not isinstance(v, (str, Path)) or not str(v).strip()):
        _fail(name, v, "must be a folder path or None")


def _your_data(name, v, found, read, expected: str) -> None:
    """None, or a path ``found`` accepts that ``read`` reads without an :class:`InputError`; else the parameter fails
    naming ``expected`` (or the reader's own message, which names the file, the line and the fix)."""
    if v is None:
        return
    from .paths import project_path

    if not isinstance(v, (str, Path)) or not found(project_path(v)):
        _fail(name, v, expected)
    try:
        read(project_path(v))
    except InputError as e:
        _fail(name, v, str(e))


def samples_folder(name, v):
    """None (the shipped set) or a folder :func:`unicache_lib.world.samples.load` reads, checked line by line now."""
    from .world.samples import load

    _your_data(name, v, Path.is_dir, load, "must be None (the shipped sample set) or a folder of your samples: images "
               "with a metadata.jsonl (file_name, question[, answer]) -- `make samples` writes an example")


def prompts_file(name, v):
    """None (the synthetic prompts) or a ``prompts.jsonl`` (or a folder holding one) that
    :func:`unicache_lib.world.text.read_prompts` reads, checked line by line now."""
    from .world.text import read_prompts

    _your_data(name, v, Path.exists, read_prompts, "must be None (the synthetic prompts) or your prompts.jsonl: one "
               "{\"prompt\": ...} per line (objects optional) -- `make samples` writes an example")


def out_dir(name, v):
    from .paths import project_path

    if not isinstance(v, (str, Path)) or not str(v).strip():
        _fail(name, v, "must be a folder path, e.g. 'outputs/mine'")
    if project_path(v).exists() and not project_path(v).is_dir():
        _fail(name, v, f"names a file ({project_path(v)}), not a folder: pick another {name}")


KINDS = {
    "MODEL": model(), "UNDERSTANDING_MODEL": model(), "MODELS": models(), "GENERATORS": models(empty_ok=True),
    **{k: model(optional=True) for k in ("LLAVA", "VILT", "MLLAMA", "CLIP", "UNIFIED", "MMDIT", "PIXART")},
    "DEVICE": device, "DTYPE": dtype, "SEED": seed, "SAMPLE_SEED": seed, "OUT_DIR": out_dir, "SAMPLES": samples_folder, "PROMPTS": prompts_file,
    "LAYERS": layers, "LAYER": layer, "SENTENCE": text, "PICTURE_CACHE": text,
    "MEMORY_BUDGET_GB": number(), "GUIDANCE": number(), "THRESHOLD": fraction, "STRICT_THRESHOLD": fraction,
    "BUDGETS": fractions, "FRACTIONS": fractions, "PICTURE_BUDGET": fraction, "PEERS": flag, "FEWER_STEPS": counts_or_none,
    **{k: count(1) for k in ("PER_TYPE", "ANCHOR_K", "TOP_K", "N_CAPTIONS", "N_SINGLE", "STEPS", "N_QUESTIONS", "N_GRADIENT",
                             "RANDOM_SEEDS", "N_PROMPTS", "TIMING_REPEATS", "N_EVICTION", "TIMING_PROMPTS", "REPEATS",
                             "DRIFT_CAPTIONS", "N_GEN_PROMPTS", "MAP_QUERY_STRIDE", "GEN_STATS_PROMPTS", "GEN_STEPS",
                             "N_DRAWINGS")},
    **{k: count(0) for k in ("MAP_PER_TYPE", "N_PAIRS", "MAP_PROMPTS", "MASK_FROM_LAYER")},
    **{k: path_or_none for k in ("UNDERSTANDING_STORE", "GENERATION_STORE")},
}


def check_params(namespace: dict, names=None) -> None:
    """Check every notebook parameter in ``namespace`` (a notebook's ``globals()``): the upper-case names of
    :data:`KINDS` found there, or exactly ``names``. Raises :class:`ParameterError` naming the first bad one."""
    for name in names if names is not None else [k for k in namespace if k in KINDS]:
        if name not in KINDS:
            raise InputError(f"notebook parameter {name} has no check: add it to unicache_lib.params.KINDS")
        KINDS[name](name, namespace[name])
