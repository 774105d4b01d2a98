"""What the tools read and where they write (issue #60): `make book` publishes only regular files inside the
repository, and no tool writes into a folder it must not.

- tools/book.py resolves every file it reads or publishes (unicache_lib.core.untrusted.path_inside): a committed symlink
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
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deadline import deadline
from tests.test_book import _book
from unicache_lib.core.errors import InputError, MissingFileError, ParameterError, ReportError
from unicache_lib.core.untrusted import path_inside
from unicache_lib.paths import (NOTEBOOK, OUTPUT_MARKER, check_output_path, notebook_output,
                                 output_folder, record_output_files)
from .conftest import benchmark

ROOT = Path(__file__).resolve().parents[1]
SECRET = "UNICACHE_SECRET_4711"




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
    with deadline(60), pytest.raises(book.BookError, match=r"docs/pipe.txt.*a FIFO \(named pipe\), not a regular file"):
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


def _commit(root: Path) -> None:
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    if not (root / ".git").exists():
        subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)


INSIDE_SECRETS = {  # a committed symlink that stays inside the repository -> what it leads to, and how a page names it
    ".git/config": ("docs/gitconfig.txt", "../.git/config", "[cfg](gitconfig.txt)"),
    ".env": ("docs/dotenv.txt", "../.env", "[env](dotenv.txt)"),
    "outputs/": ("docs/res.json", "../outputs/private.json", "[res](res.json)"),
    "a dot folder's picture": ("docs/pic.png", "../.secret/id.png", '<img src="pic.png">'),
    "an untracked file": ("docs/notes.txt", "../secret.txt", "[notes](notes.txt)"),
}


@pytest.mark.parametrize("kind", sorted(INSIDE_SECRETS))
def test_a_symlink_inside_the_repository_to_what_is_never_published_fails_the_build(tmp_path, kind, monkeypatch, capsys):
    """#60, second round: `docs/gitconfig.txt -> ../.git/config` stays inside the repository, so "leads outside" never
    caught it and `make book` published the remote's token; the same for `../.env`, `../outputs/private.json`, an
    <img> into a dot folder (inlined as base64) and a file git does not track. The resolved target must itself be a
    tracked file outside dot folders and outputs/: refused in one line, exit 2, nothing of it in the site."""
    book = _book()
    link, target, page_link = INSIDE_SECRETS[kind]
    root = _tree(tmp_path)
    (root / "docs" / "GLOSSARY.md").write_text(f"# Glossary\n\n## the term\n\nWhat it is. {page_link}\n")
    (root / ".gitignore").write_text("outputs/\n.env\n.secret/\nsecret.txt\n")
    _commit(root)  # .git exists from here on
    subprocess.run(["git", "-C", str(root), "config", "remote.origin.url",
                    f"https://user:{SECRET}@github.com/x/y"], check=True)
    (root / ".env").write_text(f"TOKEN={SECRET}\n")
    (root / "outputs").mkdir()
    (root / "outputs" / "private.json").write_text(json.dumps({"token": SECRET}))
    (root / ".secret").mkdir()
    (root / ".secret" / "id.png").write_bytes(_png() + SECRET.encode())
    (root / "secret.txt").write_text(SECRET)
    (root / link).symlink_to(target)
    _commit(root)  # the link is committed; what it leads to is not (or is git's own)
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    book._GIT_LISTS.clear()
    out = tmp_path / "site"
    assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"make book: error: {link}: not published: it is a symbolic link"), err
    assert SECRET not in _site_text(out) and not out.exists()
    import base64

    assert base64.b64encode(_png() + SECRET.encode()).decode()[:40] not in _site_text(out)
    (root / link).unlink()  # the fix: without the link the site builds
    book._GIT_LISTS.clear()
    assert book.main(["--out", str(out)]) == 0 and SECRET not in _site_text(out)


def test_a_committed_link_to_a_tracked_file_is_still_published(tmp_path, monkeypatch):
    book = _book()
    root = _tree(tmp_path, " [alias](docs/alias.md)")
    (root / "docs" / "alias.md").symlink_to("GLOSSARY.md")
    _commit(root)
    book._GIT_LISTS.clear()
    book.build(tmp_path / "site", root, log=lambda *a: None)
    assert "What it is." in (tmp_path / "site" / "docs" / "alias.html").read_text()


def test_a_folder_symlink_loop_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """`docs/loop -> ..` and a page linking loop/docs/GLOSSARY.md: it used to build 407 pages nested 800 levels deep,
    then raise a raw OSError (File name too long)."""
    book = _book()
    root = _tree(tmp_path, " [again](docs/loop/docs/GLOSSARY.md) [up](docs/loop/)")
    (root / "docs" / "loop").symlink_to("..")
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "site"
    with deadline(60):
        assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "docs/loop is a symbolic link to a folder" in err, err
    assert not out.exists()


def test_a_failed_rebuild_leaves_the_earlier_site_as_it_was(tmp_path):
    """A rebuild that fails (a link out of the repository added since) used to remove the earlier site first (57 pages
    became 17); the pages are now built in a temporary folder beside --out and swapped in only on success."""
    book = _book()
    root = _tree(tmp_path, " [extra](docs/EXTRA.md)")
    (root / "docs" / "EXTRA.md").write_text("# Extra\n")
    out = tmp_path / "site"
    book.build(out, root, log=lambda *a: None)
    before = _snapshot(out)
    assert "docs/EXTRA.html" in before
    (root / "docs" / "EXTRA.md").write_text("# Extra\n\n[env](env.txt)\n")
    (root / "docs" / "env.txt").symlink_to(_outside(tmp_path) / "environ")
    with pytest.raises(book.BookError, match="docs/env.txt: not published"):
        book.build(out, root, log=lambda *a: None)
    assert _snapshot(out) == before  # every page of the earlier site, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "repo", "site"]  # no temporary folder left
    (root / "docs" / "env.txt").unlink()
    (root / "docs" / "EXTRA.md").write_text("# Extra, again\n")
    book.build(out, root, log=lambda *a: None)  # and a good rebuild replaces it
    assert "Extra, again" in (out / "docs" / "EXTRA.html").read_text()
    assert set(json.loads((out / OUTPUT_MARKER).read_text())["files"]) == set(_snapshot(out)) - {OUTPUT_MARKER}


def test_an_untracked_file_a_page_names_fails_the_build_and_is_never_published(tmp_path, monkeypatch, capsys):
    """#60 B6: a plain untracked (not ignored) file linked from a page was published in full, as a page and under
    _sources/. In a git checkout the site publishes committed files only: a link to an untracked one fails the build
    in one line naming it (exit 2, nothing written); a folder listing leaves untracked files out; committed, it is
    published."""
    book = _book()
    root = _tree(tmp_path, " [the docs](docs/)")
    _commit(root)
    (root / "docs" / "untracked_secret.txt").write_text(f"{SECRET}=hunter2\n")  # not committed, not ignored
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "site"
    book._GIT_LISTS.clear()
    assert book.main(["--out", str(out)]) == 0  # only listed in a folder: left out of the listing, not published
    assert SECRET not in _site_text(out) and "untracked_secret" not in _site_text(out)
    (root / "docs" / "GLOSSARY.md").write_text("# Glossary\n\n## the term\n\nWhat it is. [notes](untracked_secret.txt)\n")
    book._GIT_LISTS.clear()
    assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make book: error: docs/untracked_secret.txt: not published: git "
                                                   "does not track it") and "git add docs/untracked_secret.txt" in err, err
    assert SECRET not in _site_text(out)
    _commit(root)  # the fix the message names: committed, it is part of the course
    book._GIT_LISTS.clear()
    assert book.main(["--out", str(out)]) == 0 and SECRET in _site_text(out)


def test_the_notebooks_output_images_stay_inside_the_build_never_beside_out(tmp_path):
    """#60 B2: myst-nb writes the notebooks' output images to Sphinx's outdir.parent / jupyter_execute, and the build's
    outdir sat beside --out: `--out tmp/a/site` left tmp/a/jupyter_execute/ (with --out ~/site, ~/jupyter_execute),
    and book/_ext/course.py let pages read that folder. Sphinx now builds into <private>/html: nothing but site/ in
    tmp/a, the picture still on the page, and only a build's own temporary folder readable."""
    from nbformat import write
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import course

    book = _book()
    root = _tree(tmp_path)
    (root / "notebooks").mkdir()
    import base64

    nb = new_notebook(cells=[new_markdown_cell("# 00 · Demo\n\nA picture."), new_code_cell("plot()", outputs=[
        new_output("display_data", data={"image/png": base64.b64encode(_png()).decode()})])])
    write(nb, root / "notebooks" / "00_demo.ipynb")
    a = tmp_path / "a"
    a.mkdir()
    (a / "keep.txt").write_text("mine")
    book.build(a / "site", root, log=lambda *a: None)
    assert sorted(p.name for p in a.iterdir()) == ["keep.txt", "site"]  # no jupyter_execute/, no temporary folder
    assert list((a / "site" / "_images").glob("*.png")) and "_images/" in (a / "site" / "notebooks" / "00_demo.html").read_text()
    assert course.private_outputs(a / "site") == [] and course.private_outputs(a / "html") == []
    private = a / ".site.building-x1_y"
    assert course.private_outputs(private / "html") == [private.resolve() / "jupyter_execute"]


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
    (out / OUTPUT_MARKER).unlink()  # as an earlier version left it: nothing recorded what it wrote (#60, 4th round)
    with pytest.raises(book.BookError, match=r"no \.unicache-output.*"):
        book.build(out, root, log=lambda *a: None)
    assert (out / "index.html").exists()  # refused, nothing removed


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
    with pytest.raises(book.BookError, match=r"names '\.\./victim\.txt', a path outside the folder"):
        book.build(site, root, log=lambda *a: None)
    (site / OUTPUT_MARKER).write_text(json.dumps({"written_by": "make book", "files": ["index.html"], "content": {
        "index.html": [{"sha256": "0" * 64, "size": 7}]}}))
    with pytest.raises(book.BookError, match=r"index.html is a symbolic link, and make book never writes one"):
        book.build(site, root, log=lambda *a: None)
    assert victim.read_text() == "keep me" and (site / "index.html").is_symlink()  # refused: left where it is


FORGERIES = {"an older marker (no SHA-256)": None, "a wrong SHA-256": [{"sha256": "0" * 64, "size": 13}],
             "the SHA-256 of other bytes of one size": [{"sha256": __import__("hashlib").sha256(b"something else")
                                                        .hexdigest(), "size": 13}]}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
@pytest.mark.parametrize("tool", ["make book", "unicache-report", "the sample generator"])
def test_a_forged_marker_listing_your_file_never_gets_it_removed(tool, forgery, tmp_path, capsys):
    """#60, fourth round: a `.unicache-output` someone wrote by hand (or an older one) listing your thesis.tex made
    `make book`, `unicache-report` and the sample generator delete it as their own. A marker records each file with
    its SHA-256 and size (unicache_lib.paths.digest); a tool removes or replaces only a listed file that still holds
    what it recorded, so each refuses the folder in one line saying what to do, and thesis.tex stays."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_bytes(b"years of work")  # 13 bytes
    marker = {"written_by": tool, "files": ["thesis.tex"]}
    if FORGERIES[forgery] is not None:
        marker["content"] = {"thesis.tex": FORGERIES[forgery]}
    (out / OUTPUT_MARKER).write_text(json.dumps(marker))
    why = r"without its SHA-256" if FORGERIES[forgery] is None else r"thesis.tex's content is not what"
    if tool == "make book":
        book = _book()
        with pytest.raises(book.BookError, match=why) as e:
            book.build(out, _tree(tmp_path), log=lambda *a: None)
        err = str(e.value)
    elif tool == "unicache-report":
        assert _report_main(tmp_path / "no-store", "--out", out) == 2
        err = capsys.readouterr().err
    else:
        from unicache_lib.world import samples as S

        with pytest.raises(SystemExit) as e:
            S.main(["--out", str(out)])
        assert e.value.code == 2
        err = capsys.readouterr().err
    assert re.search(why, err) and err.strip().count("\n") == 0 and "nothing was removed" in err, err
    assert (out / "thesis.tex").read_bytes() == b"years of work"


def test_clean_removes_only_files_that_still_hold_what_the_tool_wrote(tmp_path):
    """OutputFolder.clean (what every tool's re-run calls): a listed file whose content changed since the tool wrote
    it, or that became a symbolic link to a file outside, is left where it is, named in one warning and returned; the
    files still as written go; the marker then lists what was kept, with its content."""
    folder = output_folder(tmp_path / "out", "t")
    out = folder.path
    names = ["a.txt", "b.txt", "sub/c.txt", "d.txt"]
    folder.record(names)
    for n in names:
        (out / n).parent.mkdir(exist_ok=True)
        (out / n).write_text(f"tool wrote {n}")
    folder.record(names, wrote=names)
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert sorted(marker["content"]) == sorted(names) and marker["content"]["a.txt"][0]["size"] == 16
    folder = output_folder(out, "t")  # its own folder again
    (out / "b.txt").write_text("edited by you")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "d.txt").unlink()
    (out / "d.txt").symlink_to(victim)
    with pytest.warns(UserWarning, match=r"t left 2 file\(s\) in .* no longer hold what it wrote \(e.g. b.txt\)"):
        left = folder.clean(keep=["a.txt"])
    assert left == ["b.txt", "d.txt"]
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "a.txt", "b.txt", "d.txt"]  # sub/ emptied, gone
    assert (out / "b.txt").read_text() == "edited by you" and victim.read_text() == "keep me"
    assert json.loads((out / OUTPUT_MARKER).read_text())["files"] == ["a.txt"]
    with pytest.raises(InputError, match=r"holds files t did not write \(b.txt, d.txt\)"):
        output_folder(out, "t")  # what it left is yours now


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
    """A report folder written before the marker existed is refused now (nothing recorded what it wrote, so a page
    naming your figure would make it the report's); the new report's files are listed before they are written, and a
    figure of the earlier report that the new one does not draw goes, while nothing unlisted is touched."""
    from unicache_lib.diagnostics.report import MARK, _put_in_place, report_folder

    earlier = tmp_path / "earlier"  # an earlier version's report (no marker): nothing recorded what it wrote (#60)
    earlier.mkdir()
    (earlier / "report.html").write_text(f'{MARK}\n<img alt="thesis" src="x">')
    (earlier / "thesis.png").write_bytes(b"maybe yours")
    with pytest.raises(ReportError, match=r"earlier version of unicache-report .*no SHA-256.*rm -r"):
        report_folder(earlier)
    assert (earlier / "thesis.png").read_bytes() == b"maybe yours"
    out = tmp_path / "rep"
    _put_in_place(report_folder(out), [(out / "a_entropy.png", b"old"), (out / "old_blocks.png", b"old"),
                                       (out / "report.html", MARK.encode())])
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
    check_params({"OUT_DIR": str(tmp_path / "fresh")})  # a folder of its own passes: made and marked as a notebook's
    assert json.loads((tmp_path / "fresh" / OUTPUT_MARKER).read_text())["written_by"] == NOTEBOOK
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == [OUTPUT_MARKER]  # and nothing else is created


@pytest.mark.parametrize("where", ["a user's folder", "home", "/tmp", "a folder holding 05's file name"])
def test_a_notebook_out_dir_refuses_a_folder_holding_files_no_notebook_wrote(where, tmp_path, monkeypatch):
    """#60, second round: OUT_DIR accepted any folder, and notebook 02's own cleanup (its remove_store loop over
    OUT_DIR/stats and OUT_DIR/maps) then deleted a user's file there. A folder that holds anything and has no
    .unicache-output made by a notebook is refused by the check cell, before any cell could remove a thing."""
    from unicache_lib.params import check_params

    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "ch3.tex").write_text("years of work")
    monkeypatch.setenv("HOME", str(home))
    user = tmp_path / "thesis"
    (user / "stats" / "ranking_tables").mkdir(parents=True)
    (user / "stats" / "ranking_tables" / "ch3.csv").write_text("x")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "eviction_rows.csv").write_text("my own rows")
    value = {"a user's folder": str(user), "home": "~", "/tmp": "/tmp", "a folder holding 05's file name": str(mine)}[where]
    why = (r"holds files no notebook wrote \(e\.g\. .*\) and no \.unicache-output made by a notebook"
           + (r"|is a folder above the repository" if value == "/tmp" else ""))  # a checkout under /tmp: above it
    with pytest.raises(ParameterError, match=rf"OUT_DIR=.* ({why}).*e\.g\. OUT_DIR='outputs/mine'") as e:
        check_params({"OUT_DIR": value})
    assert "\n" not in str(e.value)
    assert (user / "stats" / "ranking_tables" / "ch3.csv").read_text() == "x"
    assert (mine / "eviction_rows.csv").read_text() == "my own rows" and not (mine / OUTPUT_MARKER).exists()
    assert (home / "thesis" / "ch3.tex").exists() and not (home / OUTPUT_MARKER).exists()


def test_a_notebook_out_dir_marked_by_a_notebook_is_taken_again(tmp_path, monkeypatch):
    """The check cell makes and marks OUT_DIR (unicache_lib.paths.notebook_output), so the next run takes the folder
    full of its own outputs; an empty folder is taken and marked too; in a fresh clone the default OUT_DIR under
    outputs/ is made, marked and taken again (`make run`)."""
    from unicache_lib.params import check_params

    out = tmp_path / "run"
    check_params({"OUT_DIR": str(out)})
    (out / "stats").mkdir()
    (out / "stats" / "meta.json").write_text("{}")
    check_params({"OUT_DIR": str(out)})  # a second run: its own folder
    (tmp_path / "empty").mkdir()
    assert notebook_output(tmp_path / "empty") == (tmp_path / "empty").resolve()
    assert json.loads((tmp_path / "empty" / OUTPUT_MARKER).read_text())["written_by"] == NOTEBOOK
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "unicache-workbench"\n')
    monkeypatch.chdir(repo)
    check_params({"OUT_DIR": "outputs/02_understanding_maps"})  # the default OUT_DIR in a fresh clone (`make run`)
    (repo / "outputs" / "02_understanding_maps" / "scoreboard.json").write_text("[]")
    check_params({"OUT_DIR": "outputs/02_understanding_maps"})  # `make run` again: the folder it made
    assert (repo / "outputs" / "02_understanding_maps" / OUTPUT_MARKER).exists()
    with pytest.raises(ParameterError, match=r"inside the repository .*\(docs/sub/, in its docs/\)"):
        check_params({"OUT_DIR": "docs/sub"})


@pytest.mark.parametrize("case", ["your file under outputs/", "an earlier run's folder without a marker"])
def test_a_notebook_out_dir_under_outputs_holding_files_no_notebook_marked_is_refused(case, tmp_path, monkeypatch):
    """#60, fourth round: OUT_DIR under the repository's outputs/ was taken whatever it held (an exemption for the
    folders notebooks filled before they marked them), so `OUT_DIR='outputs/mine'` holding your thesis.tex was
    accepted and the notebook's cleanup could remove files there. No exemption now: refused in one line (the check
    cell, before anything runs) unless a notebook's marker says a notebook made it; the message says how to proceed,
    and doing so works."""
    from unicache_lib.params import check_params

    repo = tmp_path / "repo"
    (repo / "outputs").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "unicache-workbench"\n')
    monkeypatch.chdir(repo)
    name, file = (("mine", "thesis.tex") if case.startswith("your") else ("02_understanding_maps", "scoreboard.json"))
    (repo / "outputs" / name).mkdir()
    (repo / "outputs" / name / file).write_text("years of work")
    with pytest.raises(ParameterError, match=rf"OUT_DIR='outputs/{name}': holds files no notebook wrote \(e.g. {file}\)"
                                             rf".*delete it \(rm -r .*outputs/{name}\) and run again") as e:
        check_params({"OUT_DIR": f"outputs/{name}"})
    assert "\n" not in str(e.value)
    assert (repo / "outputs" / name / file).read_text() == "years of work"
    assert not (repo / "outputs" / name / OUTPUT_MARKER).exists()
    if case.startswith("an earlier"):  # what the message says, done
        import shutil

        shutil.rmtree(repo / "outputs" / name)
        check_params({"OUT_DIR": f"outputs/{name}"})
        assert (repo / "outputs" / name / OUTPUT_MARKER).exists()


@pytest.mark.parametrize("value", ["data/samples/manifest", "data/samples/x", "docs/sub", "notebooks/site", ".git/site",
                                   "newtop"])
def test_an_output_path_inside_the_repository_but_outputs_is_refused(value, monkeypatch):
    """Only the repository's top-level folders were protected: `explorer.save("data/samples/manifest")` replaced the
    shipped manifest.json and save('data/samples/x') dropped files into the shipped set. Every path inside the
    repository but under outputs/ (and runs/) is refused now, for every tool (unicache_lib.paths.check_output_path)."""
    monkeypatch.chdir(ROOT)
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "data" / "samples").iterdir()}
    with pytest.raises(InputError, match=r"(inside the repository|the repository's own folder).*writes inside the "
                                         r"repository only under outputs/") as e:
        check_output_path(str(Path(value).parent) if value.startswith("data/samples/") else value, option="path",
                          tool="Explorer.save")
    assert "\n" not in str(e.value)
    assert before == {p: p.stat().st_mtime_ns for p in before}
    assert check_output_path("outputs/some/new/folder") == ROOT / "outputs" / "some" / "new" / "folder"


def test_a_tool_writing_single_files_never_replaces_one_it_did_not_write(tmp_path):
    """check_output_path(files=...): a file that is there already is replaced only when the folder's marker says this
    tool wrote it (record_output_files, as Explorer.save does); in a notebook's folder the tool's files are listed
    beside the notebook's marker, which stays the notebook's."""
    folder = tmp_path / "figs"
    folder.mkdir()
    (folder / "view.json").write_text("the user's own")
    with pytest.raises(InputError, match=r"view.json is there already and is not a file Explorer.save wrote as it is now"):
        check_output_path(folder, option="path", tool="Explorer.save", files=["view.npz", "view.json"])
    assert check_output_path(folder, option="path", tool="Explorer.save", files=["map.npz", "map.json"]) == folder
    record_output_files(folder, "Explorer.save", {"map.npz": b"1", "map.json": b"{}"})
    (folder / "map.npz").write_bytes(b"1")
    assert check_output_path(folder, option="path", tool="Explorer.save", files=["map.npz", "map.json"]) == folder
    with pytest.raises(InputError, match=r"holds the output of Explorer.save, not of another tool"):
        check_output_path(folder, option="path", tool="another tool", files=["map.npz"])
    nb = notebook_output(tmp_path / "nb")
    (nb / "scoreboard.json").write_text("[]")
    with pytest.raises(InputError, match=r"scoreboard.json is there already"):
        check_output_path(nb, option="path", tool="Explorer.save", files=["scoreboard.json"])
    record_output_files(nb, "Explorer.save", {"view.npz": b"1"})
    (nb / "view.npz").write_bytes(b"1")
    assert check_output_path(nb, option="path", tool="Explorer.save", files=["view.npz"]) == nb
    marker = json.loads((nb / OUTPUT_MARKER).read_text())
    assert marker["written_by"] == NOTEBOOK and marker["also"] == {"Explorer.save": ["view.npz"]}
    with pytest.raises(InputError, match="holds files make book did not write"):  # still not a site's folder
        output_folder(nb, "make book")


@pytest.fixture(scope="module")
def small_explorer():
    from tests.test_explorer import lesson_02
    from unicache_lib.explorer import attention_explorer

    return attention_explorer(*lesson_02(n_samples=1, layers=2, heads=2, n_img=16))


@pytest.mark.parametrize("case", ["its folder a link to /etc", "a link to /etc on the way, the folder new",
                                  "a relative path through a link", "a link at the file", "a file it did not write",
                                  "a forged marker listing the file"])
def test_explorer_save_never_writes_through_a_link_or_over_a_file_it_did_not_write(case, small_explorer, tmp_path,
                                                                                    monkeypatch):
    """#60, fourth round: Explorer.save("ln/view") with ln -> /etc wrote /etc/view.npz, view.json and a
    .unicache-output there (the folder was resolved, and a folder outside the repository is allowed). Save goes through
    the output checks on the folder where it leads (paths.check_output_path, files it did not write with the content
    they hold refused) and through core.untrusted.folder_inside / write_inside on the folder as named: no symbolic
    link below the top level, none at the file. Each case is refused in one line and nothing outside is written."""
    etc = tmp_path / "etc"  # stands in for /etc
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0")
    home = tmp_path / "home"
    home.mkdir()
    (home / "ln").symlink_to(etc)
    real = home / "real"
    real.mkdir()
    monkeypatch.chdir(home)
    path, why = {
        "its folder a link to /etc": (home / "ln" / "view", r"ln. in .* is a symbolic link \(to .*etc\)"),
        "a link to /etc on the way, the folder new": (home / "ln" / "new" / "view", r"passes through .*ln, a symbolic link"),
        "a relative path through a link": ("ln/view", r"ln. in .* is a symbolic link \(to .*etc\)"),
        "a link at the file": (real / "view", r"view.json is there already and is not a file the explorer.s save wrote as it is now"),
        "a file it did not write": (real / "view", r"view.json is there already and is not a file the explorer's save wrote"),
        "a forged marker listing the file": (real / "view", r"view.json is there already and is not a file the explorer's save"),
    }[case]
    if case == "a link at the file":
        (real / "view.json").symlink_to(etc / "passwd")
    elif case != "a link to /etc on the way, the folder new" and "link" not in case:
        (real / "view.json").write_text("your notes")
    if case == "a forged marker listing the file":
        (real / OUTPUT_MARKER).write_text(json.dumps({"written_by": "the explorer's save", "files": ["view.json"],
                                                      "content": {"view.json": [{"sha256": "0" * 64, "size": 10}]}}))
    before = {p.name: p.read_bytes() for p in [*etc.iterdir(), *real.iterdir()] if not p.is_symlink()}
    with pytest.raises(InputError, match=why) as e:
        small_explorer.save(path)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in etc.iterdir()) == ["passwd"] and (etc / "passwd").read_text() == "root:x:0:0"
    assert {p.name: p.read_bytes() for p in [*etc.iterdir(), *real.iterdir()] if not p.is_symlink()} == before
    npz, js = small_explorer.save(home / "mine" / "view")  # a real folder: saved, and saved again over its own
    assert small_explorer.save("mine/view") == (npz, js) and json.loads(js.read_text())["npz"]["file"] == "view.npz"


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


@pytest.mark.parametrize("step", ["merge of 2,700", "merge of 300", "design"])
def test_depth_budgets_writes_every_result_under_its_own_out(step, tmp_path, monkeypatch, capsys):
    """#60, fourth round: benchmarks/depth_budgets.py --merge --out mine, with 2,700 questions or more, wrote its
    verdicts into the repository's benchmarks/results (the committed files notebook 05 reads) instead of under --out.
    Every step now writes under the --out it is given (mine/results); only the default --out (make evaluate-depth)
    replaces the committed files."""
    import pandas as pd

    DB = benchmark("depth_budgets")
    committed, default = tmp_path / "committed", tmp_path / "default"
    monkeypatch.setattr(DB, "RESULTS", committed)
    monkeypatch.setattr(DB, "OUT", default)
    n = 300 if step == "merge of 300" else 2700
    monkeypatch.setattr(DB, "merged", lambda out: (None, n, 2, [{"n_image": 576, "gamma": 0.0, "seconds": 60.0}]))
    monkeypatch.setattr(DB, "decide", lambda R, n_image: (pd.DataFrame({"rule": ["D1"]}), pd.DataFrame({"share": [1]})))

    def design(results, out=None):
        results.mkdir(parents=True)
        (results / DB.DESIGN_FILE.name).write_text("{}")
        return {"widths": [], "gamma": 0.0, "counts": {}, "accuracy": {}, "kl": {}}

    monkeypatch.setattr(DB, "design", design)
    args = ["--design"] if step == "design" else ["--merge"]
    mine = tmp_path / "mine"
    assert DB.main([*args, "--out", str(mine)]) == 0
    capsys.readouterr()
    assert not committed.exists() and not default.exists()
    written = sorted(p.name for p in (mine / "results").iterdir())
    assert written == ([DB.DESIGN_FILE.name] if step == "design" else
                       [f"evaluate_depth_shares_{DB.MODEL}.csv", f"evaluate_depth_{DB.MODEL}.csv"]), written
    assert DB.main(args) == 0  # the default --out: a full-size run (or the design) replaces the committed files
    assert (committed if n >= DB.FULL else default / "results").is_dir()


def _depth_budgets(monkeypatch, tmp_path):
    import pandas as pd

    DB = benchmark("depth_budgets")
    monkeypatch.setattr(DB, "RESULTS", tmp_path / "committed")
    monkeypatch.setattr(DB, "OUT", tmp_path / "default")
    monkeypatch.setattr(DB, "merged", lambda out: (None, 300, 1, [{"n_image": 576, "gamma": 0.0, "seconds": 6.0}]))
    monkeypatch.setattr(DB, "decide", lambda R, n_image: (pd.DataFrame({"rule": ["D1"]}), pd.DataFrame({"share": [1]})))
    monkeypatch.setattr(DB, "run_shard", lambda *a, **k: pytest.fail("the run started before --out was checked"))
    return DB


@pytest.mark.parametrize("value", ["docs", ".", "notebooks", "data"])
def test_depth_budgets_out_refuses_the_repository_folders(value, tmp_path, monkeypatch, capsys):
    """U4/U5 (#60 round IV): `depth_budgets.py --questions 2 --out docs` wrote its shards into docs/, `--merge --out
    docs` docs/results/: --out went through no output-folder check. Now unicache_lib.paths.check_output_path, before
    anything loads: one line, exit 2, nothing written, for a shard run, the merge and the design."""
    DB = _depth_budgets(monkeypatch, tmp_path)
    monkeypatch.chdir(ROOT)
    before = subprocess.run(["git", "-C", str(ROOT), "status", "--short", "--", value], capture_output=True,
                            text=True).stdout
    for step in ([], ["--merge"], ["--design"]):
        assert DB.main([*step, "--questions", "2", "--out", value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("depth_budgets.py: error: --out ") and "repository" in err, err
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--short", "--", value], capture_output=True,
                           text=True).stdout
    assert after == before


def test_depth_budgets_never_replaces_a_file_it_did_not_write(tmp_path, monkeypatch, capsys):
    """L3: `--merge --out mine` replaced mine/results/evaluate_depth_tiny-llava-576.csv ("my notes") with its verdicts.
    Now every file goes through the output-folder marker (SHA-256 per file): yours is refused in one line and kept;
    the tool's own earlier output is replaced; a shard of yours named rows-rank0-of-1.csv is refused too, and a shard
    the tool wrote reads back through evaluate.read_shards."""
    import pandas as pd

    DB = _depth_budgets(monkeypatch, tmp_path)
    mine = tmp_path / "mine"
    (mine / "results").mkdir(parents=True)
    notes = mine / "results" / f"evaluate_depth_{DB.MODEL}.csv"
    notes.write_text("my notes")
    assert DB.main(["--merge", "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a file depth_budgets.py wrote" in err and f"evaluate_depth_{DB.MODEL}.csv" in err, err
    assert notes.read_text() == "my notes"
    notes.unlink()
    assert DB.main(["--merge", "--out", str(mine)]) == 0  # its own folder: written, then replaced on a re-run
    assert DB.main(["--merge", "--out", str(mine)]) == 0
    capsys.readouterr()
    assert notes.read_text().startswith("rule,")
    # the shards: through the same marker, in evaluate.py's format
    rows = pd.DataFrame({"question": [0, 1], "method": ["full", "full"]})
    meta = {"n": 2, "rank": 0, "world": 1, "model": DB.MODEL}
    DB.write_shard(mine, rows, meta, mine, DB.TOOL)
    from evaluate import read_shards

    back, metas, n, world = read_shards(mine, ("n", "world", "model"), "evaluate-depth")
    assert len(back) == 2 and n == 2 and world == 1
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "rows-rank0-of-1.csv").write_text("mine")
    with pytest.raises(InputError, match="is not a file depth_budgets.py wrote"):
        DB.write_shard(theirs, rows, meta, theirs, DB.TOOL)
    assert (theirs / "rows-rank0-of-1.csv").read_text() == "mine"


# ------------------------------------------------------------------------------------------ the helpers themselves


def test_path_inside_refuses_links_out_special_files_and_folders(tmp_path):
    """The one path-safety family (core.untrusted) as the site and the output folders use it: the real path of a file
    inside a root, a link that stays inside followed, everything else refused by lstat before anything is opened."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.txt").write_text("ok")
    (root / "alias.txt").symlink_to("ok.txt")
    (root / "out.txt").symlink_to(_outside(tmp_path) / "environ")
    os.mkfifo(root / "pipe")
    (root / "dangling").symlink_to(root / "nothing")
    assert path_inside(root, "alias.txt") == (root / "ok.txt").resolve()
    assert path_inside(tmp_path, "root", folder=True) == root.resolve()
    with pytest.raises(InputError, match="points outside the folder"):
        path_inside(root, "out.txt")
    with deadline(30), pytest.raises(InputError, match="is a FIFO .named pipe., not a regular file"):
        path_inside(root, "pipe")
    with pytest.raises(InputError, match="is a character device, not a regular file"):
        path_inside("/dev", "null")
    with pytest.raises(InputError, match="is a folder, not a regular file"):
        path_inside(tmp_path, "root")
    with pytest.raises(InputError, match="is a regular file, not a folder"):
        path_inside(root, "ok.txt", folder=True)
    with pytest.raises(MissingFileError):
        path_inside(root, "dangling")
    with pytest.raises(InputError, match="is empty"):
        check_output_path("  ")
    assert output_folder(tmp_path / "new", "t").files == set()


def _build_refused(book, root, tmp_path, monkeypatch, capsys):
    """`make book` on the course at ``root``: exit status 2, one line on stderr, no site written; ``(err, out)``."""
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "site"
    assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    return err, out


CLIMBS = {  # a page's text naming a file outside the staged course (#60 round IV: U1-U3)
    "literalinclude": "```{literalinclude} ../../../../../../../../../../{p}/environ\n```\n",
    "include": "```{include} ../../../../../../../../../../{p}/environ\n```\n",
    "image": "![pw](../../../../../../../../../../{p}/secret.png)\n",
    "html image": '<img src="../../../../../../../../../../{p}/secret.png">\n',
    "download": "{download}`x <../../../../../../../../../../{p}/environ>`\n",
    "raw file": "```{raw} html\n:file: ../../../../../../../../../../{p}/environ\n```\n",
    "csv-table file": "```{csv-table}\n:file: ../../../../../../../../../../{p}/environ\n```\n",
    # docutils' own form `<name>` joins the name to its standard include folder without asking Sphinx (round 6: U1, U2)
    "include, standard form": "```{include} <" + "../" * 16 + "{p}/environ>\n:literal:\n```\n",
    "rst include, standard form": "```{eval-rst}\n.. include:: <" + "../" * 16 + "{p}/environ>\n   :literal:\n```\n",
}


@pytest.mark.parametrize("kind", sorted(CLIMBS))
def test_a_directive_or_image_path_out_of_the_course_fails_the_build_in_one_line(tmp_path, kind, monkeypatch, capsys):
    """U1/U2: `{literalinclude}`, `{include}`, an image, a download or a `:file:` option in a docs page that climbs
    out of the staging folder: Sphinx read the file into the page and searchindex.js (rc 0). Now never read: the
    build fails in one line naming the page and the path, nothing is published."""
    book = _book()
    outside = _outside(tmp_path)
    root = _tree(tmp_path)
    (root / "docs" / "GLOSSARY.md").write_text("# Glossary\n\n## the term\n\nWhat it is.\n\n"
                                               + CLIMBS[kind].replace("{p}", str(outside).lstrip("/")))
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "site"
    assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make book: error: docs/GLOSSARY.md: ") and "outside" in err, err
    assert "environ" in err or "secret.png" in err, err
    assert SECRET not in _site_text(out) and "hunter2" not in _site_text(out) and not out.exists()


def test_a_notebook_cell_climbing_out_of_the_course_fails_the_build(tmp_path, monkeypatch, capsys):
    """U3: the same `{literalinclude}` in a notebook's markdown cell."""
    book = _book()
    outside = _outside(tmp_path)
    root = _tree(tmp_path)
    (root / "notebooks").mkdir()
    cell = CLIMBS["literalinclude"].replace("{p}", str(outside).lstrip("/"))
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Primer\n\n" + cell}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "notebooks" / "00_primer.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "site"
    assert book.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notebooks/00_primer.ipynb" in err and "outside" in err, err
    assert SECRET not in _site_text(out)


def test_names_and_titles_with_markup_never_reach_the_page_as_html(tmp_path):
    """Round 6's U3: a committed file named ``b`<svg onload=alert(2)>`.txt`` closed the folder page's code span and its
    <svg> went live; sphinx-book-theme writes a page title unescaped into its print header. A listed name is now a
    code span it cannot close, and titles are escaped after the theme."""
    book = _book()
    root = _tree(tmp_path, " [the folder](docs/odd/)")
    (root / "docs" / "odd").mkdir()
    (root / "docs" / "odd" / "b`<svg onload=alert(2)>`.txt").write_text("y\n")
    (root / "docs" / "odd" / "``<b>x``").write_text("y\n")
    (root / "docs" / "GLOSSARY.md").write_text("# A \\<svg onload=alert(4)\\> heading\n\n## the term\n\nWhat it is.\n")
    out = tmp_path / "site"
    book.build(out, root, log=lambda *a: None)
    listing = (out / "docs" / "odd" / "index.html").read_text()
    assert "<svg" not in listing and "<b>x" not in listing, listing
    assert "&lt;svg" in listing and "onload=alert(2)&gt;" in listing and "&lt;b&gt;x" in listing  # shown, as text
    assert "<svg" not in _site_text(out / "docs") and "&lt;svg onload=alert(4)&gt;" in (out / "docs" / "GLOSSARY.html").read_text()


def test_a_page_named_with_markup_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A page's own name reaches its HTML, its links and the search index: refused, with what to do."""
    book = _book()
    root = _tree(tmp_path)
    (root / "solutions").mkdir()
    (root / "solutions" / "<img src=x onerror=alert>.py").write_text("x = 1\n")
    err, out = _build_refused(book, root, tmp_path, monkeypatch, capsys)
    assert "<img src=x onerror=alert>.py" in err and "rename it" in err, err
    (root / "solutions" / "<img src=x onerror=alert>.py").rename(root / "solutions" / "img.py")  # the fix it names
    assert book.main(["--out", str(out)]) == 0


def test_a_directive_path_inside_the_course_still_builds(tmp_path):
    book = _book()
    root = _tree(tmp_path)
    (root / "docs" / "GLOSSARY.md").write_text("# Glossary\n\n## the term\n\n```{literalinclude} ../README.md\n```\n")
    book.build(tmp_path / "site", root, log=lambda *a: None)
    assert "Mini course" in (tmp_path / "site" / "docs" / "GLOSSARY.html").read_text()


@pytest.mark.parametrize("target", ["notes.md", "link.json", "nowhere/b.json"])
def test_the_site_record_replaces_only_an_earlier_record(tmp_path, target):
    """#60 round 5's BK15: `book/build.py --record README.md` replaced the repository's README with the build's JSON;
    --record now writes a new file or replaces an earlier build record, and refuses anything else before building."""
    import subprocess
    import sys

    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    (tmp_path / "link.json").symlink_to(mine)
    why = {"notes.md": "not an earlier build record", "link.json": "not a plain file",
           "nowhere/b.json": "its folder does not exist"}[target]
    r = subprocess.run([sys.executable, "book/build.py", "--out", str(tmp_path / "site"), "--record",
                        str(tmp_path / target)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert mine.read_text() == "my notes\n" and not (tmp_path / "site").exists()


@pytest.mark.parametrize("args,why", [
    (["--record", ""], "--record is empty"),
    (["--ref", " "], "--ref is empty"),
    (["--ref", "HEAD~99999"], "git cannot read that revision"),
    (["--ref=--output=x.tar"], "does not start with '-'"),
], ids=["empty record", "empty ref", "no such revision", "an option as ref"])
def test_a_bad_ref_or_record_is_refused_in_one_line_before_building(tmp_path, args, why):
    """Round 5's BK16 and round 6: `--ref HEAD~99999` ended in a raw CalledProcessError traceback, `--record ''` built
    and recorded nothing without a word; a ref starting with '-' reached git as an option."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "book/build.py", "--out", str(tmp_path / "site"), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "site").exists() and not (ROOT / "x.tar").exists()


SETTINGS = {  # round 7's K1, K3, K4: a page that changes how the site is built, each would publish the secret
    "substitutions in front matter": ("docs/GLOSSARY.md", "---\nmyst:\n  enable_extensions: [\"substitution\"]\n---\n"
                                      "# Glossary\n\n{{ cycler.__init__.__globals__.__builtins__.open('{p}').read() }}\n"),
    "a text notebook run at build": ("docs/GLOSSARY.md", "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  "
                                     "display_name: Python 3\nmystnb:\n  execution_mode: force\n---\n# Glossary\n\n"
                                     "```{code-cell} python3\nprint(open('{p}').read())\n```\n"),
    "a notebook asking to be run": ("notebooks/00_primer.ipynb", None),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_a_page_that_changes_how_the_site_is_built_is_refused(tmp_path, monkeypatch, capsys, case):
    """MyST and myst-nb read a page's front matter (a notebook's metadata) as build settings that override
    book/conf.py: Jinja2 substitutions (not sandboxed: any Python at build time) or execution_mode: force published
    a file outside the repository, exit 0. Refused in one line naming the page and the keys, nothing published."""
    book = _book()
    secret = _outside(tmp_path) / "environ"
    root = _tree(tmp_path)
    where, text = SETTINGS[case]
    if text is None:
        (root / "notebooks").mkdir()
        nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Primer\n"},
                        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                         "source": f"print(open({str(secret)!r}).read())"}],
              "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                           "mystnb": {"execution_mode": "force"}}, "nbformat": 4, "nbformat_minor": 5}
        (root / where).write_text(json.dumps(nb))
    else:
        (root / where).write_text(text.replace("{p}", str(secret)))
    err, out = _build_refused(book, root, tmp_path, monkeypatch, capsys)
    assert where in err and "change how the site is built" in err, err
    assert SECRET not in _site_text(out)


def test_front_matter_with_only_page_settings_still_builds(tmp_path):
    book = _book()
    root = _tree(tmp_path)
    (root / "docs" / "GLOSSARY.md").write_text("---\ntitle: Terms\n---\n# Glossary\n\nWhat it is.\n")
    book.build(tmp_path / "site", root, log=lambda *a: None)
    assert "What it is." in (tmp_path / "site" / "docs" / "GLOSSARY.html").read_text()


def test_a_listed_name_with_a_line_break_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Round 7's K5: a committed file named 'a' + newline + '<details open ontoggle=alert(5)>' broke out of the folder
    listing's code span into a live HTML block."""
    book = _book()
    root = _tree(tmp_path, " [the folder](docs/odd/)")
    (root / "docs" / "odd").mkdir()
    (root / "docs" / "odd" / "a\n<details open ontoggle=alert(5)>").write_text("y\n")
    err, out = _build_refused(book, root, tmp_path, monkeypatch, capsys)
    assert "line break" in err and "rename it" in err, err


SUBST = 'myst:\n  enable_extensions: ["substitution"]\n'
FRONT_FORMS = {  # round 8: front matter MyST reads that a regex of the builder's own did not (each leaked a file)
    "closed by ...": "---\n" + SUBST + "...\n# T\n",
    "four dashes": "----\n" + SUBST + "----\n# T\n",
    "a comment on the opening line": "--- # settings\n" + SUBST + "---\n# T\n",
    "a tab and a comment": "---\t# x\n" + SUBST + "---\n# T\n",
    "text after the dashes": "---x\n" + SUBST + "---x\n# T\n",
    "U+2028 line separators": ("---\n" + SUBST + "---\n").replace("\n", "\u2028") + "\n# T\n",
    "a byte-order mark": "\ufeff---\n" + SUBST + "---\n# T\n",
    "a text notebook closed by ...": "---\nfile_format: mystnb\nkernelspec:\n  name: python3\nmystnb:\n  execution_mode: "
                                     "force\n...\n# T\n",
    "not YAML": "---\n: : [\n---\n# T\n",
}


@pytest.mark.parametrize("form", sorted(FRONT_FORMS))
def test_every_front_matter_form_myst_reads_is_checked(form):
    """The check reads a page's settings with MyST's own reader (myst_parser.config.main.read_topmatter), so no form
    MyST accepts slips past it; a block it cannot read is refused too. Only `title` and `orphan` pass."""
    book = _book()
    with pytest.raises(book.BookError, match="docs/X.md: ") as e:
        book._no_build_settings("docs/X.md", FRONT_FORMS[form])
    assert "\n" not in str(e.value)
    book._no_build_settings("docs/X.md", "---\ntitle: T\norphan: true\n...\n# T\n")  # page settings pass
    book._no_build_settings("docs/X.md", "# T\n\n---\n\nmyst: not front matter below the title\n")
    book._no_build_settings("docs/X.md", "---\n---\n# T\n")  # an empty block: no settings (round 9)
    book._no_build_settings("docs/X.md", "+++\nmyst = 1\n+++\n# T\n")  # MyST reads only ---: plain text


TRICKS = {  # round 9's S1, S2 and its FIFO case: directive options that import a module or read before any check
    "rst include with :parser:": "# T\n\n```{eval-rst}\n.. include:: OTHER.md\n   :start-after: MARK\n   :parser: "
                                 "myst_parser.docutils_\n```\n",
    "MyST include with :parser:": "# T\n\n```{include} OTHER.md\n:parser: docs.pwn\n```\n",
    "MyST include with a YAML parser option": "# T\n\n```{include} OTHER.md\n---\nparser: docs.pwn\n---\n```\n",
    "the <name> form": "# T\n\n```{include} <../../fifo>\n```\n",
    "the <name> form on the next line": "# T\n\n```{eval-rst}\n.. include::\n   <../../fifo>\n```\n",  # round 11 T11
    "the <name> form after an NBSP": "# T\n\n```{include}\u00a0<../../fifo>\n```\n",  # round 11 T18
}


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_an_include_that_imports_a_module_or_reads_before_the_check_is_refused(tmp_path, monkeypatch, capsys, trick):
    """Round 9: an include's :parser: option made docutils import any module (a committed docs/pwn.py ran at build
    time; myst_parser's docutils parser read the included text's front matter and ran Jinja2), and the <name> form
    read a FIFO before course.py could look (the build hung). Refused in one line before Sphinx sees the page."""
    book = _book()
    root = _tree(tmp_path)
    (root / "docs" / "pwn.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    (root / "docs" / "OTHER.md").write_text("MARK\n\nother\n")
    (root / "docs" / "GLOSSARY.md").write_text(TRICKS[trick])
    err, out = _build_refused(book, root, tmp_path, monkeypatch, capsys)
    assert "docs/GLOSSARY.md" in err and "remove it" in err, err
    assert not (tmp_path / "ran").exists()


def test_notebook_metadata_beyond_a_lessons_own_is_refused(tmp_path, monkeypatch, capsys):
    """Round 9's S3: a lesson notebook's metadata.html_meta (a refresh to another site) was published as a <meta>."""
    book = _book()
    root = _tree(tmp_path)
    (root / "notebooks").mkdir()
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# Primer\n"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                       "html_meta": {"http-equiv=refresh": "0; url=https://example.invalid/"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / "notebooks" / "00_primer.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    assert book.main(["--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "html_meta" in err, err
    del nb["metadata"]["html_meta"]  # the fix it names
    (root / "notebooks" / "00_primer.ipynb").write_text(json.dumps(nb))
    assert book.main(["--out", str(tmp_path / "site")]) == 0


@pytest.mark.parametrize("case", ["a root index.md beside README.md", "docs/index.md and a link to docs/",
                                  "a root search.md", "x.py beside x.py.md"])
def test_two_files_published_under_one_name_are_refused(tmp_path, monkeypatch, capsys, case):
    """Round 10's N1/N2: a committed index.md replaced the home page (README.md's) and a docs/index.md was replaced by
    the folder listing of docs/, each without a word; a search.md by Sphinx's own search page."""
    book = _book()
    link, files = {"a root index.md beside README.md": (" [i](index.md)", {"index.md": "# I\n"}),
                   "docs/index.md and a link to docs/": (" [i](docs/index.md) [d](docs/)", {"docs/index.md": "# I\n"}),
                   "a root search.md": (" [s](search.md)", {"search.md": "# S\n"}),
                   "x.py beside x.py.md": (" [a](docs/x.py) [b](docs/x.py.md)", {"docs/x.py": "x = 1\n",
                                                                              "docs/x.py.md": "# X\n"})}[case]
    root = _tree(tmp_path, link)
    for name, text in files.items():
        (root / name).write_text(text)
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    assert book.main(["--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would be published as" in err and "rename it" in err, err


@pytest.mark.parametrize("case", ["a file in a dotted folder beside a page", "a picture beside a page of one stem"])
def test_files_that_share_no_published_name_are_built(tmp_path, monkeypatch, capsys, case):
    """Round 11's poor 1 and 2: v1.2/LICENSE beside v1.md was refused as "published as v1.html" (the name was cut at
    the folder's dot), and docs/a.png beside docs/a.md as docs/a.html (a picture is copied, not made a page)."""
    book = _book()
    link, files = {"a file in a dotted folder beside a page": (" [l](v1.2/LICENSE) [v](v1.md)",
                                                              {"v1.2/LICENSE": "MIT\n", "v1.md": "# V1\n"}),
                   "a picture beside a page of one stem": (" ![a](docs/a.png) [p](docs/a.md)",
                                                          {"docs/a.png": _png(), "docs/a.md": "# A\n"})}[case]
    root = _tree(tmp_path, link)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    monkeypatch.setattr(book, "ROOT", root)
    monkeypatch.chdir(tmp_path)
    assert book.main(["--out", str(tmp_path / "site")]) == 0, capsys.readouterr().err
    assert (tmp_path / "site" / ("v1.html" if "dotted" in case else "docs/a.html")).is_file()
