"""Notebook parameters, checked in each notebook's first code cell before anything loads.

    check_params(globals())      # every parameter the notebook defines, by name

Each parameter's kind follows from its name (:data:`KINDS`: one table for every notebook), so a bad value —
``SAMPLE_SEED="x"``, ``PER_TYPE=0``, ``LAYERS="0,1"``, ``OUT_DIR`` naming a file, ``MODEL=""`` — stops a papermill
run in its first cell with a :class:`ParameterError` that names the parameter, the value and what to pass,
instead of failing deep inside after the model loaded. ``tests/test_params.py`` fails for a notebook parameter
without a row in :data:`KINDS`, so a fork that adds one adds its check.

Caught here too, before any import of torch-heavy code: a model name that is not shipped, not a folder and not a hub
id in the local cache (with the closest shipped names); ``DEVICE="cuda"`` on a machine without CUDA; a samples folder
that does not exist; and a parameter papermill passed that the notebook does not define (``-p MDOEL ...``: named,
with the closest parameter the notebook has), read from the cell papermill injects. One idea has one name in every
notebook (:data:`RENAMED`: the old names still work for one release, with a warning).

Lists from the command line: ``papermill ... -y 'LAYERS: [0, 15, 31]'``, or ``-p LAYERS "[0, 15, 31]"`` (papermill
hands that over as a string; a string that reads as a list of the right kind is taken as that list).
"""
from __future__ import annotations

import ast
import difflib
import math
import numbers
import re
import warnings
from pathlib import Path

import torch

from .core.errors import InputError, ParameterError, UnicacheError
from .inputs import MAX_IMAGE_TOKENS, budget_shares, check_fraction, check_fractions
from .paths import notebook_output, notebook_output_refusal, project_path
from .runtime.loaders import DTYPES, SHIPPED, closest_shipped, model_label, resolve
from .world.samples import MAX_PER_TYPE, PER_TYPE as SHIPPED_PER_TYPE, SEED as SHIPPED_SEED, load, seed_refusal
from .world.text import read_prompts

# former name -> its one name in every notebook; the former still accepted, with a FutureWarning, for one release
RENAMED = {"UNDERSTANDING_MODEL": "MODEL", "MODELS": "GENERATORS"}


def _fail(name: str, value, want: str):
    raise ParameterError(f"notebook parameter {name}={value!r}: {want}")


def _integer(name, v, minimum: int, maximum: int | None = None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        hint = f" (pass {name}={int(v)} without quotes)" if isinstance(v, str) and v.strip().lstrip("-").isdigit() else ""
        _fail(name, v, f"must be a whole number >= {minimum}{hint}")
    if v < minimum:
        _fail(name, v, f"must be >= {minimum}")
    if maximum is not None and v > maximum:
        _fail(name, v, f"must be at most {maximum:,} ({_WHY_AT_MOST.get(name, 'more would run for days or fill the memory')})")


# why a parameter has the upper bound it has (the rest: "more would run for days or fill the memory")
_WHY_AT_MOST = {"SEED": "seeds are 31-bit everywhere, offsets included", "SAMPLE_SEED": "seeds are 31-bit everywhere",
                "STEPS": "schedulers are trained on 1,000 steps", "GEN_STEPS": "schedulers are trained on 1,000 steps"}
MAX_SEED = 2**31 - 1
MAX_STEPS = 1000  # denoising steps: diffusion schedulers are trained on 1,000
MAX_ITEMS = 100_000  # questions, prompts or captions one notebook run scores
MAX_REPEATS = 1000  # repeats, seeds and timing rounds


def count(minimum: int = 1, maximum: int | None = None):
    return lambda name, v: _integer(name, v, minimum, maximum)


seed = count(0, MAX_SEED)


def number(lo: float = 0.0, strict: bool = True, hi: float = float("inf")):
    """A finite real number above ``lo`` (or at ``lo`` when not ``strict``) and at most ``hi``: NaN and infinities
    are refused (``GUIDANCE=inf`` would fail only once the generator ran)."""
    def check(name, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                or (v <= lo if strict else v < lo) or v > hi:
            _fail(name, v, f"must be a finite number {'>' if strict else '>='} {lo:g}"
                  + (f" and at most {hi:g}" if hi != float("inf") else ""))
    return check


def _model_found(name, v):
    """The model ``v`` names resolves without loading or the network (a shipped name, a folder, a cached hub id), or
    the parameter fails in one line with the closest shipped names."""
    try:
        resolve(v, reach=False)  # never the network here: an uncached hub id is judged when the model loads
    except UnicacheError as e:
        close = closest_shipped(v, cutoff=0.75)
        if close:
            _fail(name, v, f"no such model; did you mean {' or '.join(map(repr, close[:2]))}? (shipped: "
                  f"{', '.join(SHIPPED)})")
        _fail(name, v, str(e).split(". Shipped models")[0])


def _as_list(name, v):
    """A list given as the string papermill's ``-p NAME "[...]"`` hands over, read as the list it spells."""
    if isinstance(v, str) and v.strip().startswith("["):
        try:
            parsed = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            return v
        if isinstance(parsed, list):
            return parsed
    return v


def model(optional: bool = False):
    def check(name, v):
        if v is None and optional:
            return
        if not isinstance(v, (str, Path)) or not str(v).strip():
            _fail(name, v, "must name a model: a shipped name (e.g. 'tiny-llava'), a local folder or a hub id"
                  + (", or None to skip it" if optional else ""))
        _model_found(name, v)
    return check


def models(empty_ok: bool = False):
    def check(name, v):
        v = _as_list(name, v)
        if isinstance(v, (str, Path)) or not isinstance(v, (list, tuple)):
            _fail(name, v, f"must be a list of model names or folders, e.g. {name}=['tiny-mmdit']")
        if not v and not empty_ok:
            _fail(name, v, "must name at least one model")
        labels: dict = {}
        for m in v:  # outputs and tables are keyed by the label: two models under one label would lose one
            model()(f"{name}[...]", m)
            lab = model_label(m)
            if lab in labels:
                _fail(name, v, f"{labels[lab]!r} and {m!r} are both named {lab!r} (outputs and tables are keyed by the "
                      f"model's folder name, so one would silently replace the other)" + (
                          ": list each model once" if str(labels[lab]) == str(m) else
                          ": move or copy one of them to a folder of another name (a symlink keeps its target's name)"))
            labels[lab] = m
        return v
    return check


def device(name, v):
    if not isinstance(v, str) or not (v in ("auto", "cpu", "mps") or v == "cuda" or v.startswith("cuda:")):
        _fail(name, v, "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if v.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(v.split(":", 1)[1]) if ":" in v and v.split(":", 1)[1].isdigit() else 0
        if index >= n:
            _fail(name, v, f"this machine has {n} CUDA device{'s' * (n != 1)}: pass 'auto' (CUDA when present) or 'cpu'")
    if v == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        _fail(name, v, "this machine has no MPS device: pass 'auto' or 'cpu'")


def _simple(ok, want: str):
    """A check that refuses, saying ``want``, every value ``ok(value)`` does not accept."""
    return lambda name, v: None if ok(v) else _fail(name, v, want)


dtype = _simple(lambda v: v == "auto" or str(v).replace("torch.", "") in DTYPES, f"must be 'auto' or one of {sorted(DTYPES)}")


def layers(name, v):
    if v is None:
        return
    v = _as_list(name, v)
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
        hint = (f" (from the command line: -y '{name}: [0, 15, 31]' or -p {name} \"[0, 15, 31]\"; "
                f"{v!r} is not a list)") if isinstance(v, str) else ""
        _fail(name, v, f"must be None (every layer) or a non-empty list of layer indices, e.g. [0, 15, 31]{hint}")
    if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in v):
        _fail(name, v, "must hold whole-number layer indices")
    return v


layer = _simple(lambda v: not isinstance(v, bool) and isinstance(v, numbers.Integral),
                "must be a whole-number layer index (-1: the last)")


def _checked(name, v, check, *args, **kwargs):
    """``check(*args, **kwargs)``; its refusal (a TypeError or InputError) as parameter ``name``'s."""
    try:
        return check(*args, **kwargs)
    except (TypeError, InputError) as e:
        _fail(name, v, str(e))


def fraction(name, v):
    _checked(name, v, check_fraction, v, name)


def fractions(name, v):
    """Shares of the heads pruned (04's ``FRACTIONS``): each in [0, 1) (pruning every head leaves no model), none
    twice (each is one row per scorer: a repeat would write its rows twice)."""
    v = _as_list(name, v)
    if not _checked(name, v, check_fractions, v, "fraction", upper_inclusive=False, meaning="of the heads pruned"):
        _fail(name, v, "must hold at least one fraction")  # (a fraction given twice: check_fractions refuses it)
    return v


def budgets(name, v):
    """Shares of the image tokens, or token counts as ``"64t"`` (read against the model once it is loaded), checked
    here before the model loads (:func:`~unicache_lib.inputs.budget_shares`): a share at least
    :data:`~unicache_lib.inputs.MIN_SHARE` (1/10,000) and at most 1, a count at most
    :data:`~unicache_lib.inputs.MAX_IMAGE_TOKENS`, no zero, no repeat."""
    v = _as_list(name, v)
    if isinstance(v, str):
        _fail(name, v, f"must be a list of shares or token counts, e.g. [0.1, '64t'] (from the command line: "
              f"-p {name} \"[0.1, 0.25]\" or -y '{name}: [0.1, 0.25]')")
    got = _checked(name, v, budget_shares, v, MAX_IMAGE_TOKENS, "budget", tokens_known=False)  # counts judged again by the model
    if not got:
        _fail(name, v, "must hold at least one budget")
    return v


def counts_or_none(name, v):
    if v is not None:
        v = _as_list(name, v)
        if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
            _fail(name, v, "must be None or a non-empty list of step counts")
        for i in v:
            _integer(f"{name}[...]", i, 1, MAX_STEPS)
        if (twice := next((k for k in range(len(v)) if v[k] in v[:k]), None)) is not None:
            _fail(name, v, f"step count {v[twice]!r} is given twice: each step count is one row of the sweep, and a "
                  f"repeat would write its rows twice and double its n; drop one")
    return v


def subset(allowed: tuple):
    """A list of names, each one of ``allowed``, no repeats (e.g. 05's ``DEPTH_SCHEDULES``)."""
    def check(name, v):
        items = _as_list(name, v)
        if not isinstance(items, (list, tuple)):
            _fail(name, v, f"must be a list of names from {list(allowed)}, e.g. {list(allowed[:2])}")
        bad = [x for x in items if x not in allowed]
        if bad or len(set(items)) != len(items):
            _fail(name, v, f"must be a list of distinct names from {list(allowed)}"
                  + (f"; not {bad}" if bad else "; a name is repeated"))
    return check


flag = _simple(lambda v: isinstance(v, bool), "must be True or False")
text = _simple(lambda v: isinstance(v, str) and bool(v.strip()), "must be a non-empty string")
path_or_none = _simple(lambda v: v is None or (isinstance(v, (str, Path)) and bool(str(v).strip())),
                       "must be a folder path or None")


def _your_data(name, v, found, read, expected: str) -> None:
    """None, or a path ``found`` accepts that ``read`` reads without an :class:`InputError`; else the parameter fails
    naming ``expected`` (or the reader's own message, which names the file, the line and the fix)."""
    if v is None:
        return
    if not isinstance(v, (str, Path)):
        _fail(name, v, expected)
    path = project_path(v)
    try:
        there, fits = path.exists(), found(path)
    except OSError as e:  # a name too long for the file system, a folder without permission
        _fail(name, v, f"{path} cannot be read ({e.strerror or e}): check the path")
    if not there:
        _fail(name, v, f"there is nothing at {path}: check the path (relative paths start at the repository root)")
    if not fits:
        _fail(name, v, expected)
    try:
        read(path)
    except InputError as e:
        _fail(name, v, str(e))


def samples_folder(name, v):
    """None (the shipped set) or a folder :func:`unicache_lib.world.samples.load` reads, checked line by line now."""
    _your_data(name, v, Path.is_dir, load, "must be None (the shipped sample set) or a folder of your samples: images "
               "with a metadata.jsonl (file_name, question[, answer]) -- `make samples` writes an example")


def prompts_file(name, v):
    """None (the synthetic prompts) or a ``prompts.jsonl`` (or a folder holding one) that
    :func:`unicache_lib.world.text.read_prompts` reads, checked line by line now."""
    _your_data(name, v, Path.exists, read_prompts, "must be None (the synthetic prompts) or your prompts.jsonl: one "
               "{\"prompt\": ...} per line (objects optional) -- `make samples` writes an example")


def out_dir(name, v):
    """A folder the notebook may write to (:func:`unicache_lib.paths.notebook_output_refusal`, the check every output
    folder gets, and more): not empty, not a file, not the repository, a folder above it or inside it but under
    ``outputs/``, not a folder another tool's ``.unicache-output`` claims (a site, a report), and not a folder holding
    anything without the marker a notebook leaves (your home, /tmp, a folder of your files: a notebook replaces and
    removes files in its OUT_DIR). :func:`check_params` then creates the folder and marks it as a notebook's."""
    if not isinstance(v, (str, Path)) or not str(v).strip():
        _fail(name, v, "must be a folder path, e.g. 'outputs/mine'")
    if project_path(v).exists() and not project_path(v).is_dir():
        _fail(name, v, f"names a file ({project_path(v)}), not a folder: pick another {name}")
    folder, why = notebook_output_refusal(project_path(v), name)
    if folder is None:
        _fail(name, v, why)


KINDS = {
    "MODEL": model(), "UNDERSTANDING_MODEL": model(), "SCALE_MODEL": model(), "MODELS": models(), "GENERATORS": models(empty_ok=True),
    **{k: model(optional=True) for k in ("LLAVA", "VILT", "MLLAMA", "CLIP", "UNIFIED", "MMDIT", "PIXART")},
    "DEVICE": device, "DTYPE": dtype, "SEED": seed, "SAMPLE_SEED": seed, "OUT_DIR": out_dir, "SAMPLES": samples_folder, "PROMPTS": prompts_file,
    "LAYERS": layers, "LAYER": layer, "SENTENCE": text, "PICTURE_CACHE": text,
    "MEMORY_BUDGET_GB": number(hi=10_000), "GUIDANCE": number(hi=100), "THRESHOLD": fraction, "STRICT_THRESHOLD": fraction,
    "BUDGETS": budgets, "FRACTIONS": fractions, "PICTURE_BUDGET": fraction, "PEERS": flag, "FEWER_STEPS": counts_or_none,
    "DEPTH_TOKENS": count(1, 4096), "DEPTH_SCHEDULES": subset(("profile", "pyramid", "keep_then_drop")),
    "PER_TYPE": count(1, MAX_ITEMS), "MAP_PER_TYPE": count(1, MAX_ITEMS), "MASK_FROM_LAYER": count(0, 10_000),
    **{k: count(1, MAX_STEPS) for k in ("STEPS", "GEN_STEPS")},
    **{k: count(1, MAX_REPEATS) for k in ("RANDOM_SEEDS", "CONTROL_DRAWS", "TIMING_REPEATS", "REPEATS")},
    **{k: count(1, MAX_ITEMS) for k in ("ANCHOR_K", "TOP_K", "N_CAPTIONS", "N_SINGLE", "N_QUESTIONS", "N_GRADIENT",
                                        "N_PROMPTS", "N_EVICTION", "TIMING_PROMPTS", "DRIFT_CAPTIONS", "N_GEN_PROMPTS",
                                        "MAP_QUERY_STRIDE", "GEN_STATS_PROMPTS", "N_DRAWINGS")},
    **{k: count(0, MAX_ITEMS) for k in ("N_PAIRS", "MAP_PROMPTS")},
    **{k: path_or_none for k in ("UNDERSTANDING_STORE", "GENERATION_STORE")},
}


def _assigned(source: str) -> list[str]:
    """Upper-case names a cell assigns at its top level (a parameters cell, papermill's injected cell)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        out += [t.id for t in targets if isinstance(t, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]*", t.id)]
    return out


def _injected(namespace: dict) -> tuple[list[str], set[str]]:
    """``(names papermill injected, names the notebook's own cells assigned before)`` read from IPython's input
    history (``In``); empty when the notebook was not run by papermill (or not in IPython)."""
    history = namespace.get("In")
    if not isinstance(history, list):
        return [], set()
    def injected(src) -> bool:  # papermill's cell: "# Parameters", then assignments only
        return isinstance(src, str) and src.lstrip().startswith("# Parameters")

    at = [i for i, src in enumerate(history) if injected(src)]
    if not at:
        return [], set()
    # the notebook's own cells before it; earlier injected cells (a "Run All" again in one kernel) do not count
    own = {n for src in history[: at[-1]] if isinstance(src, str) and not injected(src) for n in _assigned(src)}
    return _assigned(history[at[-1]]), own


def check_params(namespace: dict, names=None) -> None:
    """Check every notebook parameter in ``namespace`` (a notebook's ``globals()``): the upper-case names of
    :data:`KINDS` found there, or exactly ``names``. Raises :class:`ParameterError` naming the first bad one. A
    parameter papermill passed under a former name (:data:`RENAMED`) is moved to its name with a warning; one the
    notebook does not define is refused with the closest names it does. A list given as a string (papermill's
    ``-p LAYERS "[0, 15, 31]"``) is replaced by the list it spells. Called with ``names`` None (a notebook's check
    cell), it then creates ``OUT_DIR`` and marks it as a notebook's output folder
    (:func:`unicache_lib.paths.notebook_output`), so a later run takes it again."""
    injected, own = _injected(namespace)
    if not own:  # no cell of the notebook's own ran before (a fork whose parameters cell starts "# Parameters", or
        injected = []  # "run all below" from papermill's cell): nothing to tell an unknown name from a defined one
    for old in injected:
        new = RENAMED.get(old)
        if old in own:
            continue
        if new in own:
            warnings.warn(f"notebook parameter {old} is now called {new} (in every notebook); {old} still works for "
                          f"this release: pass -p {new} ...", FutureWarning, stacklevel=2)
            namespace[new] = namespace.pop(old)
            continue
        close = difflib.get_close_matches(old, sorted(own), n=3, cutoff=0.6)
        raise ParameterError(f"{old} is not a parameter of this notebook"
                             + (f"; did you mean {' or '.join(close)}?" if close else "")
                             + f" (its parameters: {', '.join(sorted(own))})")
    for name in names if names is not None else [k for k in namespace if k in KINDS]:
        if name not in KINDS:
            raise InputError(f"notebook parameter {name} has no check: add it to unicache_lib.params.KINDS")
        value = KINDS[name](name, namespace[name])
        if value is not None:  # a list spelt as a string, now the list
            namespace[name] = value
    _check_together(namespace)
    if names is None and "OUT_DIR" in namespace:  # a notebook's check cell: its output folder made and marked as one
        try:
            notebook_output(project_path(namespace["OUT_DIR"]))
        except InputError as e:  # changed since the check above
            _fail("OUT_DIR", namespace["OUT_DIR"], str(e))


def _check_together(namespace: dict) -> None:
    """Values that are only wrong together, caught here instead of after the model loaded: ``PER_TYPE`` with the
    standard sets (``SAMPLES`` None): above the shipped set's samples per scene type on its seed, above
    :data:`~unicache_lib.world.samples.MAX_PER_TYPE` on another seed (that set is built in memory); 05's
    ``DEPTH_TOKENS`` with ``SCALE_MODEL``: a token count the committed depth-budget run measured."""
    _depth_tokens(namespace)
    folder, sample_seed = namespace.get("SAMPLES"), namespace.get("SAMPLE_SEED")
    if folder is not None and isinstance(sample_seed, int) and not isinstance(sample_seed, bool) \
            and (why := seed_refusal(folder, sample_seed)):
        _fail("SAMPLE_SEED", sample_seed, why)
    per = namespace.get("PER_TYPE")
    if not (isinstance(per, int) and "SAMPLES" in namespace and namespace["SAMPLES"] is None):
        return
    if namespace.get("SAMPLE_SEED", SHIPPED_SEED) in (None, SHIPPED_SEED):
        if per > SHIPPED_PER_TYPE:
            _fail("PER_TYPE", per, f"the shipped sample set (SAMPLE_SEED={SHIPPED_SEED}) has {SHIPPED_PER_TYPE} samples "
                  f"per scene type: pass PER_TYPE <= {SHIPPED_PER_TYPE}, or another SAMPLE_SEED (a set of the same "
                  f"recipe is then built with {per} per type)")
    elif per > MAX_PER_TYPE:
        _fail("PER_TYPE", per, f"SAMPLE_SEED={namespace['SAMPLE_SEED']} builds its set in memory, at most "
              f"{MAX_PER_TYPE:,} samples per scene type: pass PER_TYPE <= {MAX_PER_TYPE:,}")


def _depth_tokens(namespace: dict) -> None:
    """05 §8 draws the committed depth-budget run (``make evaluate-depth``) at ``DEPTH_TOKENS``: a count that run did
    not measure is refused now, not after the whole notebook ran (no committed run on ``SCALE_MODEL``: nothing to
    check, §8 says so)."""
    tok, model_name = namespace.get("DEPTH_TOKENS"), namespace.get("SCALE_MODEL")
    if not isinstance(tok, int) or isinstance(tok, bool) or not isinstance(model_name, str):
        return
    from .analysis.caching_claims import decisive  # local: pandas, only for notebook 05

    try:
        shares = decisive(model_name, "depth_shares")
        measured = sorted({int(t) for t in shares.tokens}) if shares is not None and "tokens" in shares else []
    except (OSError, ValueError, KeyError):
        return
    if measured and tok not in measured:
        _fail("DEPTH_TOKENS", tok, f"the committed depth-budget run on {model_name} measured {measured} image tokens: "
              f"pick one of them (make evaluate-depth measures others)")
