"""The one attention explorer (unicache_lib/explorer, issue #64): its payload within the budget (refused before any
map is quantised when over it), the quantised views equal to the exact maps, hostile text escaped, `save()` through
the output checks, the former `widgets` functions as wrappers over it, and the explorer in
headless Chromium: its HTML form on a page of its own and in an nbconvert export of a notebook that displays the
widget: every slider changes the canvas, a redraw takes at most 50 ms (performance.now in the page), the PNG and
JSON exports download, no console error, no dialog, no request leaves the page.

The lesson-like inputs are made here: 02's explorer (20 samples x 4 layers x 8 heads, 64 image tokens in a
75-token causal sequence) and 03's (2 prompts x 20 steps x 4 layers x 4 heads, a joint map of 64 image and 48 text
tokens)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import random_probs
from unicache_lib.capture.record import CaptureResult, Record
from unicache_lib.core.errors import InputError
from unicache_lib.core.modality import Spans

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<img src=x onerror=alert(1)>"
MAX_REDRAW_MS = 50.0


# ------------------------------------------------------------------------------------------------ inputs


def _scene(rng, side=224):
    """A picture like the lessons' scenes: flat background, a few flat shapes."""
    img = np.full((side, side, 3), rng.integers(180, 240, 3), np.uint8)
    for _ in range(3):
        y, x = rng.integers(0, side * 3 // 4, 2).tolist()
        h, w = rng.integers(side // 10 + 1, side // 4 + 2, 2).tolist()
        img[y:y + h, x:x + w] = rng.integers(0, 255, 3)
    return img


def lesson_02(n_samples=20, layers=4, heads=8, n_img=64, seed=0, evil=False):
    """02's explorer input: ``(result, images, tokens, grids, questions)``; causal maps over
    ``<s> user : [64 image tokens] what color is the triangle ? assistant :``."""
    rng = np.random.default_rng(seed)
    pre = ["<s>", "user", ":"]
    post = ["what", "color", "is", "the", EVIL if evil else "triangle", "?", "assistant", ":"]
    S = len(pre) + n_img + len(post)
    spans = Spans.from_kinds([0] * len(pre) + [1] * n_img + [0] * len(post))
    ids = [EVIL if (evil and i == 0) else f"single-{i}" for i in range(n_samples)]
    recs = [Record(s, L, "language", "full", {"probs": random_probs(rng, (heads, S, S))}, spans, seq_len=S, heads=heads)
            for s in ids for L in range(layers)]
    toks = {s: pre + ["<image>"] * n_img + post for s in ids}
    imgs = {s: _scene(rng) for s in ids}
    qs = {s: EVIL if evil else "what color is the triangle ?" for s in ids}
    return CaptureResult.from_records(recs), imgs, toks, None, qs


def lesson_03(n_prompts=2, steps=20, layers=4, heads=4, n_img=64, n_text=48, seed=1, part="joint"):
    """03's explorer input: ``(result, images, tokens)``; bidirectional joint maps ``[image | text]`` (or cross maps
    of image queries over text keys)."""
    rng = np.random.default_rng(seed)
    words = ["<s>", "a", "green", "triangle", "at", "the", "top", "</s>"]
    recs = []
    for j in range(n_prompts):
        meta = {"n_image": n_img, "n_text": n_text, "n_text_real": len(words), "prompt": "a green triangle at the top",
                "text_positions": list(range(len(words)))}  # as a capture records them: real tokens, then padding
        for st in range(steps):
            for L in range(layers):
                shape = (heads, n_img + n_text, n_img + n_text) if part == "joint" else (heads, n_img, n_text)
                P = torch.softmax(torch.from_numpy(rng.normal(0, 2, shape)).float(), -1)
                recs.append(Record(f"maps/{j}", L, part, "full", {"probs": P}, None, step=st, seq_len=shape[-1],
                                   heads=heads, meta=dict(meta)))
    ids = [f"maps/{j}" for j in range(n_prompts)]
    return CaptureResult.from_records(recs), {s: _scene(rng, 32) for s in ids}, {s: list(words) for s in ids}


@pytest.fixture(scope="module")
def l02():
    return lesson_02()


@pytest.fixture(scope="module")
def l03():
    return lesson_03()


@pytest.fixture(scope="module")
def explorers(l02, l03):
    """The lesson-like explorers (02 with hostile labels, 03) and a two-model one, as widgets."""
    from unicache_lib.explorer import attention_explorer, model_explorer, step_explorer

    evil = lesson_02(n_samples=3, evil=True)
    t = time.perf_counter()
    a = attention_explorer(*l02)
    build_s = time.perf_counter() - t
    h = attention_explorer(*evil)
    s = step_explorer(*l03)
    small = lesson_02(n_samples=2, layers=2, heads=2, seed=3)
    m = model_explorer({"LLaVA": small, EVIL: lesson_02(n_samples=1, layers=3, heads=4, n_img=16, seed=4, evil=True)})
    return {"02": a, "evil": h, "03": s, "models": m, "build_s": build_s}


PICTURES = {  # what an explorer's picture was -> what it is drawn as (mean of the PNG), or the refusal
    "uint16 mid-grey": (np.full((32, 32, 3), 32768, np.uint16), 127),
    "channels first": (np.full((3, 32, 32), 200, np.uint8), 200),
    "float NaN": (np.full((32, 32, 3), np.nan, np.float32), "NaN or infinite"),
    "int64 out of range": (np.full((32, 32, 3), 1000, np.int64), "outside 0..255"),
    # round 7's EX6c: a 0..1 float picture with one pixel overshooting to 1.02 was read as 0..255 and drawn black
    "float 0..1 with an overshoot": (np.full((32, 32, 3), 0.8, np.float32)
                                     + np.eye(32, dtype=np.float32)[:, :, None] * 0.22, 205.6),
    "float 0..255": (np.full((32, 32, 3), 200.0, np.float32), 200),
    "float, neither reading": (np.full((32, 32, 3), 1.5, np.float32), "neither 0..1 nor 0..255"),
    "float, normalised": (np.full((32, 32, 3), -1.8, np.float32), "undo the normalisation"),
}


@pytest.mark.parametrize("case", sorted(PICTURES))
def test_a_picture_is_drawn_as_it_is_or_refused_in_one_line(case):
    """S13/S14 (#60 round IV): a uint16 picture (mid-grey 32768) was drawn pure white, a float picture of NaN black;
    a channels-first [3, H, W] one raised a raw PIL TypeError. uint16 is scaled (65535 is white), channels-first
    turned, NaN and values outside 0..255 refused in one line."""
    import io

    from PIL import Image

    from unicache_lib.explorer.payload import encode_image

    image, want = PICTURES[case]
    if isinstance(want, str):
        with pytest.raises(InputError, match=want) as e:
            encode_image(image)
        assert "\n" not in str(e.value)
        return
    data, _, w, h = encode_image(image)
    assert (w, h) == (32, 32) and abs(float(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).mean()) - want) <= 1


@pytest.mark.parametrize("case", ["all NaN", "rows sum to 3", "negative"])
def test_maps_that_are_not_probabilities_are_refused(case):
    """S15/S16: a record whose probs were all NaN built an explorer (values() 100% NaN); maps whose rows sum to 3
    were shown (max 84.7). Now AttentionValueError in one line naming the sample and layer."""
    from unicache_lib.core.errors import AttentionValueError
    from unicache_lib.explorer import attention_explorer

    result, images, tokens, grids, qs = lesson_02(n_samples=1, layers=2, heads=2, n_img=16)
    rec = next(r for r in result if r.sample == "single-0" and r.layer == 1)
    rec.data["probs"] = {"all NaN": torch.full_like(rec.probs, float("nan")), "rows sum to 3": rec.probs * 3,
                         "negative": rec.probs - 0.5}[case]
    with pytest.raises(AttentionValueError, match=r"sample 'single-0', layer 1") as e:
        attention_explorer(result, images, tokens, grids, qs)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ the payload


def _decode(data, sel):
    """The view explorer.js draws, decoded from the blob here as the module decodes it (the layout's own test)."""
    spec, blob = data.spec, np.frombuffer(data.blob, np.uint8)
    sel = data.normal(sel)
    p = spec["models"][sel["model"]]["panels"][sel["sample"]]
    F = int(np.prod([len(a["values"]) for a in p["axes"]]))
    f = data.frame(sel)
    H = p["heads"]
    heads = list(range(H)) if sel["head"] >= H else [sel["head"]]
    view = sel["view"]
    if view in ("t2i", "i2t"):
        e, C = p[view], p["grid"][0] * p["grid"][1]
        if (view == "i2t" and sel["word"] not in p["i2t_words"]) or (view == "t2i" and sel["word"] in p["t2i_blind"]):
            return None  # explorer.js: "no image token can see this word" / "this word cannot see the picture"
        wi = sel["word"] if view == "t2i" else p["i2t_words"].index(sel["word"])
        scales = np.frombuffer(data.blob[e["soff"]:e["soff"] + 4 * F * H * e["words"]], "<f4")
        out = np.zeros(C)
        for h in heads:
            idx = (f * H + h) * e["words"] + wi
            out += blob[e["off"] + idx * C:e["off"] + (idx + 1) * C] * scales[idx] / 255 / len(heads)
        return out.reshape(p["grid"])
    e = p["full"]
    lohi = np.frombuffer(data.blob[e["soff"]:e["soff"] + 8 * F * H], "<f4").reshape(F, H, 2)
    out = np.zeros((e["rows"], e["cols"]))
    for h in heads:
        q = blob[e["off"] + (f * H + h) * e["cells"]:e["off"] + (f * H + h + 1) * e["cells"]].astype(float)
        lo, hi = lohi[f, h]
        v = np.where(q > 0, 10 ** (lo + (q - 1) / 254 * (hi - lo)), 0) / len(heads)
        if e["tri"]:
            il = np.tril_indices(e["rows"])
            m = np.zeros((e["rows"], e["cols"]))
            m[il] = v
            out += m
        else:
            out += v.reshape(e["rows"], e["cols"])
    return out


def test_the_budget_is_stated_and_lesson_like_explorers_fit(explorers):
    from unicache_lib.explorer import BUDGET_BYTES

    assert BUDGET_BYTES == 2_000_000
    sizes = {}
    for name in ("02", "03", "models", "evil"):
        ex = explorers[name]
        html = ex.html()
        assert len(html.encode()) <= BUDGET_BYTES and ex.nbytes == pytest.approx(len(html.encode()), abs=200)
        sizes[name] = len(html.encode())
    a, s = explorers["02"].data.spec, explorers["03"].data.spec
    # 02: 20 samples x 4 layers x 8 heads; the t2i / i2t rows at full size, the whole map block-averaged to fit
    p = a["models"][0]["panels"][0]
    assert len(a["models"][0]["panels"]) == 20 and p["heads"] == 8 and len(p["axes"][0]["values"]) == 4
    assert p["t2i"]["words"] == 11 and p["i2t_words"] == [0, 1, 2]  # the image tokens see only <s> user :
    assert p["t2i_blind"] == [0, 1, 2]  # and <s> user : see no image token
    assert p["full"]["tri"] and p["full"]["k"] >= 1
    q = s["models"][0]["panels"][0]
    assert [len(x["values"]) for x in q["axes"]] == [20, 4] and q["heads"] == 4 and not q["full"]["tri"]
    print(f"\nHTML form: 02-like {sizes['02'] / 1e6:.2f} MB (full map {p['full']['rows']} cells a side, k="
          f"{p['full']['k']}), 03-like {sizes['03'] / 1e6:.2f} MB (full map {q['full']['rows']} a side, k="
          f"{q['full']['k']}); 02 built in {explorers['build_s']:.2f} s")


def test_over_the_budget_is_refused_before_a_map_is_quantised(monkeypatch, l02):
    from unicache_lib.explorer import attention_explorer, payload, step_explorer

    def boom(*a, **k):
        raise AssertionError("quantised although over the budget")

    monkeypatch.setattr(payload, "quantise_rows", boom)
    monkeypatch.setattr(payload, "quantise_log", boom)
    monkeypatch.setattr(payload, "build", boom)
    with pytest.raises(InputError) as e:
        attention_explorer(*l02, budget_bytes=400_000)
    msg = str(e.value)
    assert "\n" not in msg and "over the budget of 0.400 MB" in msg and "samples=[...]" in msg, msg
    with pytest.raises(InputError) as e:
        attention_explorer(*l02, full_side=75)
    msg = str(e.value)
    assert "\n" not in msg and "lower full_side (now 75)" in msg and "fits)" in msg, msg
    with pytest.raises(InputError, match=r"pass fewer steps \(steps=\[\.\.\.\]\)"):
        step_explorer(*lesson_03(n_prompts=1, steps=20, layers=2, heads=2), budget_bytes=100_000)


def test_the_quantised_views_are_the_maps(explorers, l02):
    """Every view, decoded from the blob as explorer.js decodes it, equals the exact numbers within one byte's step."""
    from unicache_lib.explorer import payload

    for name in ("02", "03", "models"):
        data = explorers[name].data
        rng = np.random.default_rng(5)
        for _ in range(25):
            mi = int(rng.integers(len(data.models)))
            panel = data.models[mi][1][int(rng.integers(len(data.models[mi][1])))]
            sel = data.normal({"model": mi, "sample": data.models[mi][1].index(panel),
                               "axes": [int(rng.integers(len(v))) for _, v in panel.axes],
                               "head": int(rng.integers(panel.heads + 1)), "word": int(rng.integers(len(panel.words))),
                               "view": str(rng.choice(payload.panel_views(panel)))})
            got, exact = _decode(data, sel), data.values(sel)
            if exact is None or got is None:
                assert got is None and exact is None and sel["view"] in ("i2t", "t2i")
                continue
            if sel["view"] == "full":
                k = data.spec["models"][mi]["panels"][sel["sample"]]["full"]["k"]
                exact = payload.pool(exact, k)
                rel = np.abs(got - exact) / np.maximum(exact, 1e-12)
                big = exact > 10 ** (np.log10(exact.max()) - 3)  # within 3 decades of the top: 2.7% per byte step
                assert np.all(rel[big] < 0.06), (name, sel)
                assert np.all((got == 0) == (exact == 0)), (name, sel)  # masked stays masked
            else:
                assert got.shape == exact.shape
                heads = range(panel.heads) if sel["head"] == panel.heads else [sel["head"]]
                step = max(float(payload.view_values(panel, sel["view"], data.frame(sel), h, sel["word"]).max())
                           for h in heads) / 255  # one byte's step of the largest head's row
                assert np.abs(got - exact).max() <= step * 0.51 + 1e-6, (name, sel)
    # the units: a word's row over the picture is in multiples of the uniform weight of the keys it can see
    res, imgs, toks, grids, qs = l02
    data = explorers["02"].data
    sel = data.choose(None, layer=1, head=3, word=71, view="t2i")
    rec = next(r for r in res.records if r.sample == "single-0" and r.layer == 1)
    want = rec.probs[3][71, 3:67].numpy() * 72
    assert np.allclose(data.values(sel).ravel(), want, rtol=1e-5)


def test_controls_offer_what_was_captured_and_refuse_the_rest(explorers):
    from unicache_lib.explorer import attention_explorer, step_explorer
    from unicache_lib.widgets import attention_explorer as former

    ex = explorers["02"]
    assert ex.selection == {"model": 0, "sample": 0, "view": "t2i", "axes": [0], "head": 0, "word": 7}
    assert "71 &#x27;triangle&#x27;" in ex.caption.value  # opens on the object word, not the closing ':'
    ex.select(layer=3, head="mean", view="full", sample="single-4")
    assert ex.settings() == {"model": "", "sample": "single-4", "view": "full", "layer": 3, "head": "mean",
                             "word": "71 'triangle'"}
    assert "mean of 8 heads" in ex.caption.value and ex.values().shape == (75, 75)
    for bad, match in (({"layer": 7}, r"layer 7 was not captured \(captured: \[0, 1, 2, 3\]\)"),
                       ({"head": 9}, r"head 9 outside 0\.\.7"), ({"word": 40}, "not a word position"),
                       ({"sample": "s9"}, "no sample 's9'"), ({"zoom": 2}, "cannot choose")):
        with pytest.raises(InputError, match=match):
            ex.select(**bad)
    ex.select(layer=0, head=0, view="t2i", sample="single-0")
    st = explorers["03"]
    assert st.settings()["view"] == "i2t" and st.data.spec["models"][0]["panels"][0]["views"] == ["t2i", "i2t", "full"]
    st.select(step=19, layer=2, word=3)
    assert "joint · step 19 · layer 2 · head 0" in st.caption.value and "a green triangle" in st.caption.value
    # a capture missing a layer for one sample is refused when the explorer is built
    res, imgs, toks, grids, qs = lesson_02(n_samples=2, layers=3, heads=2)
    holey = CaptureResult.from_records([r for r in res.records if not (r.sample == "single-1" and r.layer == 2)])
    with pytest.raises(InputError, match=r"'sample': 'single-1', 'layer': 2.*capture them all alike"):
        former(holey, imgs, toks)
    with pytest.raises(InputError, match="tokens has no entry for sample 'single-1'"):
        attention_explorer(res, imgs, {"single-0": toks["single-0"]})
    res3, im3, tk3 = lesson_03(n_prompts=1, steps=3, layers=2, heads=2)
    with pytest.raises(InputError, match="'step': 2"):
        step_explorer(CaptureResult.from_records(res3.records[:-1]), im3, tk3)
    cross = step_explorer(*lesson_03(n_prompts=1, steps=2, layers=2, heads=2, part="cross"))
    assert cross.data.spec["models"][0]["panels"][0]["views"] == ["i2t", "full"]


def test_text_from_the_data_is_escaped_everywhere(explorers):
    ex = explorers["evil"]
    html = ex.html()
    assert EVIL not in html and "<img" not in html.lower() and "onerror=alert(1)>" not in html
    data = json.loads(re.search(r'<script type="application/json" class="ucx-data">(.*?)</script>', html, re.S).group(1))
    assert data["spec"]["models"][0]["panels"][0]["sample"] == EVIL  # the JSON carries the text as it is
    assert EVIL in data["spec"]["models"][0]["panels"][0]["note"]
    cap = ex.caption.value
    assert EVIL not in cap and "&lt;img src=x onerror=alert(1)&gt;" in cap
    assert set(re.findall(r"<(\w+)", cap)) <= {"b", "i", "code"}
    m = explorers["models"].html()
    assert EVIL not in m and "<img" not in m.lower()
    js = (ROOT / "unicache_lib" / "explorer" / "explorer.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "http://", "https://", "fetch(", "XMLHttpRequest", "import("):
        assert sink not in js, sink  # text only through textContent / fillText; nothing fetched
    assert "</script" not in js.lower()


def test_save_writes_the_exact_view_through_the_output_checks(explorers, tmp_path, monkeypatch):
    ex = explorers["02"]
    ex.select(layer=2, head="mean", view="t2i", word=71)
    npz, js = ex.save(tmp_path / "out" / "view")
    assert (npz.name, js.name) == ("view.npz", "view.json")
    arrays = np.load(npz)
    assert np.array_equal(arrays["map"], ex.values()) and arrays["heads"].shape == (8, 8, 8)
    assert np.allclose(arrays["heads"].mean(0), arrays["map"], atol=1e-5)
    info = json.loads(js.read_text())
    assert info["settings"] == {"model": "", "sample": "single-0", "view": "t2i", "layer": 2, "head": "mean",
                                "word": "71 'triangle'"}
    assert np.allclose(info["map"], arrays["map"], rtol=1e-6) and info["shape"] == [8, 8]
    ex.select(view="i2t")  # a word the image tokens cannot see: said so, an empty map
    _, js2 = ex.save(tmp_path / "out" / "masked.json")
    assert "causal mask" in json.loads(js2.read_text())["note"]
    with pytest.raises(InputError, match="is the repository's own folder docs/"):
        ex.save(ROOT / "docs" / "view")
    (tmp_path / "out" / "link.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(InputError):
        ex.save(tmp_path / "out" / "link")  # the .npz goes in, the .json would be written through a link: refused
    assert not (tmp_path / "elsewhere.json").exists()
    ex.select(view="t2i", layer=0, head=0)


@pytest.mark.parametrize("how", ["trailing separator", "existing folder", "Path of a folder", "bytes"])
def test_save_into_a_folder_writes_inside_it(explorers, tmp_path, how):
    """#60 X7: save('/dir/') wrote /dir.npz and /dir.json beside the folder. A path ending in a separator or naming
    an existing folder means inside it (view.npz, view.json); bytes are refused in one line."""
    ex = explorers["02"]
    d = tmp_path / "views"
    if how != "trailing separator":
        d.mkdir()
    arg = {"trailing separator": str(d) + os.sep, "existing folder": str(d), "Path of a folder": d,
           "bytes": os.fsencode(str(d))}[how]
    if how == "bytes":
        with pytest.raises(InputError, match=r"path must be a text or a Path, got bytes"):
            ex.save(arg)
        assert list(tmp_path.iterdir()) == [d] and not list(d.iterdir())
        return
    npz, js = ex.save(arg)
    assert (npz, js) == (d / "view.npz", d / "view.json") and npz.is_file() and js.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["views"]  # nothing beside the folder


def test_the_widget_bundle_carries_its_html_form_and_the_former_functions_wrap_it(explorers, l02, l03):
    from unicache_lib import widgets
    from unicache_lib.explorer import BUDGET_BYTES
    from unicache_lib.explorer.widget import Explorer

    ex = explorers["02"]
    bundle = ex._repr_mimebundle_()
    assert isinstance(bundle, dict)  # lesson 08 merges it: {**bundle, "text/plain": ...}
    assert set(bundle) == {"text/plain", "application/vnd.jupyter.widget-view+json", "text/html"}
    assert bundle["text/html"].startswith('<div class="ucx" data-ucx="') and len(bundle["text/plain"]) <= 110
    assert ex._data == b"" and ex._spec["models"][0]["panels"][0]["sample"] == "single-0"  # the maps: by message
    sent = []
    ex.send = lambda content, buffers=None: sent.append((content, buffers))
    ex._on_msg(ex, {"type": "ucx-data"}, [])  # a view opened and asks for the maps
    assert sent == [({"type": "ucx-data", "key": ex.data.key}, [ex.data.blob])]
    del ex.send
    small = lesson_02(n_samples=2, layers=3, heads=2, seed=7)
    assert isinstance(widgets.attention_explorer(*small), Explorer)
    assert isinstance(widgets.step_explorer(*lesson_03(n_prompts=1, steps=3, layers=2, heads=2)), Explorer)
    assert isinstance(widgets.model_explorer({"a": small}), Explorer)
    st = widgets.attention_explorer(*small).select(sample="single-1", head=1, word=71).static()  # the HTML form alone
    assert st.stops == ["0", "1", "2"] and "3 stops" in repr(st) and st._repr_html_() == st.html
    assert st.selection == {"model": 0, "sample": 1, "view": "t2i", "axes": [0], "head": 1, "word": 7}
    assert st.nbytes <= BUDGET_BYTES
    s3 = widgets.step_explorer(*lesson_03(n_prompts=1, steps=3, layers=2, heads=2)).select(word=2, layer=1).static()
    assert s3.stops == ["0", "1", "2"] and s3.selection["axes"] == [0, 1] and s3.selection["word"] == 2
    with pytest.raises(InputError, match="layer 7 was not captured"):
        widgets.step_explorer(*lesson_03(n_prompts=1, steps=3, layers=2, heads=2)).select(layer=7)
    with pytest.raises(InputError, match="no sample 's9'"):
        widgets.attention_explorer(*small).select(sample="s9")
    both = widgets.model_explorer({"LLaVA": small, "ViLT <b>": small}, budget_bytes=300_000).static()
    assert both.nbytes <= 300_000 and "ViLT <b>" not in both.html and both.html.count('class="ucx"') == 1


def test_the_module_ships_with_the_package():
    import tomllib
    from importlib.resources import files

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "explorer.js" in " ".join(cfg["tool"]["setuptools"]["package-data"]["unicache_lib.explorer"])
    assert any(d.startswith("anywidget==0.11") for d in cfg["project"]["dependencies"])
    assert (files("unicache_lib.explorer") / "explorer.js").read_text().rstrip().endswith("export default { render };")


# ------------------------------------------------------------------------------------------------ in the browser


def _need_browser():
    from tests.test_browser import _need_browser as need

    return need()


def _page(path: Path, body: str) -> Path:
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'>"
                    "<title>explorers</title></head><body>" + body + "</body></html>")
    return path


# in the page: move one control, time the redraw, count the canvas pixels that changed
_MOVE = """([k, kind, name, value]) => {
  const mount = document.querySelectorAll('.ucx-mount')[k], c = mount.querySelector('canvas');
  const ctx = c.getContext('2d'), before = ctx.getImageData(0, 0, c.width, c.height).data;
  const el = [...mount.querySelectorAll(kind === 'range' ? 'input.ucx-range' : 'select.ucx-select')]
    .find((x) => x.dataset.name === name);
  if (!el) return null;
  const t0 = performance.now();
  el.value = String(value);
  el.dispatchEvent(new Event(kind === 'range' ? 'input' : 'change', {bubbles: true}));
  const ms = performance.now() - t0;
  const after = ctx.getImageData(0, 0, c.width, c.height).data;
  let diff = 0;
  for (let i = 0; i < after.length; i += 4) if (after[i] !== before[i] || after[i + 1] !== before[i + 1] ||
                                             after[i + 2] !== before[i + 2]) diff++;
  const out = el.parentElement.querySelector('output');
  return {ms, diff, readout: out ? out.textContent : el.selectedOptions[0].textContent,
          caption: mount.querySelector('.ucx-caption').textContent, max: +el.max || el.options.length - 1};
}"""

_READY = """() => [...document.querySelectorAll('.ucx-mount')].every((m) => m.ucxExplorer &&
  [...m.ucxExplorer.images.values()].every((v) => v !== 'pending') && m.ucxExplorer.images.size > 0)"""


def _watch(page):
    seen = {"console": [], "requests": [], "dialogs": []}
    page.on("console", lambda m: seen["console"].append(m.text) if m.type == "error" or (
        m.type == "warning" and "willReadFrequently" not in m.text) else None)  # (that hint: this test's readbacks)
    page.on("pageerror", lambda e: seen["console"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
    return seen


def _exercise(page, k: int, controls: list, times: list) -> None:
    """Every control of explorer ``k`` in turn: one step, and the canvas must change; the redraw times into ``times``."""
    for kind, name in controls:
        r = page.evaluate(_MOVE, [k, kind, name, 1])
        assert r is not None, (k, name)
        to = 1
        if r["diff"] == 0:  # this stop may look like the last one: try the far end
            to = r["max"]
            r = page.evaluate(_MOVE, [k, kind, name, to])
        assert r["diff"] > 0, (k, name, r)
        back = page.evaluate(_MOVE, [k, kind, name, 0])
        again = page.evaluate(_MOVE, [k, kind, name, to])
        assert back["diff"] > 0 and again["diff"] > 0, (k, name)
        times.append((float(np.median([r["ms"], back["ms"], again["ms"]])), k, name))  # a busy machine's one-off pause
        page.evaluate(_MOVE, [k, kind, name, 0])


@pytest.mark.slow
def test_the_html_form_in_chromium(explorers, tmp_path):
    pw = _need_browser()
    from tests.test_browser import _browser

    ex2, ex3, exm, exe = explorers["02"], explorers["03"], explorers["models"], explorers["evil"]
    page_file = _page(tmp_path / "explorers.html", ex2.html() + ex3.html() + exm.html() + exe.html())
    times = []
    with pw.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1200, "height": 900}, accept_downloads=True)
        seen = _watch(page)
        page.goto(page_file.as_uri())
        page.wait_for_function(_READY, timeout=30_000)
        assert page.locator(".ucx-mount").count() == 4 and page.locator(".ucx-fallback").count() == 0
        # 02: sample, view, layer, head (to "mean"), query token; every move redraws the canvas
        _exercise(page, 0, [("range", "layer"), ("range", "head"), ("range", "query token"), ("select", "sample"),
                            ("select", "view")], times)
        r = page.evaluate(_MOVE, [0, "range", "head", 8])
        assert r["readout"] == "mean" and "mean of 8 heads" in r["caption"]
        for view in (2, 1):  # the whole map, the picture reading the word: every slider there too
            page.evaluate(_MOVE, [0, "select", "view", view])
            _exercise(page, 0, [("range", "layer"), ("range", "head"), ("range", "query token")], times)
        # 03: prompt, step, layer, head, word
        _exercise(page, 1, [("range", "step"), ("range", "layer"), ("range", "head"), ("range", "word"),
                            ("select", "prompt"), ("select", "view")], times)
        # models: the model menu
        _exercise(page, 2, [("select", "model"), ("range", "layer"), ("range", "head")], times)
        # a slider moved with the keyboard, as a reader does
        handle = page.locator(".ucx-mount").nth(1).locator("input.ucx-range[data-name=step]")
        handle.focus()
        page.keyboard.press("ArrowRight")
        assert handle.evaluate("e => e.parentElement.querySelector('output').textContent") == "1"
        # export: the view as PNG, its numbers as JSON (compared with the exact maps)
        page.evaluate(_MOVE, [0, "select", "view", 0])
        page.evaluate(_MOVE, [0, "range", "layer", 2])
        page.evaluate(_MOVE, [0, "range", "head", 3])
        page.evaluate(_MOVE, [0, "range", "query token", 7])
        mount = page.locator(".ucx-mount").first
        with page.expect_download() as d:
            mount.locator("button.ucx-save-png").click()
        png = Path(d.value.path()).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and d.value.suggested_filename.endswith(".png")
        with page.expect_download() as d:
            mount.locator("button.ucx-save-json").click()
        got = json.loads(Path(d.value.path()).read_text())
        assert got["settings"] == {"model": "", "sample": "single-0", "view": "t2i", "layer": 2, "head": 3,
                                   "word": "71 'triangle'"}
        exact = ex2.data.values(ex2.data.choose(None, layer=2, head=3))
        assert np.allclose(got["map"], exact, atol=exact.max() / 255 * 0.51 + 1e-3, rtol=2e-3)
        # hostile text: shown as text, never as markup
        cap = page.locator(".ucx-mount").nth(3).locator(".ucx-caption").text_content()
        assert EVIL in cap and page.locator("img").count() == 0
        assert EVIL in page.locator(".ucx-mount").nth(2).locator("select.ucx-select").first.evaluate(
            "s => [...s.options].map(o => o.textContent).join('|')")
        page.wait_for_timeout(300)
        browser.close()
    assert not seen["console"], seen["console"][:5]
    assert not seen["dialogs"], seen["dialogs"]
    left = [u for u in seen["requests"] if u != page_file.as_uri() and not u.startswith(("blob:", "data:"))]
    assert not left, left[:5]  # nothing leaves the page
    ms = [t for t, _, _ in times]
    print(f"\nredraw in the page: median {np.median(ms):.2f} ms, max {max(ms):.2f} ms over {len(ms)} moves; "
          f"slowest {sorted(times)[-3:]}")
    assert max(ms) <= MAX_REDRAW_MS, sorted(times)[-5:]


@pytest.mark.slow
def test_an_nbconvert_export_of_a_notebook_that_displays_the_widget_runs_it(explorers, tmp_path):
    pw = _need_browser()
    import nbformat
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from tests.test_browser import _browser

    bundle = explorers["evil"]._repr_mimebundle_()
    nb = new_notebook(cells=[new_markdown_cell("# explorer"),
                             new_code_cell("attention_explorer(...)", outputs=[new_output("display_data", data=bundle)])])
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)  # no widget state saved: the HTML form shows
    key = explorers["evil"].data.key
    assert f'data-ucx="{key}"' in body and explorers["evil"].data.spec["title"] in body  # (attributes reordered)
    template_urls = set(re.findall(r'(?:src|href)="(https?://[^"]+)"', body))
    assert not re.findall(r"https?://", bundle["text/html"])
    page_file = tmp_path / "export.html"
    page_file.write_text(body)
    with pw.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        seen = _watch(page)
        page.route(re.compile(r"^https?://"), lambda route: route.abort())  # the template's CDN links go nowhere
        page.goto(page_file.as_uri())
        page.wait_for_function(_READY, timeout=30_000)
        times = []
        _exercise(page, 0, [("range", "layer"), ("range", "head"), ("range", "query token"), ("select", "view")], times)
        browser.close()
    ours = [u for u in seen["requests"] if u != page_file.as_uri() and u not in template_urls
            and not u.startswith(("blob:", "data:"))]
    assert not ours, ours[:5]  # the explorer asks for nothing; the template's own links are its own
    errors = [e for e in seen["console"] if not any(u.split("//", 1)[1].split("/", 1)[0] in e for u in template_urls)
              and "net::ERR_FAILED" not in e]
    assert not errors, errors[:5]
    assert max(t for t, _, _ in times) <= MAX_REDRAW_MS, times


@pytest.mark.extended
def test_the_widget_in_jupyterlab(tmp_path):
    """The anywidget in JupyterLab, from a kernel: drawn from the synced maps, a slider moved with the keyboard redraws
    the canvas within the budget and the choice reaches the kernel (``ex.selection``); nothing leaves the machine."""
    pw = _need_browser()
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from tests.test_browser import _browser, _lab

    nb = new_notebook(cells=[
        new_code_cell("from tests.test_explorer import lesson_02\nfrom unicache_lib.widgets import attention_explorer\n"
                      "ex = attention_explorer(*lesson_02(n_samples=2, layers=3, heads=2, evil=True))\nex"),
        new_code_cell("print('SELECTION', ex.selection['axes'], ex.selection['head'])"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, tmp_path / "nb.ipynb")
    with _lab(tmp_path, tmp_path / "lab.log") as url, pw.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        seen = _watch(page)
        page.goto(f"{url}/lab/tree/nb.ipynb")
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        try:  # a kernel picker may come up first
            page.locator(".jp-Dialog button", has_text="Select").click(timeout=5_000)
        except Exception:
            pass
        page.wait_for_selector("text=Kernel status: Idle", state="attached", timeout=90_000)
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        page.wait_for_selector(".ucx-mount canvas", timeout=180_000)
        page.wait_for_function(_READY, timeout=60_000)
        times = []
        _exercise(page, 0, [("range", "layer"), ("range", "head"), ("range", "query token"), ("select", "view")], times)
        handle = page.locator(".ucx-mount input.ucx-range[data-name=layer]")
        handle.focus()
        page.keyboard.press("ArrowRight")  # input and change: the choice goes to the kernel
        page.keyboard.press("ArrowRight")
        assert EVIL in page.locator(".ucx-mount .ucx-caption").text_content() and page.locator(".ucx-mount img").count() == 0
        page.locator(".jp-Cell").nth(1).click()
        page.keyboard.press("Shift+Enter")
        out = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
        try:  # the cell ran once with Run All ([0] 0); run again, it prints what the kernel now holds
            pw.expect(out).to_contain_text("SELECTION [2] 0", timeout=60_000)
        except AssertionError:
            raise AssertionError(f"the kernel holds another selection: {out.text_content()!r}; slider shows "
                                 f"{handle.evaluate('e => e.value')}; prompts "
                                 f"{page.locator('.jp-InputPrompt').all_text_contents()}") from None
        page.screenshot(path=str(tmp_path / "lab.png"))
        browser.close()
    assert max(t for t, _, _ in times) <= MAX_REDRAW_MS, times
    assert not seen["dialogs"], seen["dialogs"]
    ours = [e for e in seen["console"] if re.search(r"ucx|unicache|anywidget|explorer", e, re.I)]
    assert not ours, ours[:5]
    outside = [u for u in seen["requests"] if not u.startswith((url, "blob:", "data:", "ws://127.0.0.1"))]
    assert not outside, outside[:5]


def test_a_name_that_is_not_text_is_refused_in_one_line(monkeypatch):
    """Round 11: a sample id holding a lone surrogate (os.fsdecode of a file name that is not UTF-8) raised a raw
    UnicodeEncodeError while the explorer was built."""
    from unicache_lib.explorer import attention_explorer

    monkeypatch.setitem(globals(), "EVIL", "cat-\udcff")
    with pytest.raises(InputError, match=r"is not text \(a lone surrogate.*rename it") as e:
        attention_explorer(*lesson_02(n_samples=2, layers=2, heads=2, evil=True))
    assert "\n" not in str(e.value)
