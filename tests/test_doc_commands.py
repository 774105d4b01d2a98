"""Every command block of README.md and docs/*.md runs as printed, from the repository root (issue #52).

Each fenced ```bash / ```sh / ```shell and ```python block is found with the HTML comment, if any, on the line just
before its fence:

- ``<!-- check: static (why) -->``: the block needs a GPU, the network or a long time; it is checked statically only
  (python: compiled; shell: every program, make target, script, module, notebook parameter and flag exists);
- ``<!-- check: slow (why) -->``: checked statically here and run as printed by a test marked ``notebook``
  (``make test``), after the runnable blocks of its page above it;
- ``<!-- check: continues -->``: a python block that continues the page's previous block (same namespace, as the
  page says); without it a python block must run on its own, as a reader pastes it into a fresh session;
- no comment: checked statically and run, python blocks in a fresh namespace each, shell blocks with bash.

A ```python no-test block (tests/test_readme.py only compiles it) must carry the static comment, and the other way
round, so both tests agree on what runs. The python blocks run in one subprocess from the repository root (what they
write lands where a reader's would, under the ignored outputs/; a test checks nothing else appears), offline, one
thread. Inline commands (`` `.venv/bin/python tools/x.py --flag` ``) are checked statically too.

Commands call the project's tools through `.venv/bin/` (README.md and docs/SETUP.md say so where commands start,
and that `source .venv/bin/activate` is the other way): a bare `papermill`, `python`, `jupyter` ... is not on the
PATH of a fresh shell, so it fails here. Also here: every download command the library suggests is `hf download`,
and `hf download --help` works in the project's environment.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
CHECK = re.compile(r"<!--\s*check:\s*(?P<kind>[\w-]+)\s*(?:\((?P<why>[^)]*)\))?\s*-->")
KINDS = {"static", "slow", "continues"}
# the environment the Makefile gives every target, one thread (tests/test_readme.py runs the same blocks in-process)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "UNICACHE_PROGRESS": "0", "MPLBACKEND": "Agg",
       "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
# the tools `make setup` puts in .venv/bin; used bare they are not on a fresh shell's PATH
VENV_TOOLS = {p.name for p in VENV_BIN.iterdir()} if VENV_BIN.is_dir() else {
    "python", "python3", "papermill", "jupyter", "jupytext", "pytest", "torchrun", "accelerate", "hf", "pip"}
BUILTINS = {"cd", "export", "source", ".", "echo", "test", "[", "true", "false", "set", "unset"}


@dataclass
class Block:
    doc: str
    line: int  # of the first code line
    lang: str
    info: str
    code: str
    kind: str  # "run", "static", "slow"
    why: str
    continues: bool

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def python(self) -> bool:
        return self.lang == "python"


def blocks_of(text: str, doc: str = "<text>") -> list[Block]:
    """Every python and shell block of ``text`` with the check comment on the line before its fence."""
    out = []
    for m in FENCE.finditer(text):
        lang = m.group("lang")
        if lang != "python" and lang not in SHELL:
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        c = CHECK.fullmatch(before.strip())
        kind = c.group("kind") if c else "run"
        out.append(Block(doc, text.count("\n", 0, m.start("code")) + 1, lang, m.group("info").strip(), m.group("code"),
                         "run" if kind == "continues" else kind, (c.group("why") or "") if c else "",
                         kind == "continues"))
    return out


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks_of((ROOT / doc).read_text(), doc)]


BLOCKS = all_blocks()
PYTHON = [b for b in BLOCKS if b.python]
SHELL_BLOCKS = [b for b in BLOCKS if not b.python]


# -------------------------------------------------------------------------------------------- the markers


def test_blocks_are_found_with_their_markers():
    text = ("# t\n```bash\nmake run\n```\n<!-- check: static (GPU) -->\n```python no-test\nimport x\n```\n"
            "<!-- check: continues -->\n```python\ny = 1\n```\n```text\nnot a command\n```\n")
    got = [(b.line, b.lang, b.kind, b.why, b.continues, b.info) for b in blocks_of(text)]
    assert got == [(3, "bash", "run", "", False, ""), (7, "python", "static", "GPU", False, "no-test"),
                   (11, "python", "run", "", True, "")]


def test_every_check_marker_is_known_and_sits_on_a_block():
    problems = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        fences = {m.start() for m in FENCE.finditer(text)}
        for m in CHECK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if m.group("kind") not in KINDS:
                problems.append(f"{doc}:{line}: unknown check {m.group('kind')!r} (known: {sorted(KINDS)})")
            if m.group("kind") in ("static", "slow") and not (m.group("why") or "").strip():
                problems.append(f"{doc}:{line}: say why in parentheses: <!-- check: {m.group('kind')} (GPU) -->")
            if text.index("\n", m.end()) + 1 not in fences:
                problems.append(f"{doc}:{line}: a check marker must be on the line just before a ``` fence")
    assert not problems, "\n".join(problems)


def test_no_test_blocks_are_exactly_the_static_python_blocks():
    """tests/test_readme.py skips ```python no-test blocks; this test skips the static ones: the same blocks."""
    bad = [b.id for b in PYTHON if ("no-test" in b.info.split()) != (b.kind == "static")]
    assert not bad, f"mark a ```python no-test block <!-- check: static (why) --> and the other way round: {bad}"


def test_the_pages_have_command_blocks():
    assert len(PYTHON) >= 20 and len(SHELL_BLOCKS) >= 6
    assert any(b.kind == "static" for b in SHELL_BLOCKS) and any(b.kind == "slow" for b in BLOCKS)


# -------------------------------------------------------------------------------------------- python blocks


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_block_compiles(block):
    compile("\n" * (block.line - 1) + block.code, block.doc, "exec")


RUNNER = textwrap.dedent("""
    import json, sys, time, traceback
    sessions, results = json.load(open(sys.argv[1])), {}
    for session in sessions:              # a block and the blocks that continue it, in one namespace
        ns, failed = {"__name__": "__main__"}, None
        for b in session:
            if failed:
                results[b["id"]] = {"ok": False, "seconds": 0, "error": f"not run: {failed}, which it continues, failed"}
                continue
            t0 = time.perf_counter()
            try:
                exec(compile("\\n" * (b["line"] - 1) + b["code"], b["doc"], "exec"), ns)
                results[b["id"]] = {"ok": True, "seconds": time.perf_counter() - t0}
            except BaseException as e:
                failed = b["id"]
                results[b["id"]] = {"ok": False, "seconds": time.perf_counter() - t0,
                                    "error": "".join(traceback.format_exception(e)[-8:])}
            json.dump(results, open(sys.argv[2], "w"))
""")


def sessions_of(blocks: list[Block]) -> list[list[Block]]:
    """Runnable python blocks grouped into sessions: a block starts one, a `continues` block joins its page's last."""
    out: list[list[Block]] = []
    for b in blocks:
        if b.continues and out and out[-1][0].doc == b.doc:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def run_python(blocks: list[Block], tmp: Path, timeout: float = 240) -> dict:
    """Run the python ``blocks`` (sessions as :func:`sessions_of` makes them) in one subprocess from the repository
    root; ``{block id: {"ok", "seconds", "error"}}``."""
    spec, out = tmp / "blocks.json", tmp / "results.json"
    spec.write_text(json.dumps([[{"id": b.id, "doc": b.doc, "line": b.line, "code": b.code} for b in s]
                                for s in sessions_of(blocks)]))
    p = subprocess.run([sys.executable, "-c", RUNNER, str(spec), str(out)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=timeout)
    results = json.loads(out.read_text()) if out.exists() else {}
    for b in blocks:  # a crash of the interpreter itself
        results.setdefault(b.id, {"ok": False, "seconds": 0, "error": f"exit {p.returncode}: {p.stderr[-2000:]}"})
    return results


def untracked() -> set[str]:
    """Files git would show as new (not ignored)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                         text=True).stdout
    return {line[3:] for line in out.splitlines() if line.startswith("??")}


@pytest.fixture(scope="module")
def python_results(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        before = None
    else:
        before = untracked()
    results = run_python([b for b in PYTHON if b.kind == "run"], tmp_path_factory.mktemp("blocks"))
    return results, before, (untracked() if before is not None else None)


def test_sessions_follow_the_continues_markers():
    text = "```python\na = 1\n```\n<!-- check: continues -->\n```python\nb = a\n```\n```python\nc = 2\n```\n"
    assert [[b.line for b in s] for s in sessions_of(blocks_of(text, "x.md"))] == [[2, 6], [9]]


def test_a_block_that_needs_the_one_above_fails_without_the_marker(tmp_path):
    blocks = blocks_of("```python\nimport math\n```\n```python\nprint(math.pi)\n```\n"
                       "```python\nx = 1\n```\n<!-- check: continues -->\n```python\nassert x == 1\n```\n", "x.md")
    results = run_python(blocks, tmp_path)
    assert [results[b.id]["ok"] for b in blocks] == [True, False, True, True]
    assert "NameError: name 'math' is not defined" in results[blocks[1].id]["error"]


@pytest.mark.parametrize("block", [b for b in PYTHON if b.kind == "run"], ids=lambda b: b.id)
def test_python_block_runs_as_printed(block, python_results):
    results, _, _ = python_results
    r = results[block.id]
    assert r["ok"], (f"{block.id}: the python block fails when pasted into a fresh python in the repository root"
                     f"{' after the blocks above it' if block.continues else ''} (if it needs the block above, put "
                     f"<!-- check: continues --> before its fence and say so on the page):\n{r['error']}")
    assert r["seconds"] < 60, (f"{block.id} took {r['seconds']:.0f} s: mark it <!-- check: slow (why) --> so that only "
                               f"`make test` runs it")


def test_the_python_blocks_leave_the_clone_clean(python_results):
    _, before, after = python_results
    if before is None:
        pytest.skip("not a git checkout")
    new = sorted(after - before)
    assert not new, f"running the docs' python blocks left files git would commit (write them under outputs/): {new}"


# -------------------------------------------------------------------------------------------- shell blocks


def commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, split at ; && || | &."""
    out = []
    for line in re.sub(r"\\\n", " ", code).splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lex.whitespace_split, lex.commenters = True, "#"
        cmd: list[str] = []
        for tok in lex:
            if tok in (";", "&&", "||", "|", "&"):
                out.append(cmd) if cmd else None
                cmd = []
            else:
                cmd.append(tok)
        if cmd:
            out.append(cmd)
    return out


@functools.lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    p = subprocess.run(list(argv) + ["--help"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)} --help` exits {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    return p.stdout + p.stderr


def has_flag(help: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help) is not None


def is_flag(tok: str) -> bool:
    return tok.startswith("-") and tok not in ("-", "--") and not re.fullmatch(r"-[\d.]+", tok)


def check_flags(help: str, args: list[str], what: str) -> list[str]:
    return [f"{what} has no option {t.split('=')[0]} (its --help)" for t in args
            if is_flag(t) and not has_flag(help, t.split("=")[0])]


def venv_program(prog: str) -> str:
    return str(VENV_BIN / Path(prog).name) if prog.startswith(".venv/bin/") else prog


def check_script_flags(source: Path | None, help_argv: tuple[str, ...], args: list[str], what: str) -> list[str]:
    """Each flag of ``args`` is a string in the script's source (``"--write"``: argparse's or a hand-read one), or, when
    it is not there, in its ``--help``."""
    text = source.read_text() if source is not None and source.is_file() else ""
    rest = [a for a in args if is_flag(a) and not re.search(rf"[\"']{re.escape(a.split('=')[0])}[\"'=]", text)]
    return check_flags(help_text(*help_argv), rest, what) if rest else []


def check_python_args(python: str, args: list[str]) -> list[str]:
    """``python -m module --flags`` or ``python script.py --flags``."""
    if args[:1] == ["-c"]:
        return []
    if args[:1] == ["-m"]:
        mod = args[1]
        try:
            spec = importlib.util.find_spec(mod)
        except ImportError:
            spec = None
        if spec is None:
            return [f"no module {mod} in the project's environment"]
        if spec.submodule_search_locations:  # a package runs its __main__
            spec = importlib.util.find_spec(f"{mod}.__main__") or spec
        origin = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
        return check_script_flags(origin, (python, "-m", mod), args[2:], f"python -m {mod}")
    script = args[0]
    if not (ROOT / script).is_file():
        return [f"no script {script} (paths are taken from the repository root)"]
    return check_script_flags(ROOT / script, (python, script), args[1:], script)


# launchers and the function that builds their argparse parser (read in-process: faster than their --help)
LAUNCHERS = {"torchrun": ("torch.distributed.run", "get_args_parser"),
             "accelerate launch": ("accelerate.commands.launch", "launch_command_parser")}


@functools.lru_cache(maxsize=None)
def launcher_options(launcher: str) -> dict:
    module, build = LAUNCHERS[launcher]
    return getattr(importlib.import_module(module), build)()._option_string_actions


def check_launcher(launcher: str, args: list[str]) -> list[str]:
    """``torchrun [its options] -m module [the module's options]`` (accelerate launch alike)."""
    options = launcher_options(launcher)
    problems, i, module = [], 0, False
    while i < len(args) and is_flag(args[i]):
        flag = args[i].split("=")[0]
        if flag not in options:
            problems.append(f"{launcher} has no option {flag}")
        elif flag in ("-m", "--module"):
            module = True
        elif "=" not in args[i] and options[flag].nargs != 0:
            i += 1
        i += 1
    if i == len(args):
        return problems + ["no script or module to launch"]
    return problems + check_python_args(sys.executable, (["-m"] if module else []) + args[i:])


def notebook_parameters(nb: Path) -> set[str]:
    """The names the ``parameters``-tagged cell of ``nb`` assigns (what papermill's -p can set)."""
    for cell in json.loads(nb.read_text())["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            names = set()
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            return names
    raise AssertionError(f"{nb} has no cell tagged 'parameters'")


@functools.lru_cache(maxsize=None)
def papermill_options() -> dict[str, int]:
    """papermill's options -> how many values each takes (its click command, read in-process)."""
    import click
    from papermill.cli import papermill

    return {o: (0 if p.is_flag else p.nargs) for p in papermill.params if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)}


def check_papermill(args: list[str]) -> list[str]:
    import yaml

    options = papermill_options()
    problems, positional, names, i = [], [], [], 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "--parameters", "-r", "--parameters_raw"):
            name, value = args[i + 1], args[i + 2]
            names.append(name)
            if a in ("-p", "--parameters") and value.strip()[:1] in ("[", "{"):
                problems.append(f"-p {name} {value!r}: papermill passes it as a string; write -y '{name}: {value}'")
            i += 3
        elif a in ("-y", "--parameters_yaml", "-f", "--parameters_file"):
            src = args[i + 1]
            if a in ("-f", "--parameters_file"):
                if not (ROOT / src).is_file():
                    problems.append(f"no parameters file {src}")
                    i += 2
                    continue
                src = (ROOT / src).read_text()
            loaded = yaml.safe_load(src)
            if not isinstance(loaded, dict):
                problems.append(f"{a} {args[i + 1]!r} is not a YAML mapping of NAME: value")
            else:
                names += list(loaded)
            i += 2
        elif is_flag(a):
            if a.split("=")[0] not in options:
                problems.append(f"papermill has no option {a}")
            i += 1 + (options.get(a, 0) if "=" not in a else 0)
        else:
            positional.append(a)
            i += 1
    if len(positional) != 2:
        return problems + [f"papermill needs the notebook and where to write it: got {positional}"]
    nb, out = positional
    if not (ROOT / nb).is_file():
        return problems + [f"no notebook {nb}"]
    if Path(out).is_absolute() or Path(out).parts[0] != "outputs":
        problems.append(f"papermill writes {out}: write under outputs/ (ignored), so a run leaves the clone clean")
    known = notebook_parameters(ROOT / nb)
    problems += [f"{nb} has no parameter {n} (its parameters cell: {sorted(known)})" for n in names if n not in known]
    return problems


def makefile_names() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = {t for m in re.finditer(r"^([^\s:=#][^:=]*?)\s*:(?!=)", text, re.M) for t in m.group(1).split()}
    variables = set(re.findall(r"^(?:export\s+)?(\w+)\s*(?:\?|:|\+)?=", text, re.M)) | set(re.findall(r"\$\((\w+)\)", text))
    return targets, variables


def check_command(argv: list[str]) -> list[str]:
    """What is wrong with one command as printed (an empty list: nothing)."""
    while argv and re.fullmatch(r"\w+=.*", argv[0]):  # VAR=value prefixes
        argv = argv[1:]
    if not argv:
        return []
    prog, args = argv[0], argv[1:]
    name = Path(prog).name
    if prog in ("source", "."):
        return [] if (ROOT / args[0]).is_file() else [f"no file {args[0]} to source"]
    if prog == "make":
        targets, variables = makefile_names()
        return ([f"the Makefile has no target {a}" for a in args if not is_flag(a) and "=" not in a and a not in targets]
                + [f"the Makefile uses no variable {a.split('=')[0]}" for a in args
                   if "=" in a and a.split("=")[0] not in variables])
    if prog.startswith(".venv/bin/"):
        if not (VENV_BIN / name).is_file():
            return [f"{prog} does not exist (`make setup` creates .venv)"]
    elif name in VENV_TOOLS:
        return [f"`{prog}` is not on a fresh shell's PATH: write .venv/bin/{prog} (or say to `source .venv/bin/activate`)"]
    elif prog not in BUILTINS and shutil.which(prog) is None:
        return [f"no program {prog}"]
    exe = venv_program(prog)
    if name.startswith("python"):
        return check_python_args(exe, args)
    if name == "papermill":
        return check_papermill(args)
    if name == "torchrun":
        return check_launcher("torchrun", args)
    if name == "accelerate" and args[:1] == ["launch"]:
        return check_launcher("accelerate launch", args[1:])
    if name in ("hf", "jupyter") and args and not is_flag(args[0]):
        if name == "jupyter":
            return [] if (VENV_BIN / f"jupyter-{args[0]}").is_file() else [f"no `jupyter {args[0]}` in .venv"]
        return check_flags(help_text(exe, args[0]), args[1:], f"hf {args[0]}")
    if prog.startswith(".venv/bin/") and any(is_flag(a) for a in args):
        return check_script_flags(entry_source(Path(exe)), (exe,), args, name)
    return []


def entry_source(exe: Path) -> Path | None:
    """The source of the module a console script of .venv/bin imports its main from (``from jupytext.cli import``)."""
    m = re.search(r"^from ([\w.]+) import", exe.read_text(errors="replace"), re.M) if exe.is_file() else None
    try:
        spec = importlib.util.find_spec(m.group(1)) if m else None
    except ImportError:
        spec = None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def test_commands_are_split_as_a_shell_splits_them():
    code = ("make notebooks NB=08    # re-executes notebook 08\n"
            ".venv/bin/papermill a.ipynb outputs/a.ipynb \\\n    -y 'LAYERS: [0, 15, 31]' && echo '# not a comment'\n")
    assert commands(code) == [["make", "notebooks", "NB=08"],
                              [".venv/bin/papermill", "a.ipynb", "outputs/a.ipynb", "-y", "LAYERS: [0, 15, 31]"],
                              ["echo", "# not a comment"]]


@pytest.mark.parametrize("cmd, problem", [
    ("papermill notebooks/02_understanding_maps.ipynb outputs/x.ipynb", "not on a fresh shell's PATH"),
    (".venv/bin/papermill notebooks/02_understanding_maps.ipynb out.ipynb", "write under outputs/"),
    (".venv/bin/papermill notebooks/02_understanding_maps.ipynb outputs/x.ipynb -p LAYERS '[0, 15, 31]'",
     "papermill passes it as a string; write -y 'LAYERS: [0, 15, 31]'"),
    (".venv/bin/papermill notebooks/02_understanding_maps.ipynb outputs/x.ipynb -p NO_SUCH_PARAMETER 1",
     "has no parameter NO_SUCH_PARAMETER"),
    (".venv/bin/papermill notebooks/02_understanding_maps.ipynb outputs/x.ipynb --no-such-option", "no option"),
    ("make no-such-target", "no target no-such-target"),
    ("make notebooks NOSUCHVAR=1", "no variable NOSUCHVAR"),
    (".venv/bin/python tools/no_such_script.py", "no script"),
    (".venv/bin/python tools/run_tests.py --no-such-flag", "has no option --no-such-flag"),
    (".venv/bin/jupytext --sync --no-such-flag notebooks/00_primer.ipynb", "has no option --no-such-flag"),
    (".venv/bin/accelerate launch --no-such-flag -m unicache_lib.capture.distributed", "no option --no-such-flag"),
    (".venv/bin/python -m unicache_lib.no_such_module", "no module"),
    (".venv/bin/torchrun --nproc_per_node 2 -m unicache_lib.capture.distributed --no-such-flag", "no option"),
])
def test_a_wrong_command_is_caught(cmd, problem):
    found = [p for c in commands(cmd) for p in check_command(c)]
    assert any(problem in p for p in found), found


def test_right_commands_pass():
    for cmd in [".venv/bin/papermill notebooks/02_understanding_maps.ipynb outputs/x.ipynb --cwd . -p MAP_PER_TYPE 1 "
                "-y 'LAYERS: [0, 1]'", "make notebooks NB=03", "make replicate QUICK=1",
                ".venv/bin/python tools/doc_numbers.py --write", "source .venv/bin/activate",
                ".venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/evaluate.py --questions 10",
                ".venv/bin/jupytext --sync notebooks/00_primer.ipynb"]:
        assert [p for c in commands(cmd) for p in check_command(c)] == [], cmd


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
def test_shell_block_commands_exist(block):
    problems = [f"{' '.join(c)}: {p}" for c in commands(block.code) for p in check_command(c)]
    assert not problems, f"{block.id}:\n" + "\n".join(problems)


def run_shell(block: Block, timeout: float = 60) -> None:
    """Run a shell block with bash from the repository root; fail naming it when it fails or runs too long."""
    try:
        p = subprocess.run(["bash", "-e", "-c", block.code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} runs for over {timeout:.0f} s: mark it <!-- check: slow (why) --> or static")
    assert p.returncode == 0, f"{block.id} exits {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}"


def test_a_shell_block_runs_with_bash_from_the_root():
    ok, bad = blocks_of("```bash\ntest -f Makefile && echo fine\n```\n```sh\ntest -f no-such-file\n```\n", "x.md")
    run_shell(ok)
    with pytest.raises(AssertionError, match="x.md:5 exits 1"):
        run_shell(bad)


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if b.kind == "run"], ids=lambda b: b.id)
def test_shell_block_runs_as_printed(block):
    run_shell(block)


# inline commands to paste: `.venv/bin/...` spans, and spans starting with a bare tool of .venv that go on with a
# path or a module (`python tools/x.py`, `python -m x`); not `hf download` quoted from a message, nor `papermill ...`
INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/)?(?:python|papermill|jupyter|jupytext|torchrun|accelerate|hf) [^`\n]+)`")


def inline_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```[ \t]*$", lambda m: "\n" * m.group(0).count("\n"), (ROOT / doc).read_text(),
                      flags=re.M | re.S)
        for m in INLINE.finditer(text):
            cmd = m.group(1)
            if "..." in cmd or "…" in cmd:  # an illustration, not a command
                continue
            if cmd.startswith(".venv/bin/") or re.search(r"\s(-m\s|\S*/|\S+\.(?:py|ipynb)\b)", cmd):
                out.append((f"{doc}:{text.count(chr(10), 0, m.start()) + 1}", cmd))
    return out


@pytest.mark.parametrize("where, cmd", inline_commands(), ids=[w for w, _ in inline_commands()])
def test_inline_commands_exist(where, cmd):
    problems = [p for c in commands(cmd) for p in check_command(c)]
    assert not problems, f"{where}: `{cmd}`: " + "; ".join(problems)


# -------------------------------------------------------------------------------------------- slow blocks


@pytest.mark.notebook
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "slow"], ids=lambda b: b.id)
def test_slow_block_runs_as_printed(block, tmp_path):
    """A slow block, after the runnable blocks of its page above it (the files they write, e.g. a samples folder)."""
    page = [b for b in BLOCKS if b.doc == block.doc and b.line <= block.line and b.kind in ("run", "slow")]
    before = untracked() if (ROOT / ".git").exists() else None
    python: list[Block] = []
    for b in page + [None]:
        if (b is None or not b.python) and python:  # the python blocks so far, in one interpreter
            results = run_python(python, tmp_path, timeout=900)
            failed = {k: r["error"] for k, r in results.items() if not r["ok"]}
            assert not failed, failed
            python = []
        if b is not None and b.python:
            python.append(b)
        elif b is not None:
            run_shell(b, timeout=900)
    if before is not None:
        assert not sorted(untracked() - before), "the block left files git would commit: write them under outputs/"


# -------------------------------------------------------------------------------------------- download commands


def hf_command() -> list[str]:
    hf = Path(sys.executable).parent / "hf"
    return [str(hf)] if hf.is_file() else [sys.executable, "-m", "huggingface_hub.cli.hf"]


def test_every_download_the_library_suggests_is_hf_download_and_it_runs():
    """huggingface_hub 1.x: `huggingface-cli` says it is deprecated and exits 1; `hf download REPO_ID` is the tool."""
    suggested, stale = [], []
    for f in sorted((ROOT / "unicache_lib").rglob("*.py")):
        text = f.read_text()
        stale += [str(f.relative_to(ROOT))] * ("huggingface-cli" in text)
        suggested += [(f.name, m.group(1)) for m in re.finditer(r"`([^`\n]*\bdownload [^`\n]*)`", text)]
    for doc in DOCS:
        stale += [doc] * ("huggingface-cli" in (ROOT / doc).read_text())
    assert not stale, f"`huggingface-cli` no longer works (huggingface_hub 1.x): suggest `hf download`: {stale}"
    assert suggested, "no download command found in unicache_lib (loaders.py suggests one)"
    p = subprocess.run(hf_command() + ["download", "--help"], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "REPO_ID" in p.stdout, p.stdout + p.stderr
    for where, cmd in suggested:
        argv = [t for t in shlex.split(cmd) if not re.fullmatch(r"\w+=.*", t)]  # HF_HUB_OFFLINE=0 hf download ...
        assert argv[:2] == ["hf", "download"], f"{where}: `{cmd}`: suggest `hf download <repo_id>`"
        assert not check_flags(p.stdout, argv[2:], "hf download"), f"{where}: `{cmd}`"
