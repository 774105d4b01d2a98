"""Hostile and careless input (issue #48): a reader's samples folder, prompts file, store and shard files never make
the workbench read outside their folder, put live markup into HTML, lose or invent data, or go silent.

docs/FAULTS.md's "Hostile input" table lists these cases; tests/test_hostile_input.py::test_faults_table_counts
checks its counts against the cases below."""
import json
import os
import warnings
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest
from PIL import Image

from unicache_lib.core.errors import InputError, UnicacheError, UnknownNameError
from unicache_lib.core.untrusted import html_text, iframe_srcdoc, path_inside, stat_inside
from unicache_lib.params import check_params
from unicache_lib.world.samples import load

from .test_plots import _full
from .conftest import benchmark

SCRIPTS = ['"><img src=x onerror=alert(1)>', "<script>alert(1)</script>", "x' onmouseover='alert(1)"]


def _png(path, arr=None, mode=None):
    arr = np.zeros((16, 16, 3), np.uint8) if arr is None else arr
    Image.fromarray(arr, mode).save(path) if mode else Image.fromarray(arr).save(path)
    return path


def _folder(root, lines, images=("a.png",)):
    root.mkdir(parents=True, exist_ok=True)
    for name in images:
        _png(root / name)
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return root


# ---- 1. paths stay inside their folder -------------------------------------------------------------------------
def _traversal_cases(tmp_path):
    secret = _png(tmp_path / "outside.png", np.full((16, 16, 3), 200, np.uint8))
    cases = {}
    cases["dotdot"] = _folder(tmp_path / "dotdot", [{"file_name": "../outside.png", "question": "q"}])
    cases["absolute"] = _folder(tmp_path / "absolute", [{"file_name": str(secret), "question": "q"}])
    link = _folder(tmp_path / "link", [{"file_name": "l.png", "question": "q"}])
    (link / "l.png").symlink_to(secret)
    cases["symlink"] = link
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "data.json").write_text(json.dumps([{"id": "0", "image": "../outside.png", "conversations": [
        {"from": "human", "value": "<image>\nwhat ?"}, {"from": "gpt", "value": "red"}]}]))
    cases["llava"] = llava
    return cases


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "llava"])
def test_a_samples_folder_never_reads_outside_itself(tmp_path, case):
    folder = _traversal_cases(tmp_path)[case]
    with pytest.raises(UnicacheError, match=r"(line 1|entry 0): (file_name|image) .* points outside .*relative to it"):
        load(folder)
    # and the notebooks' parameter check refuses the folder before any model loads
    with pytest.raises(UnicacheError, match="SAMPLES.*points outside"):
        check_params({"SAMPLES": str(folder)})


def test_paths_from_data_stay_in_their_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ok.png").write_bytes(b"")
    assert path_inside(tmp_path, "sub/ok.png") == (tmp_path / "sub" / "ok.png").resolve()
    for bad in ("../x", "/etc/passwd", "", None, 3, "sub/../../x", "a\x00b"):
        with pytest.raises(InputError):
            stat_inside(tmp_path, bad)
    with pytest.raises(InputError, match="holds '..' .it comes back inside"):  # round 12: not "points outside"
        stat_inside(tmp_path, "sub/../sub/ok.png")


# ---- 2. escaped at every HTML boundary --------------------------------------------------------------------------
class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs = [], {}

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.setdefault(tag, []).append(dict(attrs))


def _tags(markup: str) -> _Tags:
    p = _Tags()
    p.feed(markup)
    return p


@pytest.mark.parametrize("evil", SCRIPTS)
def test_explorer_captions_hold_no_live_markup(evil):
    from unicache_lib.capture.record import CaptureResult
    from unicache_lib.widgets import attention_explorer, step_explorer

    res = CaptureResult.from_records([_full(evil, 0)])
    toks = {evil: [f"t{i}" for i in range(19)] + [evil, "?", ":"]}
    panel = attention_explorer(res, {evil: np.zeros((32, 32, 3), np.uint8)}, toks, questions={evil: evil})
    assert set(_tags(panel.caption.value).tags) <= {"b", "i", "code"}, panel.caption.value
    meta = {"n_image": 16, "n_text": 4, "n_text_real": 4, "prompt": evil}
    rec = _full(evil, 0, n=20, step=0, part="joint", meta=meta)
    panel = step_explorer(CaptureResult.from_records([rec]), {evil: np.zeros((32, 32, 3), np.uint8)},
                          {evil: ["a", evil, "cube", "."]})
    assert set(_tags(panel.caption.value).tags) <= {"b", "i", "code"}, panel.caption.value


def test_embedded_report_frame_gets_the_page_exactly_and_runs_nothing_outside():
    evil = "tiny-mmdit<img src=x onerror=alert(document.domain)>"
    page = f"<!doctype html><html><body><h1>{html_text(evil)}</h1><p title=\"{html_text(evil)}\">x</p></body></html>"
    frame = _tags(iframe_srcdoc(page))
    assert frame.tags == ["iframe"]  # nothing outside the frame
    srcdoc = frame.attrs["iframe"][0]["srcdoc"]
    assert srcdoc == page  # the frame receives the page as written, its own escaping intact
    assert _tags(srcdoc).tags == ["html", "body", "h1", "p"]  # and inside, the model name is text, not an <img>


def test_the_report_escapes_model_names_and_draws_dollar_labels(tmp_path):
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.report import build_report
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store

    evil = "tiny-llava<img src=x onerror=alert(1)>"
    m, p = load_understanding("tiny-llava")
    capture_samples(m, p, load(per_type=1)[:1], Store(tmp_path / "s", meta={"model": evil}), mode="stats", progress=False)
    page = build_report({r"$\frac{$ <script>": tmp_path / "s"}, tmp_path / "out").read_text()
    tags = _tags(page).tags
    assert "script" not in tags and tags.count("img") == page.count("data:image/png") and "onerror=alert" not in page.replace(
        "onerror=alert(1)&gt;", "")


@pytest.mark.parametrize("label", [r"$\frac{$", "price $5 and $6", "<script>x</script>"])
def test_figures_draw_text_from_data_as_typed(label):
    import matplotlib.pyplot as plt

    from unicache_lib import plots

    fig = plots.bars({label: 1.0, "b": 2.0}, title=label)
    fig.canvas.draw()  # a math-text parse error would raise here
    assert label in [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    plt.close(fig)


# ---- 4. sample and prompt files checked field by field ----------------------------------------------------------
BAD_LINES = [
    ({"file_name": "a.png", "question": None}, r"line 1: 'question' must be a non-empty text"),
    ({"file_name": "a.png", "question": "  "}, r"line 1: 'question' must be a non-empty text"),
    ({"file_name": "a.png", "question": "q", "objects": "red circle"}, r"line 1: 'objects' must be a list"),
    ({"file_name": "a.png", "question": "q", "answer": ["red"]}, r"line 1: 'answer' must be a text"),
    ({"file_name": "a.png", "question": "q", "scene_type": "kitchen"}, r"scene_type 'kitchen' is not one of"),
    ({"file_name": "a.png", "question": "q", "id": {"x": 1}}, r"'id' must be a non-empty text"),
]


@pytest.mark.parametrize("line,msg", BAD_LINES)
def test_sample_fields_are_checked(tmp_path, line, msg):
    with pytest.raises(UnicacheError, match=msg):
        load(_folder(tmp_path / "f", [line]))


def test_duplicate_ids_are_refused_naming_both_lines(tmp_path):
    root = tmp_path / "f"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    _png(root / "a" / "x.png")
    _png(root / "b" / "x.png")
    for lines in ([{"file_name": "a/x.png", "question": "q"}, {"file_name": "b/x.png", "question": "q"}],
                  [{"file_name": "a/x.png", "question": "q", "id": "s"}, {"file_name": "b/x.png", "question": "q", "id": "s"}],
                  [{"file_name": "a/x.png", "question": "q"}] * 2):
        (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        with pytest.raises(UnicacheError, match=r"line 2: sample id '(x|s)' is also .*line 1's"):
            load(root)


def test_a_folder_without_scene_types_says_how_many_it_kept(tmp_path):
    """PER_TYPE still thins your folder (notebook 02 caps its full maps with it), but never without a word."""
    names = [f"{i}.png" for i in range(10)]
    root = _folder(tmp_path / "f", [{"file_name": n, "question": "q"} for n in names], names)
    with pytest.warns(UserWarning, match=r"kept the first 4 of your 10 samples without a scene_type.*PER_TYPE=10"):
        assert len(load(root, per_type=4)) == 4
    assert len(load(root, per_type=10)) == len(load(root)) == 10  # the fix it names
    # round 12's N3: a folder whose samples carry a scene_type was thinned to 4 of 7 without a word
    root = _folder(tmp_path / "g", [{"file_name": n, "question": "q", "scene_type": "single"} for n in names[:7]],
                   names[:7])
    with pytest.warns(UserWarning, match=r"kept 4 of your 7 samples, the first 4 of each scene type.*PER_TYPE=7"):
        assert len(load(root, per_type=4)) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load(root, per_type=7)) == 7 and len(load(per_type=2)) == 10  # the shipped set is thinned by design
    # round 13's P2: scene_types=['clutter'] of 2 clutter and 5 single counted the unchosen singles as dropped
    mixed = [{"file_name": n, "question": "q", "scene_type": "clutter" if i < 2 else "single", "id": f"s{i}"}
             for i, n in enumerate(names[:7])]
    root = _folder(tmp_path / "h", mixed, names[:7])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load(root, scene_types=["clutter"], per_type=4)) == 2  # nothing of the chosen type dropped
    with pytest.warns(UserWarning, match=r"kept 4 of your 5 samples of these scene types.*PER_TYPE=5"):
        load(root, scene_types=["single"], per_type=4)
    # round 13's P1: an id left out by PER_TYPE (the 5th single) was "unknown", listed among the known ids
    with pytest.raises(InputError, match=r"sample ids \['s6'\] are in the folder but left out by PER_TYPE=4"):
        load(root, per_type=4, ids=["s6"])
    with pytest.raises(InputError, match=r"\['s0'\] are in the folder but left out by scene_types"):
        load(root, scene_types=["single"], ids=["s0"])
    assert [s.id for s in load(root, per_type=5, ids=["s6"])] == ["s6"]  # the fix it names: a wider PER_TYPE
    with pytest.raises(UnknownNameError, match=r"unknown sample ids \['s9'\]"):
        load(root, ids=["s9"])


def test_images_that_cannot_be_read_exactly_are_refused_or_warned(tmp_path):
    root = _folder(tmp_path / "f", [{"file_name": "a.png", "question": "q"}], ())
    Image.fromarray(np.full((16, 16), 40000, np.uint16)).save(root / "a.png")  # 16-bit greyscale
    with pytest.raises(UnicacheError, match=r"line 1: a.png is a 16-bit image.*8-bit"):
        load(root)
    _png(root / "a.png", np.zeros((16, 16, 4), np.uint8), "RGBA")  # fully transparent
    with pytest.warns(UserWarning, match=r"a.png: 100% of its pixels are fully transparent"):
        load(root)
    Image.MAX_IMAGE_PIXELS, old = 100, Image.MAX_IMAGE_PIXELS
    try:
        _png(root / "a.png", np.zeros((16, 16, 3), np.uint8))
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with pytest.raises(UnicacheError, match=r"line 1: a.png has more pixels than PIL's decompression-bomb limit"):
                load(root)
    finally:
        Image.MAX_IMAGE_PIXELS = old


@pytest.mark.parametrize("content,msg", [
    (b"\x80\x03}q\x00.", r"masks.npz is not a readable .npz.*never loaded"),  # a pickle
    (b"just text\n", r"masks.npz is not a readable .npz"),
    (b"PK\x03\x04cut", r"masks.npz is not a readable .npz"),
])
def test_masks_files_that_are_not_boolean_arrays_are_refused(tmp_path, content, msg):
    root = _folder(tmp_path / "f", [{"file_name": "a.png", "question": "q"}])
    (root / "masks.npz").write_bytes(content)
    with pytest.raises(UnicacheError, match=msg):
        load(root)
    np.savez(root / "masks.npz", **{"a.png": np.array([[["x"] * 16] * 16])})
    with pytest.raises(UnicacheError, match=r"masks.npz\['a.png'\] is <U1 of shape"):
        load(root)


def test_a_latin1_metadata_file_is_refused_naming_the_line(tmp_path):
    root = _folder(tmp_path / "f", [{"file_name": "a.png", "question": "q"}])
    (root / "metadata.jsonl").write_bytes(b'{"file_name": "a.png", "question": "q"}\n'
                                          b'{"file_name": "a.png", "question": "caf\xe9"}\n')
    with pytest.raises(UnicacheError, match=r"metadata.jsonl, line 2: not UTF-8.*iconv"):
        load(root)


def test_llava_entries_that_are_not_objects_are_refused(tmp_path):
    root = tmp_path / "l"
    root.mkdir()
    _png(root / "a.png")
    (root / "data.json").write_text(json.dumps([{"image": "a.png", "conversations": [{"from": "human", "value": "q"}]},
                                                "not an entry"]))
    with pytest.raises(UnicacheError, match=r"entry 1: a LLaVA-style entry is an object"):
        load(root)


# ---- 3. stores never lose or invent data ------------------------------------------------------------------------
def _two_sample_store(path):
    from unicache_lib.store import Store

    from .test_store_faults import rec

    st = Store(path)
    st.write([rec(0, 0)])
    st.write([rec(1, 0)])
    st.close()
    return path / "index-rank00000.jsonl"


def test_a_hand_appended_line_reusing_keys_is_refused_and_repair_deletes_nothing(tmp_path):
    """The lost case: a line reusing sample 0's key but pointing at sample 1's chunk made verify() call sample 0's
    chunk orphaned and repair() delete it; and read(sample="0") returned sample 1's data under sample 0's key."""
    from unicache_lib.core.errors import StoreError
    from unicache_lib.store import Store

    log = _two_sample_store(tmp_path / "s")
    lines = log.read_text().splitlines()
    forged = lines[1].replace('"1|language|0|-1"', '"0|language|0|-1"').replace('"sample":"1"', '"sample":"0"')
    log.write_text("\n".join(lines + [forged]) + "\n")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "s").rglob("*") if p.is_file())
    st = Store(tmp_path / "s")
    with pytest.raises(StoreError, match=r"line 3 of index-rank00000.jsonl lists record 0\|language\|0\|-1 while line 1"):
        st.read(sample="0")
    problems = st.verify()
    assert len(problems) == 1 and "line 3 of index-rank00000.jsonl" in problems[0] and "orphan" not in problems[0]
    with pytest.raises(StoreError, match="deletes nothing"):
        st.repair()
    after = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert after == before  # nothing deleted
    log.write_text("\n".join(lines) + "\n")  # the advice, followed: the forged line deleted
    from .test_store_faults import check_intact

    assert check_intact(Store(tmp_path / "s")) == {"0", "1"} and Store(tmp_path / "s").verify() == []


def test_one_entry_twice_in_a_line_is_refused_not_counted_twice(tmp_path):
    from unicache_lib.core.errors import StoreError
    from unicache_lib.store import Store

    log = _two_sample_store(tmp_path / "s")
    lines = log.read_text().splitlines()
    head, recs = json.loads(lines[0])
    head["keys"] *= 2
    lines[0] = json.dumps([head, recs * 2])
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(StoreError, match="lists record 0\\|language\\|0\\|-1 twice in that line"):
        Store(tmp_path / "s").index()
    assert "twice in that line" in Store(tmp_path / "s").verify()[0]


def test_a_chunk_a_line_names_is_never_an_orphan(tmp_path):
    """Dropped records keep their files (drop's promise): repair removes interrupted writes only."""
    from unicache_lib.store import Store

    _two_sample_store(tmp_path / "s")
    st = Store(tmp_path / "s")
    st.drop(["0|language|0|-1"])
    (tmp_path / "s" / "rank00000" / "chunk000099").mkdir()  # a real leftover
    assert [p for p in st.verify() if "orphan" in p] == ["orphaned chunk rank00000/chunk000099 (an interrupted write); "
                                                         "it is ignored, Store.repair() removes it"]
    st.repair()
    assert (tmp_path / "s" / "rank00000" / "chunk000000").is_dir() and not (tmp_path / "s" / "rank00000" / "chunk000099").exists()


def test_a_resume_in_another_dtype_is_refused_when_the_store_records_one(tmp_path):
    import torch

    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.core.errors import StoreError
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store

    m, p = load_understanding("tiny-llava")
    ss = load(per_type=1)[:2]
    capture_samples(m, p, ss[:1], Store(tmp_path / "s", meta={"model": "tiny-llava"}), mode="stats", progress=False)
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["dtype"] == "torch.float32"  # recorded unasked
    with pytest.raises(StoreError, match="holds dtype='torch.float32', this capture is dtype='torch.bfloat16'"):
        capture_samples(m.to(torch.bfloat16), p, ss, Store(tmp_path / "s", meta={"model": "tiny-llava"}), mode="stats",
                        progress=False)
    # round 13's S2: a store made as Store(p), its meta naming no model, took another model's resume and captured
    # nothing (the samples' ids were stored): the model's config is recorded unasked too
    capture_samples(m.float(), p, ss[:1], Store(tmp_path / "bare"), mode="stats", progress=False)
    with pytest.raises(StoreError, match="holds model_config='LlavaForConditionalGeneration:.*JanusForConditional"):
        capture_samples(*load_understanding("tiny-janus"), ss, Store(tmp_path / "bare"), mode="stats", progress=False)
    assert len(capture_samples(m, p, ss, Store(tmp_path / "bare"), mode="stats", progress=False).records) > 0
    # round 14's SN1: a fine-tune of the same architecture (one weight moved) is another model too
    fine = load_understanding("tiny-llava")[0]
    with torch.no_grad():
        next(fine.parameters()).add_(0.01)
    with pytest.raises(StoreError, match="holds model_config="):
        capture_samples(fine, p, load(per_type=2), Store(tmp_path / "bare"), mode="stats", progress=False)
    # SN2: a store from before captures recorded their model (its meta names none) refuses a resume it cannot check
    meta = json.loads((tmp_path / "bare" / "meta.json").read_text())
    (tmp_path / "bare" / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "model_config"}))
    with pytest.raises(StoreError, match="names no model .*write to a new folder"):
        capture_samples(*load_understanding("tiny-janus"), ss, Store(tmp_path / "bare"), mode="stats", progress=False)


# ---- 5. configs validated on construction -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,err,msg", [
    (dict(num_inference_steps="20"), TypeError, r"pass num_inference_steps=20, not the string '20'"),
    (dict(num_inference_steps=20.0), TypeError, r"num_inference_steps must be a whole number"),
    (dict(num_inference_steps=0), ValueError, r"num_inference_steps must be >= 1"),
    (dict(num_inference_steps=20, head=2.0), ValueError, r"head must be a fraction in \[0, 1\)"),
    (dict(num_inference_steps=20, head=0.6, tail=0.5), ValueError, r"head \+ tail = 1.1 > 1: the two always-computed ends overlap"),
    (dict(num_inference_steps=20, weight=float("nan")), ValueError, r"weight must be a finite number in \[0, 2\]"),
    (dict(num_inference_steps=20, stride=1.5), TypeError, r"stride must be a whole number"),
    (dict(num_inference_steps=20, order=3), ValueError, r"order must be 1 or 2"),
    # round 11: stride 1 computed every step without a word; 100 extrapolated 17 of 20 steps from the first 2
    (dict(num_inference_steps=20, stride=1), ValueError, r"stride=1 computes every step: a schedule with no reuse"),
    (dict(num_inference_steps=20, stride=100), ValueError, r"stride=100 is more than 50"),
])
def test_step_skip_configs_are_checked_on_construction(kwargs, err, msg):
    from unicache_lib.reuse.diffusers_hook import StepSkipConfig

    with pytest.raises(err, match=msg):
        StepSkipConfig(**kwargs)
    StepSkipConfig(20, head=0.95, tail=0.05)  # exactly 1: a schedule that reuses nothing, which 03 may advise
    StepSkipConfig(20, head=0.1, tail=0.05, stride=3, weight=0.5, order=2)  # the tuned values pass
    with pytest.raises(TypeError, match=r"n_steps must be a whole number >= 1; got float 2.5"):
        StepSkipConfig(20).schedule(2.5)  # round 11: a raw TypeError from range()
    from unicache_lib.reuse.policies.step_skip import StepSkip

    pol = StepSkip()
    pol.stride = 1  # round 12: a field set after the policy was made is checked when the schedule is made
    with pytest.raises(ValueError, match="stride=1 computes every step"):
        pol.schedule(20)
    import dataclasses

    cfg = StepSkipConfig(20)  # round 13's S3: a config changed after apply_step_skip ran its old schedule, silently
    with pytest.raises(dataclasses.FrozenInstanceError, match="stride"):
        cfg.stride = 5
    assert dataclasses.replace(cfg, stride=5).stride == 5  # the fix its docstring names


def test_a_hook_runs_only_the_schedule_it_was_applied_with():
    """Round 14's SN6 (hook.config replaced), round 15's SN11 (hook.policy or hook.num_inference_steps changed by hand)
    and poor 7 (apply_step_skip given a dict): each refused, naming remove_step_skip / StepSkipConfig."""
    import dataclasses

    import torch

    from unicache_lib.reuse.diffusers_hook import StepReuseHook, StepSkipConfig, apply_step_skip
    from unicache_lib.reuse.policies.step_skip import StepSkip

    cfg = StepSkipConfig(20)
    hook = StepReuseHook(cfg.policy(), 20)  # round 14's SN6: hook.config = another was shown, never run
    with pytest.raises(ValueError, match=r"keeps the schedule it was applied with: remove_step_skip"):
        hook.config = dataclasses.replace(cfg, stride=5)
    # round 15's SN11: hook.policy.stride = 5, hook.policy = StepSkip(stride=5) or hook.num_inference_steps = 30 ran
    # another schedule while hook.config showed the applied one: refused at the next call
    def fresh():
        h = StepReuseHook(cfg.policy(), 20)
        h._config, h._timestep_at = cfg, 1  # as apply_step_skip and initialize_hook leave it
        return h

    def forward(x, timestep):
        return x

    x = torch.zeros(1, 2)
    assert fresh()(forward, x, timestep=torch.tensor(999.0)) is x  # the applied schedule runs
    for wrong in ({"num_inference_steps": 20}, StepSkip()):  # round 15's poor 7: a raw AttributeError
        with pytest.raises(TypeError, match=r"apply_step_skip takes a StepSkipConfig, e.g. StepSkipConfig\("):
            apply_step_skip(torch.nn.Linear(1, 1), wrong)
    for change in (lambda h: setattr(h.policy, "stride", 5), lambda h: setattr(h, "policy", StepSkip(stride=5)),
                   lambda h: setattr(h, "num_inference_steps", 30)):
        change(h := fresh())
        with pytest.raises(ValueError, match=r"changed after it was applied: a hook keeps the schedule it was applied"):
            h(forward, x, timestep=torch.tensor(999.0))


# ---- 6. the parsers, property-based: any input loads correctly or raises one of the project's errors ------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=8)
_rowish = st.fixed_dictionaries({}, optional={"file_name": st.sampled_from(["a.png", "../a.png", "/a.png", "b.png", 3]),
                                              "question": _json | st.text(max_size=20), "id": _json,
                                              "answer": _json, "objects": _json, "scene_type": _json})


@PROPERTY
@given(lines=st.lists(_rowish | _json, min_size=0, max_size=3), raw=st.binary(max_size=30))
def test_property_metadata_jsonl_loads_or_refuses(tmp_path_factory, lines, raw):
    root = _folder(tmp_path_factory.mktemp("p"), [])
    text = "".join(json.dumps(r) + "\n" for r in lines).encode() + raw
    (root / "metadata.jsonl").write_bytes(text)
    try:
        got = load(root)
    except UnicacheError:
        return
    rows = [json.loads(x) for x in text.decode().split("\n") if x.strip()]  # JSON lines end at "\n" only
    assert [s.question for s in got] == [r["question"] for r in rows]  # loaded exactly as written
    assert [s.id for s in got] == [str(r.get("id", "a")) for r in rows]


@PROPERTY
@given(entries=st.lists(st.fixed_dictionaries({}, optional={
    "image": st.sampled_from(["a.png", "../a.png", "nope.png", 1]), "id": _json,
    "conversations": st.lists(st.fixed_dictionaries({}, optional={"from": st.sampled_from(["human", "gpt", 1]),
                                                                 "value": _json | st.text(max_size=10)}), max_size=2)
    | _json}) | _json, min_size=1, max_size=3))
def test_property_llava_json_loads_or_refuses(tmp_path_factory, entries):
    root = tmp_path_factory.mktemp("l")
    _png(root / "a.png")
    (root / "data.json").write_text(json.dumps([{"image": "a.png", "conversations": [{"from": "human", "value": "q"}]}]
                                               + entries))
    try:
        got = load(root)
    except UnicacheError:
        return
    assert all(isinstance(s.question, str) for s in got) and len(got) == 1 + len(entries)


@PROPERTY
@given(lines=st.lists(st.fixed_dictionaries({}, optional={"prompt": _json | st.text(max_size=10), "id": _json,
                                                          "objects": _json, "long": _json}) | _json, max_size=3),
       raw=st.binary(max_size=20))
def test_property_prompts_jsonl_loads_or_refuses(tmp_path_factory, lines, raw):
    from unicache_lib.world.text import read_prompts

    f = tmp_path_factory.mktemp("pr") / "prompts.jsonl"
    f.write_bytes("".join(json.dumps(r) + "\n" for r in lines).encode() + raw)
    try:
        got = read_prompts(f)
    except UnicacheError:
        return
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    assert [p["short"] for p in got] == [r["prompt"] for r in rows] and len({p["id"] for p in got}) == len(got)


@pytest.fixture(scope="module")
def sound_store(tmp_path_factory):
    return _two_sample_store(tmp_path_factory.mktemp("store") / "s").parent


@PROPERTY
@given(extra=st.binary(max_size=80) | _json.map(lambda j: (json.dumps(j) + "\n").encode()),
       mangle=st.sampled_from(["append", "replace_line_2", "truncate"]))
def test_property_store_logs_read_or_refuse(tmp_path_factory, sound_store, extra, mangle):
    import shutil

    from unicache_lib.store import Store

    from .test_store_faults import rec

    path = tmp_path_factory.mktemp("st") / "s"
    shutil.copytree(sound_store, path)
    log = path / "index-rank00000.jsonl"
    data = log.read_bytes()
    lines = data.split(b"\n")
    if mangle == "append":
        log.write_bytes(data + extra)
    elif mangle == "replace_line_2":
        log.write_bytes(lines[0] + b"\n" + extra)
    else:
        log.write_bytes(data[: len(extra) % max(1, len(data))])
    try:
        got = Store(path).read()
    except UnicacheError:
        return
    for r in got:  # whatever reads is exactly what was written under that key: nothing invented
        want = rec(int(r.sample), r.layer)
        assert all(torch_equal(r.data[k], want.data[k]) for k in want.data)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


@pytest.fixture(scope="module")
def sound_shards(tmp_path_factory):
    import pandas as pd

    from .test_benchmarks import ROOT

    E = benchmark("evaluate")
    out = tmp_path_factory.mktemp("shards")
    rows = pd.DataFrame({"question": [0, 1, 0, 1], "method": ["a", "a", "b", "b"], "kind": "x", "budget": 0.1,
                         "correct": [1, 0, 1, 1], "kl": [0.5224, 0.1, 0.2, 0.3], "agree": 1, "kv_fraction": 0.25})
    meta = {"n": 2, "world": 1, "model": "m", "peers": False, "budgets": [0.1], "rank": 0}
    E.write_shard(out, rows, meta)
    return E, out, rows


@PROPERTY
@given(cut=st.integers(min_value=0, max_value=400), junk=st.binary(max_size=12))
def test_property_shards_merge_exactly_or_refuse(tmp_path_factory, sound_shards, cut, junk):
    import shutil

    E, out, rows = sound_shards
    d = tmp_path_factory.mktemp("sh") / "x"
    shutil.copytree(out, d)
    csv = d / "rows-rank0-of-1.csv"
    data = csv.read_bytes()
    csv.write_bytes(data[:cut] + junk if cut < len(data) else data + junk)
    try:
        got = E.read_shards(d, ("n", "world", "model", "peers", "budgets"), "evaluate")[0]
    except UnicacheError:
        return
    assert got.equals(rows) or got.astype(str).equals(rows.astype(str))  # only the untouched shard merges


FORGED = {  # round 6's D12, D16: a shard edited by hand, its SHA-256 recomputed so the checksum matches
    "correct is 2": ("correct", 2, r"row 1: correct is 2, not 0 or 1"),
    "kv_bytes is NaN": ("kv_bytes", float("nan"), r"row 1: kv_bytes is nan, not a finite count"),
    "kv_fraction is inf": ("kv_fraction", float("inf"), r"row 1: kv_fraction is inf, not a finite fraction"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_forged_shard_value_is_refused_naming_its_row(tmp_path, sound_shards, case):
    from unicache_lib.core.errors import StoreError

    E, _, rows = sound_shards
    col, value, msg = FORGED[case]
    bad = rows.assign(kv_bytes=100)
    bad.loc[0, col] = value
    E.write_shard(tmp_path, bad, {"n": 2, "world": 1, "model": "m", "peers": False, "budgets": [0.1], "rank": 0})
    with pytest.raises(StoreError, match=msg):
        E.read_shards(tmp_path, ("n", "world", "model", "peers", "budgets"), "evaluate")


@pytest.mark.parametrize("which", ["csv", "json"])
def test_a_shard_that_is_a_symlink_is_refused(tmp_path, sound_shards, which):
    """Round 6's D19: a shard's .json linked to a file outside --out was followed and read."""
    import shutil

    from unicache_lib.core.errors import StoreError

    E, out, rows = sound_shards
    d, elsewhere = tmp_path / "x", tmp_path / "elsewhere"
    shutil.copytree(out, d)
    elsewhere.mkdir()
    name = f"rows-rank0-of-1.{which}"
    shutil.move(d / name, elsewhere / name)
    (d / name).symlink_to(elsewhere / name)
    with pytest.raises(StoreError, match=rf"shard .*{name} is a symbolic link"):
        E.read_shards(d, ("n", "world", "model", "peers", "budgets"), "evaluate")


def test_a_copied_shard_settings_file_is_named_not_called_a_missing_shard(tmp_path, sound_shards):
    """Round 13's M2: `rows-rank0-of-1 (copy).json` beside its original was refused as "ranks [0, 0] of 1 ... a shard
    is missing"; a file renamed to another rank's name was read as that rank."""
    import shutil

    from unicache_lib.core.errors import StoreError

    E, out, rows = sound_shards
    d = tmp_path / "x"
    shutil.copytree(out, d)
    shutil.copy(d / "rows-rank0-of-1.json", d / "rows-rank0-of-1 (copy).json")
    with pytest.raises(StoreError, match=r"rows-rank0-of-1 \(copy\).json in .* is not a shard's name.*move it out"):
        E.read_shards(d, ("n", "world", "model", "peers", "budgets"), "evaluate")
    (d / "rows-rank0-of-1 (copy).json").rename(d / "rows-rank1-of-1.json")
    with pytest.raises(StoreError, match=r"say rank 0, its name rank 1"):
        E.read_shards(d, ("n", "world", "model", "peers", "budgets"), "evaluate")
    (d / "rows-rank1-of-1.json").unlink()  # the fix: the copy moved out
    assert E.read_shards(d, ("n", "world", "model", "peers", "budgets"), "evaluate")[0].equals(rows)


def test_a_hand_typed_entry_of_the_wrong_type_is_refused_by_read_and_verify(tmp_path):
    from unicache_lib.core.errors import StoreError
    from unicache_lib.store import Store

    log = _two_sample_store(tmp_path / "s")
    log.write_text(log.read_text().replace('"layer":0', '"layer":"0"', 1))
    for call in (lambda st: st.read(sample="0"), lambda st: st.verify()):
        with pytest.raises(StoreError, match=r"line 1 of index .* the entry of record 0\|language\|0\|-1 has fields of "
                                             r"the wrong type"):
            call(Store(tmp_path / "s"))


def test_remove_store_on_a_symlink_names_the_link(tmp_path):
    from unicache_lib.core.errors import StoreError
    from unicache_lib.store import remove_store

    _two_sample_store(tmp_path / "s")
    (tmp_path / "link").symlink_to(tmp_path / "s")
    with pytest.raises(StoreError, match=r"link is a symbolic link .*not removed. Remove the link with os.unlink"):
        remove_store(tmp_path / "link")
    assert (tmp_path / "s" / "index-rank00000.jsonl").exists()


def test_a_symlink_loop_is_refused_not_a_crash(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(InputError, match="symbolic link loop"):
        stat_inside(tmp_path, "a")


@pytest.mark.parametrize("env,why", [({"RANK": "abc"}, "RANK='abc' is not a whole number"),
                                     ({"WORLD_SIZE": "0"}, "WORLD_SIZE is at least 1"),
                                     ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 with WORLD_SIZE=2"),
                                     ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not a whole number")], ids=str)
def test_the_decisive_runs_refuse_a_launcher_setting_in_one_line(sound_shards, monkeypatch, capsys, env, why):
    """Rounds 5-6: `RANK=abc` or `WORLD_SIZE=0` ended evaluate / depth_budgets / evaluate_reuse in a raw ValueError or a
    ZeroDivisionError deep in the run; `--questions 0` in a traceback. Now one usage line before anything loads."""
    import argparse

    E = sound_shards[0]
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        E.launch_rank(argparse.ArgumentParser(prog="evaluate.py"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and why in err and "unset" in err and err.strip().count("\n") == 1, err  # usage + error
    for name in env:  # the fix it names: unset, one process
        monkeypatch.delenv(name)
    assert E.launch_rank(argparse.ArgumentParser()) == (0, 1)
    with pytest.raises(argparse.ArgumentTypeError, match="not a count"):
        E.count("0")


def _eviction_shards(E, folder):
    """A complete one-rank run of evaluate.py's shard format: every method at two budgets, two questions."""
    import pandas as pd

    methods = ["full", "oracle", "random", "divprune", "downsample", "key_coverage", "key_coverage_prefill",
               "key_coverage_merge", "key_coverage_features", "h2o", "snapkv"]
    rows = [dict(question=q, method=m, kind="x", budget=1.0 if m == "full" else b, correct=q % 2, kl=0.1, agree=1,
                 kv_fraction=b, kv_bytes=100.0, prefill_ms=1.0) for m in methods for b in (0.1, 0.25) for q in range(2)]
    R = pd.DataFrame(rows)[E.KEEP].drop_duplicates(["method", "budget", "question"])
    E.write_shard(folder, R, {"n": 2, "world": 1, "model": "tiny-llava", "peers": False, "budgets": [0.1, 0.25],
                              "rank": 0, "n_image": 64, "seconds": 1.0})
    return folder


@pytest.mark.parametrize("case", ["your table in --out's results", "your table in --results", "--results ''",
                                  "--results docs"])
def test_the_eviction_merge_writes_only_where_it_may(tmp_path, sound_shards, monkeypatch, capsys, case):
    """Round 7's EV3b/EV3c (lost) and EV4/EV5 (silent): `evaluate.py --merge` replaced a user's own CSV, wrote into the
    current folder for `--results ''` and into the repository's docs/. Now one usage line before anything is written;
    a re-run into its own folder still works."""
    from tests.test_benchmarks import ROOT

    E = sound_shards[0]
    out = _eviction_shards(E, tmp_path / "run")
    mine = {"your table in --out's results": out / "results" / "evaluate_eviction.csv",
            "your table in --results": tmp_path / "mine" / "evaluate_shares.csv"}.get(case)
    if mine is not None:
        mine.parent.mkdir()
        mine.write_text("MY OWN TABLE\n")
    results = {"your table in --results": ["--results", str(tmp_path / "mine")], "--results ''": ["--results", ""],
               "--results docs": ["--results", str(ROOT / "docs")]}.get(case, [])
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(ROOT / "docs"))
    with pytest.raises(SystemExit) as e:
        E.main(["--merge", "--out", str(out), *results])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: --" in err.strip().splitlines()[-1], err  # argparse's usage, one error line
    assert sorted(os.listdir(ROOT / "docs")) == before and not list(tmp_path.glob("evaluate_*.csv"))
    if mine is not None:
        assert mine.read_text() == "MY OWN TABLE\n" and "is there already and is not a file" in err
    ours = _eviction_shards(E, tmp_path / "ours")  # the fix: a folder of its own, merged twice
    for _ in range(2):
        assert E.main(["--merge", "--out", str(ours)]) == 0
    assert (ours / "results" / "evaluate_eviction.csv").exists()


@pytest.mark.parametrize("case", ["evaluate: your shard", "evaluate: --out docs", "reuse --timing: your timing.json",
                                  "reuse --timing: --out docs", "reuse: your shard"])
def test_the_decisive_runs_write_shards_and_timing_only_where_they_may(tmp_path, sound_shards, monkeypatch, capsys,
                                                                        case):
    """Round 8's EV8a/b, EVR8a/b: `evaluate.py --out mine` replaced your mine/rows-rank0-of-1.csv, `evaluate_reuse.py
    --timing --out mine` your timing.json, and both wrote into the repository's docs/. One usage line now, before any
    model loads."""
    from tests.test_benchmarks import ROOT

    ER = benchmark("evaluate_reuse")
    E = sound_shards[0]
    tool, mode = case.split(":")
    mine = tmp_path / "mine"
    mine.mkdir()
    name = "timing.json" if "timing" in case else "rows-rank0-of-1.csv"
    (mine / name).write_text("MINE\n")
    out = str(ROOT / "docs") if "docs" in case else str(mine)
    argv = {"evaluate": ["--questions", "1", "--out", out], "reuse --timing": ["--timing", "--out", out],
            "reuse": ["--prompts", "8", "--out", out]}[tool]
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    before = sorted(os.listdir(ROOT / "docs"))
    with pytest.raises(SystemExit) as e:
        (E if tool == "evaluate" else ER).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: --out" in err.strip().splitlines()[-1], err
    assert (mine / name).read_text() == "MINE\n" and sorted(os.listdir(ROOT / "docs")) == before
