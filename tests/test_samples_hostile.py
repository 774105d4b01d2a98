"""Hostile samples folders (#60): a folder's own files (``metadata.jsonl``, ``masks.npz``, the LLaVA JSON,
``manifest.json``) are read only from inside it and only when they are regular files of a bounded size; every layout
is parsed into the same records and checked by one function; the generator never writes beside your own files; NaN
attention statistics are never "healthy".

docs/FAULTS.md's "Hostile samples and parameters (#60)" table counts the cases below
(tests/test_store_faults.py::test_fault_table_counts_come_from_the_tests)."""
import codecs
import json
import warnings
import os
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.deadline import deadline
from unicache_lib.core.errors import UnicacheError
from unicache_lib.params import check_params
from unicache_lib.world import samples as S




def _png(path, arr=None):
    Image.fromarray(np.zeros((16, 16, 3), np.uint8) if arr is None else arr).save(path)
    return path


def _lines(rows, ascii_only=True) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows).encode("utf-8", "surrogatepass")


def _write_layout(root: Path, layout: str, rows: list[dict], ascii_only=True) -> Path:
    """``rows`` (metadata.jsonl-style records: file_name, question, answer, id, ...) written in ``layout``."""
    root.mkdir(parents=True, exist_ok=True)
    if layout == "metadata":
        (root / "metadata.jsonl").write_bytes(_lines(rows, ascii_only))
    elif layout == "manifest":
        entries = [{("image" if k == "file_name" else k): v for k, v in r.items()} for r in rows]
        (root / "manifest.json").write_bytes(json.dumps({"seed": S.SEED, "samples": entries}, ensure_ascii=ascii_only)
                                             .encode("utf-8", "surrogatepass"))
    else:  # llava: only file_name, question, answer and id travel
        entries = []
        for r in rows:
            e = {"conversations": [{"from": "human", "value": r.get("question")}, {"from": "gpt", "value": r.get("answer")}]}
            if "file_name" in r:
                e["image"] = r["file_name"]
            if "id" in r:
                e["id"] = r["id"]
            entries.append(e)
        (root / "data.json").write_bytes(json.dumps(entries, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    return root


LAYOUTS = ["metadata", "manifest", "llava"]
OWN_FILE = {"metadata": "metadata.jsonl", "manifest": "manifest.json", "llava": "data.json"}


# ---- 1. a folder's own files: inside it, regular, bounded ------------------------------------------------------
@pytest.mark.parametrize("own", ["metadata.jsonl", "manifest.json", "data.json", "masks.npz"])
def test_a_folders_own_files_are_never_read_through_a_symlink_out(tmp_path, own):
    outside = tmp_path / "outside"
    outside.mkdir()
    layout = {"manifest.json": "manifest", "data.json": "llava"}.get(own, "metadata")
    _write_layout(outside, layout, [{"file_name": "a.png", "question": "secret ?"}])
    np.savez(outside / "masks.npz", **{"a.png": np.zeros((1, 16, 16), bool)})
    root = tmp_path / "mine"
    _write_layout(root, layout, [{"file_name": "a.png", "question": "q"}])
    _png(root / "a.png")
    (root / own).unlink(missing_ok=True)
    (root / own).symlink_to(outside / own)
    with pytest.raises(UnicacheError, match=rf"the samples file '{re.escape(own)}' in .* is a symbolic link to .*, "
                                            r"which points outside the folder: it is never followed"):
        S.load(root)
    with pytest.raises(UnicacheError, match=rf"SAMPLES=.*'{re.escape(own)}' in .* is a symbolic link to"):
        check_params({"SAMPLES": str(root)})  # the notebooks' check cell refuses it too


@pytest.mark.parametrize("special", ["metadata.jsonl", "masks.npz", "a.png", "manifest.json"])
def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(tmp_path, special):
    root = _write_layout(tmp_path / "f", "manifest" if special == "manifest.json" else "metadata",
                         [{"file_name": "a.png", "question": "q"}])
    _png(root / "a.png")
    (root / special).unlink(missing_ok=True)
    os.mkfifo(root / special)
    with deadline(20), pytest.raises(UnicacheError, match=r"is a FIFO \(named pipe\), not a regular file"):
        S.load(root)


@pytest.mark.parametrize("special", ["metadata.jsonl", "masks.npz", "a.png"])
def test_a_link_to_dev_zero_or_a_huge_file_is_refused_before_it_is_read(tmp_path, special, monkeypatch):
    root = _write_layout(tmp_path / "f", "metadata", [{"file_name": "a.png", "question": "q"}])
    _png(root / "a.png")
    (root / special).unlink(missing_ok=True)
    (root / special).symlink_to("/dev/zero")
    with deadline(20), pytest.raises(UnicacheError, match=r"(outside|not a regular file)"):
        S.load(root)
    # and a regular file past the size read from a samples folder (a sparse file: no disk used)
    (root / special).unlink()
    monkeypatch.setattr(S, "MAX_TEXT_BYTES", 1 << 20)
    monkeypatch.setattr(S, "MAX_IMAGE_BYTES", 1 << 20)
    monkeypatch.setattr(S, "MAX_MASK_BYTES", 1 << 20)
    with open(root / special, "wb") as f:
        f.truncate((1 << 20) + 1)
    with pytest.raises(UnicacheError, match=r"is 1,048,577 bytes, more than the 1,048,576 read"):
        S.load(root)


@pytest.mark.parametrize("name,msg", [
    ("a\x00.png", r"line 1: file_name 'a\\x00.png' in .* holds a NUL byte"),
    ("loop.png", r"line 1: file_name 'loop.png' in .* is a symbolic link loop"),
    ("x" * 300 + ".png", r"line 1: file_name 'x+'\.\.\. \(304 characters\) in .* is too long to be a file name"),
])
def test_nul_bytes_loops_and_long_names_each_get_their_own_message(tmp_path, name, msg):
    root = _write_layout(tmp_path / "f", "metadata", [{"file_name": name, "question": "q"}])
    (root / "loop.png").symlink_to(root / "loop2.png")
    (root / "loop2.png").symlink_to(root / "loop.png")
    with pytest.raises(UnicacheError, match=msg) as e:
        S.load(root)
    assert "points outside" not in str(e.value)


def test_a_long_folder_name_is_one_line_not_a_raw_oserror(tmp_path):
    with pytest.raises(UnicacheError, match=r"SAMPLES=.*cannot be read \(File name too long\)"):
        check_params({"SAMPLES": str(tmp_path / ("x" * 300))})


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_a_line_separator_inside_a_string_stays_in_it(tmp_path, char):
    """JSON lines end at "\\n" only; str.splitlines would cut the line at U+2028 and call it "not JSON"."""
    root = _write_layout(tmp_path / "f", "metadata", [{"file_name": "a.png", "question": f"what{char}is it ?"}],
                         ascii_only=False)
    assert char.encode() in (root / "metadata.jsonl").read_bytes()
    _png(root / "a.png")
    assert S.load(root)[0].question == f"what{char}is it ?"


# ---- 2. one set of checks for every layout ---------------------------------------------------------------------
BAD_RECORDS = [
    ([{"file_name": "a.png", "question": None}], r"'question' must be a non-empty text"),
    ([{"file_name": "a.png", "question": "q", "objects": "red circle"}], r"'objects' must be a list"),
    ([{"file_name": "a.png", "question": "q", "id": "s"}, {"file_name": "b.png", "question": "q", "id": "s"}],
     r"sample id 's' is also .*'s"),
    ([{"file_name": "c.png", "question": "q"}], r"c.png is a 16-bit image"),
]


@pytest.mark.parametrize("layout", ["metadata", "manifest"])
@pytest.mark.parametrize("rows,msg", BAD_RECORDS)
def test_every_layout_gets_the_same_checks(tmp_path, layout, rows, msg):
    root = _write_layout(tmp_path / "f", layout, rows)
    _png(root / "a.png")
    _png(root / "b.png")
    Image.fromarray(np.full((16, 16), 40000, np.uint16)).save(root / "c.png")  # used to read as 99.6% white
    with pytest.raises(UnicacheError, match=msg):
        S.load(root)
    with pytest.raises(UnicacheError, match=rf"SAMPLES=.*{msg}"):
        check_params({"SAMPLES": str(root)})


def test_the_shipped_manifest_still_loads_exactly():
    man = json.loads((S.SAMPLES_DIR / "manifest.json").read_text())
    got = S.load()
    assert [s.id for s in got] == [e["id"] for e in man["samples"]]
    assert all(s.question == e["question"] and s.answer == e["answer"] and s.objects == e["objects"]
               and s.masks.shape[0] == len(e["objects"]) for s, e in zip(got, man["samples"]))


# ---- 3. the generator and a folder of your own images ----------------------------------------------------------
@pytest.mark.parametrize("name", ["photos", "bob's photos", "a$(touch PWNED)b", 'say "cheese" `id` ; ls', "two  spaces"])
def test_a_folder_of_plain_images_is_told_how_to_write_its_metadata_and_the_way_works(tmp_path, name):
    """The hint's shell command quotes the folder (shlex.quote): `bob's photos` used to make it unparseable and
    `a$(touch PWNED)b` ran `touch PWNED` when pasted. Run through bash as printed, it writes metadata.jsonl and
    nothing else, whatever the folder's name."""
    import shlex
    import subprocess
    import sys

    work = tmp_path / "work"
    root = work / name
    root.mkdir(parents=True)
    for n in ("cat.png", "dog.png"):
        _png(root / n)
    with pytest.raises(UnicacheError, match=r"holds 2 images \(cat.png, dog.png\) but no metadata.jsonl.*one JSON line "
                                            r"per image.*your images stay as they are") as e:
        S.load(root)
    msg = str(e.value)
    assert "--out" not in msg and "\n" not in msg  # the generator is not suggested for a folder of your images
    command = S.metadata_command(root, (".png",))
    assert f"the shell command  {command}  (then edit" in msg
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"] and len(argv) == 3  # one program, one word, the folder inside it as a literal
    done = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} {command[len('python '):]}"], cwd=work,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in work.iterdir()) == [name]  # no PWNED, nothing beside the folder
    assert sorted(p.name for p in root.iterdir()) == ["cat.png", "dog.png", "metadata.jsonl"]
    assert [(s.id, s.question) for s in S.load(root)] == [("cat", "what is in the image ?"), ("dog", "what is in the image ?")]


@pytest.mark.parametrize("folder", [False, True])
def test_the_generator_never_writes_beside_files_it_did_not_make(tmp_path, folder, capsys):
    root = tmp_path / "photos"
    root.mkdir()
    _png(root / "cat.png")
    args = ["--out", str(root)] + (["--folder"] if folder else [])
    with pytest.raises(SystemExit) as e:
        S.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"error: --out .* holds files the sample generator did not write \(e\.g\. cat.png", err), err
    assert sorted(p.name for p in root.iterdir()) == ["cat.png"]  # nothing written
    fresh = tmp_path / "fresh"
    S.main(["--out", str(fresh)] + (["--folder"] if folder else []))
    S.main(["--out", str(fresh)] + (["--folder"] if folder else []))  # over its own output: allowed
    assert len(S.load(fresh)) == 20
    S.main(["--out", str(fresh)] + ([] if folder else ["--folder"]))  # the other layout: its earlier files go
    assert len(S.load(fresh)) == 20 and len(list(fresh.glob("*.json*"))) == 1


@pytest.mark.parametrize("folder", [False, True])
def test_the_generator_never_replaces_your_manifest_or_metadata(tmp_path, folder, capsys):
    """#60, second round: the generator decided what it owned by file name, so `--out` a folder holding only a user's
    manifest.json (a web app's) or metadata.jsonl (their samples) replaced it. It owns what its .unicache-output lists
    (or, for a folder an earlier version wrote, files exactly as it writes them)."""
    mine = tmp_path / "proj"
    mine.mkdir()
    own = "metadata.jsonl" if folder else "manifest.json"
    text = ('{"file_name": "images/x.png", "question": "mine"}\n' if folder else '{"name": "my web app"}')
    (mine / own).write_text(text)
    with pytest.raises(SystemExit) as e:
        S.main(["--out", str(mine)] + (["--folder"] if folder else []))
    assert e.value.code == 2 and f"did not write (e.g. {own}" in capsys.readouterr().err
    assert (mine / own).read_text() == text and sorted(p.name for p in mine.iterdir()) == [own]
    earlier = tmp_path / "earlier"  # what `make samples` wrote before the marker existed: refused now, nothing recorded
    S.main(["--out", str(earlier)] + (["--folder"] if folder else []))  # what it wrote (#60, fourth round)
    S.main(["--out", str(earlier)] + (["--folder"] if folder else []))  # its own folder, marked: taken again
    (earlier / ".unicache-output").unlink()
    with pytest.raises(SystemExit) as e:
        S.main(["--out", str(earlier)] + (["--folder"] if folder else []))
    assert e.value.code == 2 and "earlier version of the sample generator" in capsys.readouterr().err
    assert len(S.load(earlier)) == 20


@pytest.mark.parametrize("value", ["", " "])
def test_the_generator_refuses_an_empty_out(tmp_path, value, capsys, monkeypatch):
    """`--out ''` wrote 22 files into the current folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        S.main(["--out", value])
    assert e.value.code == 2 and "is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as e:
        S.main(["--out", str(tmp_path / "s"), "--seed", "-5"])
    assert e.value.code == 2 and "--seed=-5 is outside 0..4294967295" in capsys.readouterr().err


def _snap(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("args,says", [(["--seed", "5"], "would change"), (["--folder"], "would change"),
                                       (["--folder", "--seed", "5"], "would change")])
def test_the_shipped_set_is_regenerated_only_byte_for_byte(tmp_path, monkeypatch, capsys, args, says):
    """L1/L2 (#60 round IV): the data/samples exemption checked file names only, so `--seed 5 --out data/samples`
    rewrote 22 committed files (load() then silently returned the seed-5 set) and `--folder --out data/samples` left
    it unloadable (metadata.jsonl beside manifest.json, masks.npz rekeyed). Now the set is written into a temporary
    folder and each file must match the committed one's SHA-256: refused in one line, exit 2, nothing written. The
    byte-identical regeneration still runs, and restores a committed file that went missing; a local edit is refused."""
    shipped = tmp_path / "data" / "samples"
    shipped.mkdir(parents=True)
    for p in S.SAMPLES_DIR.iterdir():
        (shipped / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(S, "SAMPLES_DIR", shipped)
    before = _snap(shipped)
    with pytest.raises(SystemExit) as e:
        S.main([*args, "--out", str(shipped)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err and "shipped sample set" in err, err
    assert _snap(shipped) == before
    assert [s.answer for s in S.load(shipped)] == [s.answer for s in S.load()]
    (shipped / "single-0.png").unlink()
    S.main(["--out", str(shipped)])  # the default seed: byte for byte, the missing image restored
    capsys.readouterr()
    assert _snap(shipped) == before
    man = json.loads((shipped / "manifest.json").read_text())
    man["samples"][0]["answer"] = "my edit"
    (shipped / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(SystemExit) as e:
        S.main(["--out", str(shipped)])
    assert e.value.code == 2 and "manifest.json" in capsys.readouterr().err
    assert "my edit" in (shipped / "manifest.json").read_text()


@pytest.mark.parametrize("sid,why", [("../../ESCAPED", "holds a path separator"), ("..", "is '..', a folder's name"),
                                     ("a\\b", "holds a path separator"), ("a\x00b", "holds a NUL byte"),
                                     ("x" * 201, "is 201 bytes long, more than the 200")])
def test_a_sample_id_is_a_plain_name_in_load_and_in_the_writers(tmp_path, sid, why):
    """#60, second round: load() accepted the id '../../ESCAPED' from a metadata.jsonl, and export_folder / save then
    wrote base/ESCAPED.png, outside their folder. An id is a plain name: refused on load and by both writers."""
    base = tmp_path / "base"
    src = _write_layout(base / "in", "metadata", [{"file_name": "a.png", "question": "q", "id": sid}])
    _png(src / "a.png")
    with pytest.raises(UnicacheError, match=rf"line 1: sample id .* {re.escape(why)}.*plain name"):
        S.load(src)
    ok = _write_layout(base / "ok", "metadata", [{"file_name": "a.png", "question": "q"}])
    _png(ok / "a.png")
    sample = S.load(ok)[0]
    sample.id = sid  # as a caller may build it
    for write in (S.export_folder, S.save):
        with pytest.raises(UnicacheError, match=rf"sample id .* {re.escape(why)}.*nothing was written"):
            write([sample], base / "exp" / "out")
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*")) == [
        "in", "in/a.png", "in/metadata.jsonl", "ok", "ok/a.png", "ok/metadata.jsonl"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["NFC and NFD", "case", "leading dot", "newline"])
def test_ids_that_collide_on_a_file_system_or_hide_their_file_are_refused(tmp_path, layout, case):
    """#60, fourth round: ids that differ only by Unicode normalisation ('caf\u00e9' NFC and NFD) or by case ('Cat-1',
    'cat-1'), or that start with a dot or hold a newline, were accepted in every layout; written as <id>.png the twins
    are one file on macOS / Windows. One set of checks (samples._id_problem, samples._id_key) refuses each in one line
    naming both ids, on load in each layout and in both writers."""
    ids = {"NFC and NFD": ["caf\u00e9", "cafe\u0301"], "case": ["Cat-1", "cat-1"], "leading dot": [".hidden"],
           "newline": ["a\nb"]}[case]
    why = {"NFC and NFD": "differ only in case or Unicode normalisation", "case": "differ only in case",
           "leading dot": "starts with a dot", "newline": "holds the control character '\\n' (U+000A)"}[case]
    src = _write_layout(tmp_path / "in", layout, [{"file_name": f"{i}.png", "question": "q", "answer": "a", "id": sid}
                                                  for i, sid in enumerate(ids)], ascii_only=False)
    for i in range(len(ids)):
        _png(src / f"{i}.png")
    with pytest.raises(UnicacheError, match=re.escape(why)) as e:
        S.load(src)
    msg = str(e.value)
    assert "\n" not in msg.replace("'\\n'", "") and all(repr(sid) in msg for sid in ids), msg
    ok = _write_layout(tmp_path / "ok", "metadata", [{"file_name": f"{i}.png", "question": "q"} for i in range(2)])
    for i in range(2):
        _png(ok / f"{i}.png")
    samples = S.load(ok)[: len(ids)]
    for sample, sid in zip(samples, ids):
        sample.id = sid  # as a caller may build them
    for write in (S.export_folder, S.save):
        with pytest.raises(UnicacheError, match=re.escape(why) + ".*nothing was written"):
            write(samples, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_one_folder_two_layouts_or_two_llava_files_is_refused_naming_both(tmp_path):
    """A generator folder (manifest.json) with the user's metadata.jsonl added: the manifest won and the user's lines
    were ignored without a word; train.json and val.json: only train.json was read."""
    gen = tmp_path / "gen"
    S.main(["--out", str(gen)])
    (gen / "metadata.jsonl").write_text('{"file_name": "mine.png", "question": "q"}\n')
    with pytest.raises(UnicacheError, match=r"holds both manifest.json .* and metadata.jsonl .*keep one"):
        S.load(gen)
    two = tmp_path / "llava"
    two.mkdir()
    _png(two / "a.png")
    for f in ("train.json", "val.json"):
        (two / f).write_text(json.dumps([{"image": "a.png", "id": f, "conversations": [{"from": "human", "value": "q"}]}]))
    with pytest.raises(UnicacheError, match=r"holds 2 LLaVA-style conversation files \(train.json, val.json\).*folder "
                                            r"of its own"):
        S.load(two)
    (two / "val.json").unlink()  # the fix: one per folder
    assert [s.id for s in S.load(two)] == ["train.json"]


@pytest.mark.parametrize("first", ["metadata.jsonl", "manifest.json"])
def test_a_layout_file_beside_a_llava_json_is_refused_naming_both(tmp_path, first):
    """#60 SA21/SA41: metadata.jsonl (or manifest.json) with a LLaVA data.json: only the first was read, the LLaVA
    entries left out without a word, and the check cell accepted the folder."""
    d = tmp_path / "mix"
    if first == "manifest.json":
        S.main(["--out", str(d)])
    else:
        d.mkdir()
        _png(d / "a.png")
        (d / "metadata.jsonl").write_text('{"file_name": "a.png", "question": "what ?"}\n')
    _png(d / "b.png")
    (d / "data.json").write_text(json.dumps([{"image": "b.png", "conversations": [
        {"from": "human", "value": "<image>\nwhat colour?"}, {"from": "gpt", "value": "blue"}]}]))
    msg = rf"holds both {re.escape(first)} .* and data.json \(a LLaVA-style conversations file\).*keep one"
    with pytest.raises(UnicacheError, match=msg):
        S.load(d)
    if first == "metadata.jsonl":
        with pytest.raises(UnicacheError, match=msg):
            S.read_folder(d)
    with pytest.raises(UnicacheError, match=msg):
        check_params({"SAMPLES": str(d)}, names=["SAMPLES"])
    (d / "data.json").rename(tmp_path / "data.json")  # the fix: one layout per folder
    assert S.load(d)


BOM_CASES = {  # #60 round 3: what each folder holds beside a.png/b.png, and what load must say
    "metadata + BOM data.json (SA1)": (["metadata.jsonl", "data.json:bom"], r"holds both metadata.jsonl .* and data.json"),
    "plain a.json + BOM b.json (SA24)": (["a.json", "b.json:bom"], r"holds 2 LLaVA-style conversation files \(a.json, b.json\)"),
    "BOM data.json alone (SA2)": (["data.json:bom"], None),
    "metadata + cut-short data.json (SA8)": (["metadata.jsonl", "data.json:cut"], r"data.json, line 1: not JSON .*move it out"),
    "metadata + UTF-16 data.json (SA26)": (["metadata.jsonl", "data.json:utf16"], r"data.json: not UTF-8 text \(byte 0, a UTF-16 file\).*save it as UTF-8"),
    "metadata + a JSON that is no sample file": (["metadata.jsonl", "dataset_info.json:other"], None),
}


@pytest.mark.parametrize("case", list(BOM_CASES))
def test_a_json_with_a_bom_or_that_does_not_parse_is_never_passed_over(tmp_path, case):
    """#60 SA1/SA24/SA2/SA8/SA26: a LLaVA JSON with a UTF-8 byte-order mark (Windows tools write one) was skipped
    without a word, so a folder holding it and metadata.jsonl (or another LLaVA JSON) loaded only the other's samples;
    a *.json that does not parse (cut short, UTF-16) was passed over too. A BOM is read past (the two-layout
    refusals see the file); a *.json that does not parse is refused naming it; a JSON that parses but is no
    conversations list (dataset_info.json) is still left alone."""
    files, msg = BOM_CASES[case]
    d = tmp_path / "f"
    d.mkdir()
    _png(d / "a.png")
    _png(d / "b.png")
    llava = json.dumps([{"image": "b.png", "conversations": [{"from": "human", "value": "<image>\nwhat?"},
                                                             {"from": "gpt", "value": "x"}]}])
    for spec in files:
        name, _, how = spec.partition(":")
        data = {"": llava.encode(), "bom": codecs.BOM_UTF8 + llava.encode(), "cut": llava.encode()[:40],
                "utf16": llava.encode("utf-16"), "other": b'{"description": "my set"}'}[how]
        if name == "metadata.jsonl":
            data = b'{"file_name": "a.png", "question": "q ?"}\n'
        (d / name).write_bytes(data)
    if msg is None:
        want = ["b"] if files[0].startswith("data.json") else ["a"]
        assert [s.id for s in S.load(d)] == [s.id for s in S.read_folder(d)] == want
        check_params({"SAMPLES": str(d)}, names=["SAMPLES"])  # accepted
        return
    for act in (S.load, S.read_folder, lambda p: check_params({"SAMPLES": str(p)}, names=["SAMPLES"])):
        with pytest.raises(UnicacheError, match=msg) as e:
            act(d)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("answer,msg", [(2.0, r"got float 2\.0: write it as the text .* e\.g\. \"2\""),
                                        (float("nan"), r"got float nan: write it as the text"),
                                        (3, r"got int 3: write it as the text .* e\.g\. \"3\"")])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_answer_must_be_text(tmp_path, layout, answer, msg):
    """A pandas-exported count (2.0) became '2.0', never scored right; NaN became 'nan'."""
    root = _write_layout(tmp_path / "f", layout, [{"file_name": "a.png", "question": "how many ?", "answer": answer}])
    _png(root / "a.png")
    with pytest.raises(UnicacheError, match=rf"'answer' must be a text \(or left out\), {msg}"):
        S.load(root)


def test_subsets_take_lists_of_exact_names():
    """scene_types='singleclutter' matched as a substring (8 samples of two types); ids='single-0' was read character
    by character; per_type=0 returned [] without a word."""
    with pytest.raises(UnicacheError, match=r"scene_types must be a list of exact names.*pass \['singleclutter'\]"):
        S.load(scene_types="singleclutter")
    with pytest.raises(UnicacheError, match=r"scene_types: no scene type 'singleclutter'"):
        S.load(scene_types=["singleclutter"])
    with pytest.raises(UnicacheError, match=r"ids must be a list of exact names, e\.g\. ids=\['single-0'"):
        S.load(ids="single-0")
    with pytest.raises(UnicacheError, match=r"per_type=0 is outside 1\.\.\d+: keep at least one sample of each scene type$"):
        S.load(per_type=0)
    assert {s.scene_type for s in S.load(scene_types=["single", "clutter"])} == {"single", "clutter"}
    assert [s.id for s in S.load(ids=["single-0"])] == ["single-0"]


@pytest.mark.parametrize("mode,arr,kind", [("I;16", np.full((8, 8), 40000, np.uint16), "16-bit"),
                                           ("F", np.full((8, 8), 0.5, np.float32), "32-bit floating-point")])
def test_a_high_bit_image_is_refused_once_not_wrapped_in_a_contradiction(tmp_path, mode, arr, kind):
    """The 16-bit refusal used to arrive inside 'is not a readable image (...): re-save it as PNG or JPEG'."""
    root = _write_layout(tmp_path / "f", "metadata", [{"file_name": "a.tif", "question": "q"}])
    Image.fromarray(arr).save(root / "a.tif")
    with pytest.raises(UnicacheError, match=rf"a.tif is a {kind} image") as e:
        S.load(root)
    assert "not a readable image" not in str(e.value) and "re-save it as PNG" not in str(e.value)


# ---- 4. statistics: NaN or inf is never "healthy" ---------------------------------------------------------------
def _records(value, layers=(0, 1)):
    from unicache_lib.core.modality import BLOCKS

    out = []
    for s in range(2):
        for layer in layers:
            b = torch.full((2, len(BLOCKS)), 0.25)
            if (s, layer) == (1, layers[1]):
                b[:, BLOCKS.index("text->image")] = value
            out.append(types.SimpleNamespace(sample=str(s), layer=layer, part="language", data={"blocks": b}))
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_statistics_are_not_measurable_never_healthy(value):
    from unicache_lib.core.errors import AttentionValueError
    from unicache_lib.diagnostics.neglect import detect_neglect

    assert str(detect_neglect(_records(0.25))).startswith("healthy")
    with pytest.raises(AttentionValueError, match=r"not measurable: 1 of 4 .*NaN or infinite.*sample 1, layer 1"):
        detect_neglect(_records(value))
    with pytest.raises(UnicacheError, match=r"cutoff must be a share in \[0, 1\]"):
        detect_neglect(_records(0.25), cutoff=float("nan"))


def test_the_verdict_names_the_captured_layers_and_the_thresholds_used():
    """Round 12's N1: a capture of layers [1, 3] was reported as "cut-off from layer 0 ... L0, L1", with the default
    5% / 15% printed whatever thresholds were passed."""
    from unicache_lib.diagnostics.neglect import detect_neglect

    v = detect_neglect(_records(0.25, layers=(1, 3)), cutoff=0.6, warn=0.7)
    assert v.fires and str(v).startswith("MODALITY CUT-OFF from layer 1 (share < 60%)") and " L1 " in str(v)
    assert " L3 " in str(v) and " L0 " not in str(v)
    assert str(detect_neglect(_records(0.25, layers=(1, 3)), cutoff=0.1, warn=0.7)).startswith(
        "warning: text reads the image weakly in layers [1, 3] (< 70%)")
    # round 14's SN7: a cross-attention model's records: its cross layers read only the image (called "healthy"), its
    # self-attention layers hold none (a "MODALITY CUT-OFF"), and both parts were judged as one
    from unicache_lib.core.errors import AttentionValueError

    cross = _records(0.25, layers=(1, 3))
    for r in cross:
        r.part = "cross"
    with pytest.raises(UnicacheError, match=r"records of 2 parts \(cross, language\): pass one part's"):
        detect_neglect(_records(0.25) + cross)
    with pytest.raises(AttentionValueError, match=r"not measurable here: layer 1 \(cross\) reads only the image"):
        detect_neglect(cross)


# ---- 5. property: every layout loads exactly as written or raises the workbench's error -----------------------
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)
_NAMES = ["a.png", "b.png", "sub/a.png", "../a.png", "/etc/hostname", "a\x00.png", "x" * 300 + ".png", "loop.png",
          "fifo.png", "zero.png", "out.png", "sub", "", 3, None]
_record = st.fixed_dictionaries(  # about half of the records are sound, so both outcomes are exercised
    {"file_name": st.sampled_from(_NAMES[:3]) | st.sampled_from(_NAMES),
     "question": st.text(min_size=1, max_size=12) | st.sampled_from(["what\u2028is it ?", "<image>\nq", None, ""])},
    optional={"answer": st.text(max_size=6) | _json, "id": st.text(max_size=6) | _json,
              "objects": st.just([{"colour": "red"}]) | _json, "scene_type": st.sampled_from(["text", "x", None])})


def _hostile_folder(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    for n in ("a.png", "b.png", "sub/a.png"):
        _png(root / n, np.full((16, 16, 3), 7, np.uint8))
    _png(root.parent / "outside.png", np.full((16, 16, 3), 200, np.uint8))
    (root / "out.png").symlink_to(root.parent / "outside.png")
    (root / "zero.png").symlink_to("/dev/zero")
    (root / "loop.png").symlink_to(root / "loop.png")
    os.mkfifo(root / "fifo.png")
    return root


def _expected(layout, r):
    q = r["question"].replace("<image>", "").strip() if layout == "llava" else r["question"]
    return (str(r.get("id", Path(r["file_name"]).stem)), q, None if r.get("answer") is None else str(r["answer"]))


@pytest.mark.parametrize("layout", LAYOUTS)
@PROPERTY
@given(rows=st.lists(_record, min_size=1, max_size=3), ascii_only=st.booleans())
def test_property_every_samples_layout_loads_exactly_or_refuses(tmp_path_factory, layout, rows, ascii_only):
    root = _write_layout(_hostile_folder(tmp_path_factory.mktemp("h") / "f"), layout, rows, ascii_only)
    try:
        with deadline(30):
            got = S.load(root)
    except UnicacheError:
        return
    assert [(s.id, s.question, s.answer) for s in got] == [_expected(layout, r) for r in rows]
    assert all(r["file_name"] in ("a.png", "b.png", "sub/a.png") for r in rows)  # only files inside, regular, real
    assert all(int(s.image[0, 0, 0]) == 7 for s in got)  # never the outside file's pixels


def test_an_image_stored_turned_by_exif_is_refused_naming_the_fix(tmp_path):
    """Found by the third adversarial round: an EXIF orientation tag was ignored (the model reads the stored pixels,
    a viewer shows them turned); now refused in one line, and the fix it names works."""
    import json

    from PIL import Image, ImageOps

    from unicache_lib.core.errors import InputError
    from unicache_lib.world import samples as S

    im = Image.fromarray(np.zeros((4, 8, 3), np.uint8))
    ex = Image.Exif()
    ex[0x0112] = 6
    im.save(tmp_path / "a.jpg", exif=ex)
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "a.jpg", "question": "q"}) + "\n")
    with pytest.raises(InputError, match="EXIF orientation 6.*exif_transpose"):
        S.load(tmp_path)
    ImageOps.exif_transpose(Image.open(tmp_path / "a.jpg")).save(tmp_path / "a.jpg")
    assert S.load(tmp_path)[0].image.shape == (8, 4, 3)


# ---- #60 round IV: one rule for every layout (seed, masks, conversations) -----------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", ["seed", "seed and per_type", "check cell"])
def test_your_own_folder_in_any_layout_never_becomes_the_synthetic_set(tmp_path, layout, how):
    """S1-S3: a manifest.json folder of your own images loaded with seed=1 (with per_type=1, or SAMPLES + SAMPLE_SEED=1
    + PER_TYPE=2 in the check cell) returned the synthetic standard set (single-0, overlap-0, ...) without a word; the
    metadata.jsonl layout refused it. Now one rule for every layout: refused naming the folder and the seed to pass."""
    root = _write_layout(tmp_path / "mine", layout, [{"file_name": "cat.png", "question": "what animal ?",
                                                       "answer": "cat", "id": "cat"}])
    _png(root / "cat.png")
    with pytest.raises(UnicacheError) as e:
        if how == "check cell":
            check_params({"SAMPLES": str(root), "SAMPLE_SEED": 1, "PER_TYPE": 2},
                         names=["SAMPLES", "SAMPLE_SEED", "PER_TYPE"])
        else:
            S.load(root, seed=1, per_type=1 if how == "seed and per_type" else None)
    msg = str(e.value)
    assert "\n" not in msg and "your own sample folder" in msg and "SAMPLE_SEED=" in msg, msg
    assert [s.id for s in S.load(root, seed=S.SEED)] == ["cat"]  # its own seed: your samples


def test_a_standard_set_in_a_manifest_still_draws_another_seed(tmp_path):
    S.save(S.build(S.SEED, 1), tmp_path / "std")
    assert [s.id for s in S.load(tmp_path / "std", seed=5)] == [s.id for s in S.build(5, 1)]
    assert S.load(tmp_path / "std", seed=5)[0].question == S.build(5, 1)[0].question


MASK_CASES = {  # (file_name of the line, its objects, masks.npz content) -> what the refusal says (None: loads)
    "key in another case": ("a.png", [], {"A.png": 1}, "key 'A.png' names no sample"),
    "only keys of no sample": ("a.png", [], {"zzz.png": 1}, "key 'zzz.png' names no sample"),
    "more masks than objects": ("a.png", [{"colour": "red", "shape": "circle"}], {"a.png": 3}, "holds 3 mask(s) but"),
    "./a.png keyed a.png": ("./a.png", [], {"a.png": 2}, None),
    "keyed by id": ("a.png", [], {"a": 2}, None),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", sorted(MASK_CASES))
def test_masks_name_their_samples_in_every_layout(tmp_path, layout, case):
    """S4-S8: masks.npz keyed "A.png" for file_name "a.png", keyed "a.png" for "./a.png", holding only keys of no
    sample, keyed by file name in the manifest layout (it keys by id): every mask silently dropped; 3 masks for 1
    listed object accepted. Now a key names a sample by its file_name (as a path) or its id, in every layout; a key
    that names none is refused with the closest name, and a sample's masks must match its listed objects."""
    name, objects, masks, says = MASK_CASES[case]
    row = {"file_name": name, "question": "what ?", "answer": "x", "id": "a"}
    if objects:
        row["objects"] = objects
    if layout == "llava" and objects:
        pytest.skip("a LLaVA entry lists no objects")
    root = _write_layout(tmp_path / "f", layout, [row])
    _png(root / "a.png")
    np.savez(root / "masks.npz", **{k: np.zeros((n, 16, 16), bool) for k, n in masks.items()})
    if says is None:
        (s,) = S.load(root)
        assert s.masks.shape == (next(iter(masks.values())), 16, 16)
        return
    with pytest.raises(UnicacheError) as e:
        S.load(root)
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)
    if case == "key in another case":
        assert "did you mean 'a.png'" in str(e.value)


def test_a_llava_conversation_of_several_turns_is_refused_not_cut(tmp_path):
    """S9: a LLaVA entry with two human/gpt turns kept only the first question; the second ("and the shape ?" ->
    "circle") was dropped without a word. Now refused naming the entry and how to split it."""
    _png(tmp_path / "a.png")
    turns = [{"from": "human", "value": "<image>\nwhat colour ?"}, {"from": "gpt", "value": "red"},
             {"from": "human", "value": "and the shape ?"}, {"from": "gpt", "value": "circle"}]
    (tmp_path / "data.json").write_text(json.dumps([{"id": "a", "image": "a.png", "conversations": turns}]))
    with pytest.raises(UnicacheError, match=r"entry 0: a conversation of 2 questions and 2 answers.*split the entry"):
        S.load(tmp_path)
    (tmp_path / "data.json").write_text(json.dumps([{"id": "a", "image": "a.png", "conversations": turns[:2]}]))
    assert S.load(tmp_path)[0].answer == "red"


@pytest.mark.parametrize("case", ["question twice", "file_name twice", "llava image twice"])
def test_a_json_object_naming_a_key_twice_is_refused(tmp_path, case):
    """#60 round 4's NSA1/NSA2/NSA14: a samples record naming one key twice loaded the last value without a word
    (the second question; sample b.png instead of a.png); it is refused naming the file, the line and the key."""
    d = tmp_path / "own"
    d.mkdir()
    _png(d / "a.png")
    _png(d / "b.png")
    if case == "llava image twice":
        (d / "data.json").write_text('[{"image": "a.png", "image": "b.png", "conversations": [{"from": "human", '
                                     '"value": "<image>\\nwhat colour?"}, {"from": "gpt", "value": "blue"}]}]')
        key, where = "image", "data.json"
    else:
        row = ('{"file_name": "a.png", "question": "what colour?", "question": "what shape?"}' if case == "question twice"
               else '{"file_name": "a.png", "file_name": "b.png", "question": "what colour?"}')
        (d / "metadata.jsonl").write_text(row + "\n")
        key, where = case.split()[0], "metadata.jsonl, line 1"
    with pytest.raises(UnicacheError, match=rf"{re.escape(where)}: the key '{key}' is written twice.*keep one"):
        S.load(d)
    with pytest.raises(UnicacheError, match=rf"the key '{key}' is written twice"):
        check_params({"SAMPLES": str(d)}, names=["SAMPLES"])


@pytest.mark.parametrize("key,near", [("anwser", "answer"), ("Question", "question"), ("filename", "file_name")])
@pytest.mark.parametrize("layout", ["metadata", "manifest"])
def test_a_misspelt_field_is_refused_naming_the_field_meant(tmp_path, layout, key, near):
    """Round 11's poor 7: "anwser": "red" left the sample with no answer (never scored), "Question" beside "question"
    was ignored, without a word. A key of your own that is no near-miss (qid, license) is still left alone."""
    row = {"file_name": "a.png", "question": "what colour ?", key: "red"}
    root = _write_layout(tmp_path / "f", layout, [row])
    _png(root / "a.png")
    with pytest.raises(UnicacheError, match=rf"key '{key}' is not a field; did you mean '{near}'\?"):
        S.load(root)
    root = _write_layout(tmp_path / "g", layout, [{"file_name": "a.png", "question": "q", "qid": 7, "license": "cc"}])
    _png(root / "a.png")
    assert [s.question for s in S.load(root)] == ["q"]  # the fix: your own columns pass


def test_a_manifest_entry_with_image_and_file_name_is_refused(tmp_path):
    """Round 11: a manifest entry holding both used 'image' without a word."""
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "manifest.json").write_text(json.dumps({"seed": S.SEED, "samples": [
        {"image": "a.png", "file_name": "b.png", "question": "q"}]}))
    _png(tmp_path / "f" / "a.png")
    with pytest.raises(UnicacheError, match="both 'image' and 'file_name'.*remove 'file_name'"):
        S.load(tmp_path / "f")


@pytest.mark.parametrize("kind", ["animated GIF", "multi-page TIFF", "LAB TIFF"])
def test_a_picture_that_is_not_one_rgb_frame_is_refused(tmp_path, kind):
    """Round 11's poor 5 and 6: animations and page stacks were read as their first frame, a LAB image converted
    inexactly (pure red read as 86.7, not 85), without a word."""
    name = "a.gif" if "GIF" in kind else "a.tif"
    root = _write_layout(tmp_path / "f", "metadata", [{"file_name": name, "question": "q"}])
    frames = [Image.new("RGB", (8, 8), c) for c in ("red", "blue")]
    if kind == "LAB TIFF":
        Image.new("LAB", (8, 8), (54, 208, 195)).save(root / name)
    else:
        frames[0].save(root / name, save_all=True, append_images=frames[1:])
    with pytest.raises(UnicacheError, match=r"holds 2 frames|is in mode LAB") as e:
        S.load(root)
    assert "save the picture you mean as an 8-bit RGB PNG" in str(e.value)


@pytest.mark.parametrize("layout", ["metadata", "llava"])
def test_one_picture_with_two_questions_gives_both_its_masks(tmp_path, layout):
    """Round 5's NSB1 (round 12 again): one image asked two questions, masks.npz keyed by its file_name: only the first
    sample got the masks, the second none, without a word (the LLaVA refusal's own advice, one entry per turn,
    leads there)."""
    rows = [{"file_name": "a.png", "question": "what colour ?", "id": "a-1"},
            {"file_name": "a.png", "question": "what shape ?", "id": "a-2"}]
    root = _write_layout(tmp_path / "f", layout, rows)
    _png(root / "a.png")
    np.savez(root / "masks.npz", **{"a.png": np.ones((2, 16, 16), bool)})
    got = S.load(root)
    assert [s.id for s in got] == ["a-1", "a-2"] and all(s.masks is not None and s.masks.shape == (2, 16, 16)
                                                          for s in got)


@pytest.mark.parametrize("second", [[{"colour": "blue", "shape": "cube"}, {"colour": "red", "shape": "circle"}],
                                    [{"colour": "green", "shape": "cube"}]])
def test_two_questions_about_one_picture_must_list_its_objects_alike(tmp_path, second):
    """Round 13's S1: masks shared by one picture's two lines were matched by position only: a second line listing
    the objects in another order (or others) took the first line's masks without a word."""
    first = [{"colour": "red", "shape": "circle"}, {"colour": "blue", "shape": "cube"}]
    rows = [{"file_name": "a.png", "question": "q1", "id": "a-1", "objects": first},
            {"file_name": "a.png", "question": "q2", "id": "a-2", "objects": second}]
    root = _write_layout(tmp_path / "f", "metadata", rows)
    _png(root / "a.png")
    np.savez(root / "masks.npz", **{"a.png": np.ones((len(first), 16, 16), bool)})
    with pytest.raises(UnicacheError, match="list the same objects in the same order") as e:
        S.load(root)
    assert "\n" not in str(e.value)
    rows[1]["objects"] = first  # the fix
    _write_layout(tmp_path / "f", "metadata", rows)
    assert [s.masks.shape[0] for s in S.load(root)] == [2, 2]


@pytest.mark.parametrize("edit", ["a sample added", "a picture replaced"])
def test_a_generated_folder_you_edited_is_yours(tmp_path, edit):
    """Round 13's S5: a folder the generator wrote, then edited (two photos of the user's added to its manifest, or
    single-0.png replaced), was still "a standard set": PER_TYPE=4 dropped the user's samples without a word and
    SAMPLE_SEED=5 measured 30 synthetic samples in place of theirs. A marked folder is the generator's only while
    every file it wrote holds what it wrote."""
    d = tmp_path / "mine"
    S.main(["--out", str(d)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(S.load(d, per_type=4)) == 20 and len(S.load(d, seed=5, per_type=4)) == 20  # as written: a standard set
    if edit == "a sample added":
        m = json.loads((d / "manifest.json").read_text())
        m["samples"] += [{**m["samples"][0], "id": f"myphoto{i}", "image": f"myphoto{i}.png"} for i in range(2)]
        (d / "manifest.json").write_text(json.dumps(m))
        for i in range(2):
            _png(d / f"myphoto{i}.png")
    else:
        _png(d / "single-0.png")
    if edit == "a sample added":  # 6 of type single now: your folder, thinned with a word
        with pytest.warns(UserWarning, match=r"kept 20 of your 22 samples.*PER_TYPE=6"):
            S.load(d, per_type=4)
    with pytest.raises(UnicacheError, match="your own sample folder"):
        S.load(d, seed=5)


def test_a_generated_set_copied_without_its_marker_is_standard_only_while_it_holds_the_recipe(tmp_path):
    """Round 14's SN3: `cp gen/* mine/` drops the generator's marker; the folder was then judged a standard set by its
    file names alone, so a replaced picture was measured as another seed's synthetic one."""
    import shutil

    S.main(["--out", str(tmp_path / "gen")])
    (tmp_path / "mine").mkdir()
    for p in (tmp_path / "gen").iterdir():
        if not p.name.startswith("."):
            shutil.copy(p, tmp_path / "mine" / p.name)
    assert len(S.load(tmp_path / "mine", seed=5, per_type=4)) == 20  # as drawn: still a standard set
    _png(tmp_path / "mine" / "single-0.png")  # a picture of the user's in its place
    with pytest.raises(UnicacheError, match="your own sample folder"):
        S.load(tmp_path / "mine", seed=5)
