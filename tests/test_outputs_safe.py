"""What the tools read and where they write (issue #60): `make book` publishes only regular files inside the
repository, and no tool writes into a folder it must not.

- tools/book.py resolves every file it reads or publishes (unicache_lib.paths.inside_regular_file): a committed symlink
  that leaves the repository (a file, a PNG it would inline, a folder it would list), a FIFO or a device fails the
  build with one line naming it, and nothing of the outside file reaches the site; a symlink that stays inside is
  published as before;
- every output folder goes through unicache_lib.paths (output_folder / check_output_path): `make book --out` and
  `unicache-report --out` refuse an empty value, the repository, a folder above it, its own folders (docs/,
  notebooks/ ...) and a folder holding files they did not write (their `.unicache-output` lists what they wrote, and
  only that is ever removed or overwritten); a re-run into their own folder works, also into a folder an earlier
  version wrote (no marker yet); notebook OUT_DIR and the other `--out` options refuse the same values.

The site is built on a tiny temporary tree (README.md and one docs page: about a second a build)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_book import _book
from unicache_lib.core.errors import InputError, MissingFileError, ParameterError, ReportError
from unicache_lib.paths import OUTPUT_MARKER, check_output_path, inside_regular_file, output_folder

ROOT = Path(__file__).resolve().parents[1]
SECRET = "UNICACHE_SECRET_4711"


@contextmanager
def deadline(seconds: int = 60):
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""
    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s: something opened a FIFO")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _png() -> bytes:
    import base64

    return base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def _tree(tmp: Path, readme_extra: str = "") -> Path:
    """A tiny course: README.md and docs/GLOSSARY.md (no notebooks), plus an uncommitted note in docs/."""
    root = tmp / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# Mini course\n\nTerms: [glossary](docs/GLOSSARY.md)." + readme_extra + "\n")
    (root / "docs" / "GLOSSARY.md").write_text("# Glossary\n\n## the term\n\nWhat it is.\n")
    (root / "docs" / "my-notes.txt").write_text("uncommitted, mine")
    return root


def _outside(tmp: Path) -> Path:
    """A folder outside the repository holding a secret file and a secret picture."""
    out = tmp / "elsewhere"
    out.mkdir()
    (out / "environ").write_text(f"{SECRET}=hunter2\n")
    (out / "secret.png").write_bytes(_png() + SECRET.encode())
    return out


def _site_text(out: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()) if out.exists() else ""


def _snapshot(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ make book: what it reads

LINKS = {  # what a docs page links to -> the committed symlink it names
    "file": ("[env](docs/env.txt)", "docs/env.txt", "environ"),
    "picture": ('<img src="docs/shot.png">', "docs/shot.png", "secret.png"),
    "folder": ("[the folder](docs/ext/)", "docs/ext", "."),
    "file in a linked folder": ("[the file](docs/ext/environ)", "docs/ext", "."),
}


@pytest.mark.parametrize("kind", sorted(LINKS))
def test_a_symlink_out_of_the_repository_fails_the_build_and_publishes_nothing(tmp_path, kind):
    book = _book()
    link, name, target = LINKS[kind]
    root, outside = _tree(tmp_path, " " + link), _outside(tmp_path)
    (root / name).symlink_to(outside / target if target != "." else outside)
    out = tmp_path / "site"
    with pytest.raises(book.BookError) as e:
        book.build(out, root, log=lambda *a: None)
    msg = str(e.value)
    assert "\n" not in msg and name in msg and "outside" in msg, msg
    assert SECRET not in _site_text(out) and "hunter2" not in _site_text(out)


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    book = _book()
    root = _tree(tmp_path, " [log](docs/pipe.txt)")
    os.mkfifo(root / "docs" / "pipe.txt")
    with deadline(60), pytest.raises(book.BookError, match=r"docs/pipe.txt.*not a regular file \(a FIFO\)"):
        book.build(tmp_path / "site", root, log=lambda *a: None)


def test_a_symlink_that_stays_inside_is_published(tmp_path):
    book = _book()
    root = _tree(tmp_path, " [alias](docs/alias.md)")
    (root / "docs" / "alias.md").symlink_to("GLOSSARY.md")
    book.build(tmp_path / "site", root, log=lambda *a: None)
    assert "What it is." in (tmp_path / "site" / "docs" / "alias.html").read_text()


def test_a_committed_symlink_out_fails_a_build_from_the_commit_in_one_line(tmp_path, monkeypatch, capsys):
    """`make book REF=HEAD`: the commit's symlink to /proc/self/environ is refused when the commit is unpacked."""
    book = _book()
    root = _tree(tmp_path, " [env](docs/env.txt)")
    (root / "docs" / "env.txt").symlink_to("/proc/self/environ")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    monkeypatch.setattr(book, "ROOT", root)
    out = tmp_path / "site"
    assert book.main(["--out", str(out), "--ref", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make book: error: ") and "docs/env.txt" in err, err
    assert "PATH=" not in _site_text(out)


# ------------------------------------------------------------------------------------------ make book: where it writes


@pytest.mark.parametrize("where", ["docs", "notebooks", "data", "the repository", "above the repository", "empty"])
def test_the_site_refuses_the_repositorys_own_folders_and_an_empty_value(where, tmp_path, capsys, monkeypatch):
    """`make book --out docs` (and notebooks, data, the root, `..`, ''): refused in one line before anything is read
    or removed; the folder, uncommitted files included, is as it was."""
    book = _book()
    monkeypatch.chdir(ROOT)
    value = {"docs": "docs", "notebooks": "notebooks", "data": "data", "the repository": ".",
             "above the repository": "..", "empty": ""}[where]
    before = {p: p.stat().st_mtime_ns for p in ((ROOT / value).iterdir() if value and value != ".." else [])}
    assert book.main(["--out", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make book: error: --out ") and "outputs/mine" in err, err
    assert before == {p: p.stat().st_mtime_ns for p in before}


def test_the_site_refuses_a_folder_holding_files_it_did_not_write(tmp_path):
    book = _book()
    root = _tree(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(book.BookError, match=r"holds files make book did not write \(e.g. thesis.tex"):
        book.build(out, root, log=lambda *a: None)
    with pytest.raises(book.BookError, match="repository's own folder docs/"):
        book.build(root / "docs", root, log=lambda *a: None)
    assert (out / "thesis.tex").read_text() == "years of work" and (root / "docs" / "my-notes.txt").exists()


def test_rebuilding_into_its_own_folder_works_and_removes_only_what_it_wrote(tmp_path):
    """The default `make book` twice works; the second build removes exactly the pages the first wrote (a page whose
    source is gone goes); a file someone put in the site afterwards is refused, not removed; a site built before the
    marker existed (its _static/pages.json lists the pages) is rebuilt."""
    book = _book()
    root = _tree(tmp_path, " [extra](docs/EXTRA.md)")
    (root / "docs" / "EXTRA.md").write_text("# Extra\n")
    out = tmp_path / "site"
    book.build(out, root, log=lambda *a: None)
    listed = set(json.loads((out / OUTPUT_MARKER).read_text())["files"])
    assert {"index.html", "docs/GLOSSARY.html", "docs/EXTRA.html", "_static/pages.json"} <= listed
    (root / "docs" / "EXTRA.md").unlink()
    (root / "README.md").write_text("# Mini course\n\nTerms: [glossary](docs/GLOSSARY.md).\n")
    book.build(out, root, log=lambda *a: None)
    assert not (out / "docs" / "EXTRA.html").exists() and (out / "docs" / "GLOSSARY.html").exists()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(book.BookError, match="did not write .*notes.txt"):
        book.build(out, root, log=lambda *a: None)
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / OUTPUT_MARKER).unlink()  # as an earlier version left it
    book.build(out, root, log=lambda *a: None)
    assert (out / OUTPUT_MARKER).exists() and (out / "index.html").exists()


def test_the_site_refuses_another_tools_folder_and_a_marker_that_lies(tmp_path):
    """A folder a report wrote is not the site's; a marker listing `../victim` or a link removes nothing outside."""
    book = _book()
    root = _tree(tmp_path)
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.html").write_text("<!-- unicache-report -->")
    (report / OUTPUT_MARKER).write_text(json.dumps({"written_by": "unicache-report", "files": ["report.html"]}))
    with pytest.raises(book.BookError, match="holds the output of unicache-report"):
        book.build(report, root, log=lambda *a: None)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").symlink_to(victim)
    (site / OUTPUT_MARKER).write_text(json.dumps({"written_by": "make book", "files": ["../victim.txt", str(victim),
                                                                                         "index.html"]}))
    book.build(site, root, log=lambda *a: None)
    assert victim.read_text() == "keep me" and not (site / "index.html").is_symlink()


# ------------------------------------------------------------------------------------------ unicache-report --out


def _report_main(*args):
    from unicache_lib.diagnostics.report import main

    with pytest.raises(SystemExit) as e:
        main([*map(str, args)])
    return e.value.code


@pytest.mark.parametrize("where", ["docs", "the repository", "above the repository", "empty", "a user's figures"])
def test_the_report_refuses_folders_it_does_not_own_before_reading_a_store(where, tmp_path, capsys, monkeypatch):
    """`unicache-report STORE --out out` where out/real_entropy.png is the user's: refused in one line, exit 2, the
    file untouched (it used to be replaced); the same for '', the repository, `..` and docs/. The store is never
    read (it does not exist here): the folder is judged first."""
    monkeypatch.chdir(ROOT)
    mine = tmp_path / "out"
    mine.mkdir()
    (mine / "real_entropy.png").write_bytes(b"my figure")
    value = {"docs": "docs", "the repository": ".", "above the repository": "..", "empty": "",
             "a user's figures": mine}[where]
    assert _report_main(tmp_path / "no-store", "--out", value) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unicache-report: error: --out "), err
    assert (mine / "real_entropy.png").read_bytes() == b"my figure"


def test_the_report_overwrites_and_removes_only_what_it_wrote(tmp_path):
    """A report folder written before the marker existed (its page marked, its figures named by the page) is the
    report's; the new report's files are listed before they are written, and a figure of the earlier report that
    the new one does not draw goes, while nothing unlisted is touched."""
    from unicache_lib.diagnostics.report import MARK, _put_in_place, report_folder

    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.html").write_text(f'{MARK}\n<img alt="a_entropy" src="x"><img alt="old_blocks" src="y">')
    (out / "a_entropy.png").write_bytes(b"old")
    (out / "old_blocks.png").write_bytes(b"old")
    folder = report_folder(out)
    assert folder.files == {"report.html", "a_entropy.png", "old_blocks.png"}
    _put_in_place(folder, [(out / "a_entropy.png", b"new"), (out / "report.html", MARK.encode())])
    assert (out / "a_entropy.png").read_bytes() == b"new" and not (out / "old_blocks.png").exists()
    assert set(json.loads((out / OUTPUT_MARKER).read_text())["files"]) == {"a_entropy.png", "report.html"}
    report_folder(out)  # its own folder again
    (out / "real_entropy.png").write_bytes(b"mine")
    with pytest.raises(ReportError, match="did not write .*real_entropy.png"):
        report_folder(out)


# ------------------------------------------------------------------------------------------ OUT_DIR and the other --out


@pytest.mark.parametrize("value", ["", "docs", "notebooks", ".", "..", "a site"])
def test_a_notebook_out_dir_refuses_the_repository_and_another_tools_folder(value, tmp_path, monkeypatch):
    from unicache_lib.params import check_params

    monkeypatch.chdir(ROOT / "notebooks")  # as `make lab` starts the kernel: relative paths from the root anyway
    if value == "a site":
        value = str(tmp_path / "site")
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / OUTPUT_MARKER).write_text(json.dumps({"written_by": "make book", "files": []}))
    with pytest.raises(ParameterError, match=r"OUT_DIR="):
        check_params({"OUT_DIR": value})
    check_params({"OUT_DIR": str(tmp_path / "fresh")})  # a folder of its own passes
    assert not (tmp_path / "fresh").exists()  # and the check creates nothing


CLIS = {
    "replicate": ("unicache_lib.replicate", []),
    "rehearsal": ("unicache_lib.rehearsal", []),
    "standins": ("unicache_lib.zoo.builders.standins", []),
    "gen_standins": ("unicache_lib.zoo.builders.gen_standins", []),
    "unicache-capture": ("unicache_lib.capture.distributed", []),
}


@pytest.mark.parametrize("tool", sorted(CLIS) + ["a training recipe"])
def test_every_out_option_refuses_the_repository_its_folders_and_an_empty_value(tool, capsys, monkeypatch):
    """The library's other command lines check --out first (unicache_lib.paths.cli_output_path): one line, exit 2,
    before anything loads or runs."""
    import importlib

    monkeypatch.chdir(ROOT)
    for value in ("", ".", "..", "data", "unicache_lib", "tests"):
        if tool == "a training recipe":
            from unicache_lib.zoo.train.loop import parse, recipe_parser

            call = lambda v=value: parse(recipe_parser("x", out=None, lr=1e-3), ["--out", v])  # noqa: E731
        else:
            module, extra = CLIS[tool]
            call = lambda v=value, m=importlib.import_module(module), e=extra: m.main(["--out", v, *e])  # noqa: E731
        with pytest.raises(SystemExit) as e:
            call()
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and ": error: --out " in err, (value, err)


# ------------------------------------------------------------------------------------------ the helpers themselves


def test_inside_regular_file_refuses_links_out_special_files_and_folders(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.txt").write_text("ok")
    (root / "alias.txt").symlink_to("ok.txt")
    (root / "out.txt").symlink_to(_outside(tmp_path) / "environ")
    os.mkfifo(root / "pipe")
    (root / "dangling").symlink_to(root / "nothing")
    assert inside_regular_file(root, "alias.txt") == (root / "ok.txt").resolve()
    with pytest.raises(InputError, match="leads outside"):
        inside_regular_file(root, "out.txt")
    with deadline(30), pytest.raises(InputError, match="not a regular file .a FIFO"):
        inside_regular_file(root, "pipe")
    with pytest.raises(InputError, match="not a regular file .a device"):
        inside_regular_file("/dev", "null")
    with pytest.raises(InputError, match="a folder"):
        inside_regular_file(tmp_path, "root")
    with pytest.raises(MissingFileError):
        inside_regular_file(root, "dangling")
    with pytest.raises(InputError, match="is empty"):
        check_output_path("  ")
    assert output_folder(tmp_path / "new", "t").files == set()
