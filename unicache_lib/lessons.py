"""A lesson as one record: what the course's tools and tests need to know about a lesson, written once, in the header
of the lesson's own notebook source (``notebooks/src/NN_topic.py``, jupytext's YAML header, key ``unicache``)::

    # ---
    # jupyter:
    #   unicache:
    #     first_figure: [what_each_rule_keeps]     # the plots.save names of the lesson's picture (first one shown)
    #     figure_kind: answers                      # what that picture must show to teach (tools/lesson_pictures.py)
    #     quick: {N_EVICTION: 6, BUDGETS: [0.25, 0.5]}   # papermill parameters of the tests' quick run
    #     rules: [unicache_lib.analysis.caching_claims:EVICTION_RULES]   # its claims' rule tables (views of claims.py)
    # ---

The lesson's id is the file's stem, its title the source's first ``# `` heading; its notebook, solution and claims
follow from the id (``notebooks/<id>.ipynb``, ``solutions/<id>.py``, ``claims.of(<id>)``). ``tools/lesson_pictures.py``,
the quick notebook runs, the solutions test, the site's table of contents and ``claims.LESSONS`` read these records,
so a lesson is its source, its executed notebook and its solution (plus, if it rules on claims, their entries in
``claims.py`` and an analysis module): docs/FORKING.md, "(g) a lesson"."""
import importlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .core.errors import InputError
from .core.untrusted import read_inside

ROOT = Path(__file__).resolve().parents[1]
ID = re.compile(r"^\d\d_[a-z0-9_]+$")
FIELDS = {"first_figure", "figure_kind", "quick", "rules"}
MAX_SOURCE_BYTES = 2_000_000  # a lesson's source is a few hundred KB at most


class _Loader(yaml.SafeLoader):
    """YAML without version 1.1's surprises: ``on``/``yes``/``no`` stay words, a date stays text, ``010`` is not
    octal 8 (it is refused below), ``1:30.0`` is not base-60 90.0 (it stays text), and a key written twice is refused
    (a YAML reader would keep the last)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                                                          "tag:yaml.org,2002:timestamp")]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.yaml_implicit_resolvers = {  # floats as YAML 1.2 writes them: no base 60 (1:30.0 read as 90.0), no "1_0.5"
    first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:float"]
    for first, rules in _Loader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


def _mapping(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    if (twice := sorted({str(k) for k in keys if keys.count(k) > 1})):
        raise yaml.constructor.ConstructorError(None, None, f"the key {twice[0]!r} is written twice", node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: dict(_mapping(loader, node, deep=True)))


def _no_alias(loader, parent, index):
    """A lesson record has no anchors or aliases: refused where met, before a chain of them (``*a`` ten times in ``&b``,
    ``*b`` ten times in ``&c``...) can expand into millions of items."""
    if loader.check_event(yaml.events.AliasEvent):
        raise yaml.composer.ComposerError(None, None, "an alias (*name): a lesson record has none; write the value "
                                          "out", loader.peek_event().start_mark)
    return yaml.SafeLoader.compose_node(loader, parent, index)


_Loader.compose_node = _no_alias


@dataclass(frozen=True)
class Lesson:
    id: str
    title: str
    source: Path
    first_figure: tuple = ()
    figure_kind: str = ""
    quick: dict = field(default_factory=dict)
    rules: tuple = ()

    @property
    def notebook(self) -> Path:
        return self.source.parents[1] / f"{self.id}.ipynb"

    @property
    def solution(self) -> Path:
        return self.source.parents[2] / "solutions" / f"{self.id}.py"

    def rule_tables(self) -> dict:
        """``"module:ATTR"`` -> the table it names (imported)."""
        return {ref: getattr(importlib.import_module(ref.partition(":")[0]), ref.partition(":")[2])
                for ref in self.rules}


def _header(text: str) -> str:
    lines = text.split("\n")
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "# ---"), None)
    return ("" if lines[0].strip() != "# ---" or end is None
            else "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines[1:end]))


def read(source: Path) -> Lesson:
    """The record in one lesson source; :class:`InputError` naming the file and the field when it is malformed."""
    source = Path(source)
    if not ID.match(source.stem):
        raise InputError(f"{source.name}: a lesson's file is NN_topic.py (two digits, lower-case words)")
    # a regular file inside its folder (no link out, no FIFO to block on), read up to its bound, as data is read
    data = read_inside(source.parent, source.name, links=False, limit=MAX_SOURCE_BYTES, what="lesson source",
                       fix="a lesson's source is a file of the repository's notebooks/src")
    try:
        text = data.decode("utf-8-sig")  # (a BOM: an editor's, read past)
    except UnicodeDecodeError as e:
        raise InputError(f"{source.name}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        head = yaml.load(_header(text) or "{}", Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise InputError(f"{source.name}: its jupytext header cannot be read as YAML ({str(e).splitlines()[0]})") from None
    rec = (head.get("jupyter") or {}).get("unicache") if isinstance(head, dict) else None
    if not isinstance(rec, dict):
        raise InputError(f"{source.name}: no lesson record; add `unicache:` under `jupyter:` in its header "
                         f"(fields {', '.join(sorted(FIELDS))}; see unicache_lib/lessons.py)")
    if set(rec) - FIELDS:
        raise InputError(f"{source.name}: unknown lesson field(s) {sorted(set(rec) - FIELDS)}; known: {sorted(FIELDS)}")
    figs, quick, rules = rec.get("first_figure", []), rec.get("quick", {}), rec.get("rules", [])
    if not (isinstance(figs, list) and figs and all(isinstance(f, str) and f for f in figs)):
        raise InputError(f"{source.name}: first_figure must be a list of plots.save names, the first one shown")
    if not isinstance(rec.get("figure_kind"), str) or not rec["figure_kind"]:
        raise InputError(f"{source.name}: figure_kind must say what the first figure shows (a few words)")
    if not (isinstance(quick, dict) and all(isinstance(k, str) and k.isupper() for k in quick)):
        raise InputError(f"{source.name}: quick must map the lesson's UPPER_CASE parameters to quick values")
    for k, v in quick.items():
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, str) and re.fullmatch(r"[-+]?0\d+", x):
                raise InputError(f"{source.name}: quick {k}: {x!r} has a leading zero (YAML 1.1 reads it as octal, "
                                 f"another reader as {int(x)}); write {int(x)}")
            if isinstance(x, str) and re.fullmatch(r"[-+]?\d[\d_]*_\d*", x):  # 1_000: 1000 in YAML 1.1, a text in 1.2
                raise InputError(f"{source.name}: quick {k}: {x!r} is a number to one YAML reader and a text to "
                                 f"another; write {x.replace('_', '')}")
            if isinstance(x, float) and not math.isfinite(x):
                raise InputError(f"{source.name}: quick {k}: {x!r} is not a finite number; a quick run needs a value "
                                 f"its notebook can run with")
            if not (x is None or isinstance(x, (bool, int, float, str))):
                raise InputError(f"{source.name}: quick {k}: {x!r} is not a number, a word, true/false or null")
    if not (isinstance(rules, list) and all(isinstance(r, str) and re.fullmatch(r"[\w.]+:\w+", r) for r in rules)):
        raise InputError(f"{source.name}: rules must be a list of 'module:ATTR' names")
    title = next((m.group(1).strip() for m in re.finditer(r"^# # (.+)$", text, re.M)), source.stem)
    return Lesson(source.stem, title, source, tuple(figs), rec["figure_kind"], dict(quick), tuple(rules))


def ids(root: Path = ROOT) -> tuple:
    """The lessons' ids in order (file names only: no record is read)."""
    return tuple(sorted(p.stem for p in (Path(root) / "notebooks" / "src").glob("[0-9][0-9]_*.py")))


def discover(root: Path = ROOT) -> dict:
    """Every lesson of the course at ``root``: id -> :class:`Lesson`, in order."""
    return {k: read(Path(root) / "notebooks" / "src" / f"{k}.py") for k in ids(root)}
