"""``unicache-report`` on faulty inputs (one-line error, exit status 2, nothing written), on a maps store
(full mode: statistics from the maps, equal to a stats capture) and on stores whose folders share a name.

The CLI runs as a subprocess (``python -m unicache_lib.diagnostics.report``) from the repository root, so
the tests exercise this checkout's code, the exit status and stderr exactly as a shell sees them.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_report(*args):
    """Run the CLI; returns the finished process (text stdout / stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "unicache_lib.diagnostics.report", *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def snapshot(d: Path) -> dict:
    """``relative path -> bytes`` of every file under ``d`` (empty when ``d`` does not exist)."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same two samples captured by the shipped tiny-llava in stats mode (``runs/a/store``) and in
    full mode (``runs/b/store``): two stores whose folders share the name ``store``."""
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store
    from unicache_lib.world import samples as sample_set

    root = tmp_path_factory.mktemp("report")
    m, p = load_understanding("tiny-llava")
    ss = sample_set.load(per_type=1)[:2]
    a, b = root / "runs" / "a" / "store", root / "runs" / "b" / "store"
    capture_samples(m, p, ss, Store(a, meta={"model": "tiny-llava"}), mode="stats", progress=False)
    capture_samples(m, p, ss, Store(b, meta={"model": "tiny-llava"}), mode="full", progress=False)
    return a, b


def _strided_maps_store(path):
    """A full-mode store whose one map was thinned (query_stride 2): its statistics are not the layer's."""
    from unicache_lib.capture.record import Record
    from unicache_lib.store import Store

    P = torch.full((2, 2, 4), 0.25)
    Store(path, meta={"model": "x"}).write([Record("s", 0, "language", "full", {"probs": P, "visible": torch.ones(2, 4, dtype=torch.bool)},
                                                   query_stride=2)])


def _make_fault(kind, tmp, good):
    """Build the faulty input ``kind`` under ``tmp``; returns the CLI's store arguments."""
    import shutil

    if kind == "missing":
        return [tmp / "nowhere"]
    if kind == "empty_dir":
        (tmp / "empty").mkdir()
        return [tmp / "empty"]
    if kind == "regular_file":
        (tmp / "file").write_text("not a store")
        return [tmp / "file"]
    if kind == "not_a_store":
        (tmp / "other").mkdir()
        (tmp / "other" / "notes.txt").write_text("hello")
        return [tmp / "other"]
    if kind == "no_records":  # meta.json written, nothing committed
        (tmp / "meta_only").mkdir()
        (tmp / "meta_only" / "meta.json").write_text('{"format": 1, "model": "x"}')
        return [tmp / "meta_only"]
    if kind == "damaged_index":  # StoreError from Store.index()
        shutil.copytree(good, tmp / "damaged")
        with open(tmp / "damaged" / "index-rank00000.jsonl", "a") as f:
            f.write('[{"keys": [\n')
        return [tmp / "damaged"]
    if kind == "corrupt_chunk":  # StoreError from Store.read(): checksum mismatch
        shutil.copytree(good, tmp / "corrupt")
        f = sorted((tmp / "corrupt").rglob("*.npz"))[0]
        f.write_bytes(f.read_bytes() + b"xx")
        return [tmp / "corrupt"]
    if kind == "strided_maps":
        _strided_maps_store(tmp / "strided")
        return [tmp / "strided"]
    if kind == "good_then_missing":  # the good store must not get its figures written
        return [good, tmp / "nowhere"]
    if kind in ("nan_statistics", "inf_statistics"):  # round 7's RP7i: drawn as an empty curve, legend "n=1", exit 0
        import dataclasses

        from unicache_lib.store import Store

        bad = float("nan") if kind == "nan_statistics" else float("inf")
        recs = [dataclasses.replace(r, data={k: v.float().fill_(bad) if k == "norm_entropy" else v
                                             for k, v in r.data.items()}) for r in Store(good).read()]
        with Store(tmp / kind, meta=Store(good).read_meta()) as st:
            st.write(recs)
        return [tmp / kind]
    if kind == "label_twice":
        return [f"x={good}", f"x={good}"]
    raise ValueError(kind)


FAULTS = ["missing", "empty_dir", "regular_file", "not_a_store", "no_records", "damaged_index", "corrupt_chunk",
          "strided_maps", "good_then_missing", "label_twice", "nan_statistics", "inf_statistics"]


@pytest.mark.parametrize("kind", FAULTS)
def test_report_fault_is_one_line_exit_2_nothing_written(kind, stores, tmp_path):
    args = _make_fault(kind, tmp_path, stores[0])
    out = tmp_path / "out"
    r = run_report(*args, "--out", out)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("unicache-report: error: "), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists()


def test_failed_run_leaves_an_earlier_report_untouched(stores, tmp_path):
    out = tmp_path / "out"
    assert run_report(stores[0], "--out", out).returncode == 0
    before = snapshot(out)
    r = run_report(stores[1], tmp_path / "nowhere", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert snapshot(out) == before  # no new figure, the page unchanged


def test_maps_store_statistics_equal_a_stats_capture(stores):
    from unicache_lib.diagnostics.report import load_store

    (st, _, note_st), (mp, _, note_mp) = load_store(stores[0]), load_store(stores[1])
    assert note_st == "" and "full-mode" in note_mp
    assert {r.mode for r in mp} == {"stats"}
    by_key = {r.key: r for r in st}
    assert len(mp) == len(st) == len(by_key) and set(by_key) == {r.key for r in mp}
    for r in mp:
        ref = by_key[r.key].data
        assert set(r.data) == set(ref), r.key
        for k, v in ref.items():
            assert torch.allclose(r.data[k].nan_to_num(), v.nan_to_num(), atol=1e-5), (r.key, k)


def test_same_folder_names_get_their_own_sections_and_files(stores, tmp_path):
    out = tmp_path / "out"
    r = run_report(*stores, "--out", out)
    assert r.returncode == 0, r.stderr
    page = (out / "report.html").read_text()
    assert "<h2>a/store <small>" in page and "<h2>b/store <small>" in page
    assert page.count("<img") == 8  # four figures each: none dropped
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 8 and sum(n.startswith("a_store_") for n in pngs) == 4 and sum(n.startswith("b_store_") for n in pngs) == 4
    # the maps store reports the same neglect verdict as the stats capture of the same samples
    verdicts = [line for line in page.split("<p>") if line.startswith("neglect detector")]
    assert len(verdicts) == 2 and verdicts[0] == verdicts[1]
    assert "statistics computed from the attention maps" in page
    # round 14: a 300-character label was a raw "File name too long"; its files take the first 80 characters
    from unicache_lib.diagnostics.report import build_report

    long = "x" * 300
    page = build_report({long: stores[0], long + "y": stores[1]}, tmp_path / "long").read_text()
    pngs = sorted(p.name for p in (tmp_path / "long").glob("*.png"))
    assert len(pngs) == 8 and all(len(n) < 120 for n in pngs) and f"<h2>{long} <small>" in page


def test_cli_labels():
    from unicache_lib.diagnostics.report import ReportError, cli_stores

    assert list(cli_stores(["runs/a/store", "runs/b/store", "x/other"])) == ["a/store", "b/store", "other"]
    assert list(cli_stores(["p/a/s", "q/a/s"])) == ["p/a/s", "q/a/s"]
    assert cli_stores(["lbl=some/path"]) == {"lbl": "some/path"}
    with pytest.raises(ReportError, match="given twice"):
        cli_stores(["runs/a/store", "runs/a/../a/store"])
    with pytest.raises(ReportError, match="names two stores"):
        cli_stores(["store=x", "runs/store"])


def test_a_store_after_repair_names_the_recapture_and_the_recapture_fixes_it(tmp_path):
    """A record dropped by repair(): one line, exit 2, nothing written; running the same capture again (the fix the
    message names) recaptures it and the report builds."""
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store
    from unicache_lib.world import samples as sample_set

    m, p = load_understanding("tiny-llava")
    ss, path = sample_set.load(per_type=1)[:2], tmp_path / "store"
    capture_samples(m, p, ss, Store(path, meta={"model": "tiny-llava"}), mode="stats", progress=False)
    f = path / Store(path).index()[0]["file"]
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    assert Store(path).repair()
    out = tmp_path / "out"
    r = run_report(path, "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "run the same capture on this store again" in r.stderr
    assert not out.exists()
    capture_samples(m, p, ss, Store(path, meta={"model": "tiny-llava"}), mode="stats", progress=False)
    assert run_report(path, "--out", out).returncode == 0


@pytest.mark.parametrize("where", ["disk full", "under a file"])
def test_an_unwritable_output_is_one_line_and_leaves_nothing(stores, tmp_path, monkeypatch, where):
    from unicache_lib.diagnostics import report

    if where == "under a file":  # the CLI: exit 2, one line
        (tmp_path / "afile").write_text("")
        r = run_report(stores[0], "--out", tmp_path / "afile" / "out")
        assert r.returncode == 2 and r.stderr.startswith("unicache-report: error: cannot write the report")
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        return
    calls = []
    real = report._atomic_write_bytes

    def fill_up(path, data):  # the disk fills after two files
        calls.append(path)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        real(path, data)
    monkeypatch.setattr(report, "_atomic_write_bytes", fill_up)
    out = tmp_path / "out"
    with pytest.raises(report.ReportError, match="cannot write the report .*No space left on device.*another --out"):
        report.build_report({"a": stores[0]}, out)
    assert not out.exists()  # the two files it did write are gone, and the folder it made


def test_report_embeds_the_explorer_kernel_free_escaped_and_within_its_budget(stores, tmp_path):
    """#64: an explorer passed to build_report is embedded as its HTML form (module and data inline): its sliders work
    in the page without a kernel; no external URL (nothing fetched); hostile labels, tokens and questions escaped;
    over the budget or not an explorer: a one-line ReportError and nothing written."""
    import re

    from tests.test_explorer import EVIL, lesson_02
    from unicache_lib.core.errors import ReportError
    from unicache_lib.diagnostics.report import build_report
    from unicache_lib.explorer import BUDGET_BYTES, attention_explorer, module_source

    ex = attention_explorer(*lesson_02(n_samples=2, layers=2, heads=2, evil=True))
    page = build_report({"a": stores[0]}, tmp_path / "r", explorers={EVIL: ex})
    html = page.read_text()
    assert module_source().strip()[:400] in html and html.count('<script type="module">') == 1
    assert 'class="ucx"' in html and 'class="ucx-data"' in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and EVIL not in html  # the heading, the data, the fallback
    assert not re.search(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}", html), "an external URL in the report"
    assert len(ex.html().encode()) <= BUDGET_BYTES
    assert build_report({"a": stores[0]}, tmp_path / "s", explorers={"x": ex.static()}).read_text().count('class="ucx"') == 1
    for bad, match in ((object(), "not an explorer"), (ex.data, None)):
        out = tmp_path / f"bad{id(bad)}"
        if match is None:  # ExplorerData is accepted: it is the explorer's data with its HTML form
            assert 'class="ucx"' in build_report({"a": stores[0]}, out, explorers={"x": bad}).read_text()
            continue
        with pytest.raises(ReportError, match=match):
            build_report({"a": stores[0]}, out, explorers={"x": bad})
        assert not out.exists()


def test_report_refuses_an_explorer_over_the_budget(stores, tmp_path, monkeypatch):
    from unicache_lib.core.errors import ReportError
    from unicache_lib.diagnostics import report as R
    from unicache_lib.explorer import attention_explorer
    from tests.test_explorer import lesson_02

    ex = attention_explorer(*lesson_02(n_samples=1, layers=2, heads=2))
    monkeypatch.setattr(R, "BUDGET_BYTES", len(ex.html().encode()) - 1)
    with pytest.raises(ReportError, match="over the explorer's budget.*samples=") as e:
        R.build_report({"a": stores[0]}, tmp_path / "r", explorers={"x": ex})
    assert "\n" not in str(e.value) and not (tmp_path / "r").exists()


def test_figures_of_two_stores_never_share_a_file_and_cross_layers_are_named(stores, tmp_path):
    """Round 12's N7: store m of a cross-attention model draws m_cross_*.png, and a store labelled m_cross drew over
    them in --out without a word (the page's copies were right). N1: the neglect verdict numbered the captured layers
    0, 1, 2 (tiny-mllama's cross layers are 1, 3, 5) and called cross-attention "healthy" (a share of 1 by
    construction). Every picture in the page is now the file its name gives."""
    import base64
    import re

    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.report import build_report
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store
    from unicache_lib.world import samples as sample_set

    ss = sample_set.load(per_type=1)[:2]
    mllama, sub = tmp_path / "mllama", tmp_path / "sub"
    capture_samples(*load_understanding("tiny-mllama"), ss, Store(mllama, meta={"model": "tiny-mllama"}), mode="stats",
                    progress=False)
    capture_samples(*load_understanding("tiny-llava"), ss, Store(sub, meta={"model": "tiny-llava"}), mode="stats",
                    layers=[1, 3], progress=False)
    page = build_report({"m": mllama, "m_cross": stores[0], "sub": sub}, tmp_path / "out").read_text()
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) == len({a for a, _ in imgs}) == len(list((tmp_path / "out").glob("*.png")))
    for alt, data in imgs:
        assert (tmp_path / "out" / f"{alt}.png").read_bytes() == base64.b64decode(data), alt
    assert "<p>cross: neglect detector: not measurable here: in cross-attention layers" in page
    verdicts = re.findall(r"<p>neglect detector: ([^<]+)</p>", page)  # m_cross's (every layer), then sub's
    assert len(verdicts) == 2 and re.findall(r"\bL(\d+) ", verdicts[1]) == ["1", "3"], verdicts


def test_a_generator_store_missing_records_is_refused_naming_the_recapture(tmp_path):
    """Round 12's N10: a generator store missing some layers and steps of one prompt was drawn as complete ("2
    prompts x 4 layers x 6 steps"), one step's "mean over layers" over layer 0 alone."""
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.store import Store

    path = tmp_path / "gen"
    capture_generation(load_generator("tiny-mmdit"), ["a red cube", "a blue ball"], "r", Store(path), steps=3,
                       progress=False)
    st = Store(path)
    keys = [k.split("|") for k in st.keys()]  # sample|part|layer|step
    assert st.drop(["|".join(k) for k in keys if k[0] == "r/1" and int(k[2]) > 0 and k[3] == "2"])
    r = run_report(path, "--out", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "step 2" in r.stderr, r.stderr
    assert "run the same capture on this store again" in r.stderr and not (tmp_path / "out").exists()
