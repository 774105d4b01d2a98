import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest
import torch

from unicache_lib import plots
from unicache_lib.capture.record import CaptureResult, Record
from unicache_lib.core.modality import Spans

from .conftest import random_probs

SP = Spans.from_kinds([0] * 2 + [1] * 16 + [0] * 4)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_figures_render_and_validate(tmp_path):
    rng = np.random.default_rng(0)
    P = random_probs(rng, (2, 22, 22))
    img = np.zeros((32, 32, 3), np.uint8)
    figs = [
        plots.layer_curves({"entropy": rng.random((5, 4))}, "t"),
        plots.attention_map(P[0], SP),
        plots.blocked_map(P[0], SP),
        plots.read_frequency_heatmap(rng.random((4, 22)), SP),
        plots.per_layer_boxes(rng.random((4, 8))),
        plots.image_overlay(img, rng.random(16)),
        plots.map_panel(P[1], SP, img, 20, [str(i) for i in range(22)]),
        plots.bars({"a": 1.0, "b": 2.0}),
    ]
    for i, f in enumerate(figs):
        assert plots.save(f, tmp_path, f"f{i}").stat().st_size > 1000
    with pytest.raises(ValueError, match="pick a head"):
        plots.attention_map(P, SP)
    with pytest.raises(ValueError, match="square grid"):
        plots.image_overlay(img, rng.random(15))
    with pytest.raises(ValueError, match="n_samples, n_layers"):
        plots.layer_curves({"x": rng.random(5)})
    with pytest.raises(ValueError, match="outside the sequence"):
        plots.map_panel(P[1], SP, img, 99)
    with pytest.raises(ValueError, match="spans cover"):
        plots.read_frequency_heatmap(rng.random((4, 21)), SP)


def _heatmap_axes(fig):
    """Axes of ``fig`` showing a heatmap (their top image is data, not a plain picture or a colour bar)."""
    cbar_axes = {im.colorbar.ax for ax in fig.axes for im in ax.images if im.colorbar is not None}
    return [ax for ax in fig.axes if ax.images and ax not in cbar_axes and ax.images[-1].get_array().ndim == 2]


def _labels_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of titles, suptitle, legends and axis labels whose drawn boxes intersect."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    items = [(f"suptitle {fig._suptitle.get_text()!r}", fig._suptitle)] if fig._suptitle else []
    for i, ax in enumerate(fig.axes):
        items += [(f"ax{i} {name} {t.get_text()!r}", t) for name, t in
                  (("title", ax.title), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label)) if t.get_text()]
        if ax.get_legend():
            items.append((f"ax{i} legend", ax.get_legend()))
    boxes = [(n, a.get_window_extent(r)) for n, a in items]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_every_heatmap_has_a_labelled_colour_bar_and_span_legend():
    rng = np.random.default_rng(0)
    P = random_probs(rng, (2, 22, 22))
    img = np.zeros((32, 32, 3), np.uint8)
    legends = {"image keys": plots.attention_map(P[0], SP), "image | text border": plots.blocked_map(P[0], SP),
               "image block": plots.read_frequency_heatmap(rng.random((4, 22)), SP, "a rather long title, sample x")}
    figs = [*legends.values(), plots.image_overlay(img, rng.random(16)), plots.word_regions(img, {"red": rng.random(16)}),
            plots.step_panel(_full("p0", 1, n=20, step=3, part="joint", meta={"n_image": 16, "n_text": 4}), 1, img, 2,
                             ["a", "red", "cube", "."], "joint · step 3 · layer 1 · head 1"),
            plots.map_panel(P[1], SP, img, 21, [f"t{i}" for i in range(21)] + [":"], "sample s0 · layer 2 · head 1",
                            question="where is the red circle ?")]
    for fig in figs:
        heat = _heatmap_axes(fig)
        assert heat, fig
        for ax in heat:
            cb = ax.images[-1].colorbar
            assert cb is not None and cb.ax.get_ylabel(), f"no labelled colour bar on {ax.get_title()!r}"
        assert not _labels_overlap(fig), _labels_overlap(fig)
    for label, fig in [*legends.items(), ("image | text border", figs[-2])]:  # figs[-2]: the step panel's joint map
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [label]
    panel = figs[-1]
    assert "(log10)" not in " ".join(ax.get_title() for ax in panel.axes)  # the log is in the colour bar label
    assert panel.axes[0].images[-1].colorbar.ax.get_ylabel() == "log10(attention weight)"
    assert "query token 21 ':'" in panel.axes[2].get_title()  # punctuation quoted
    assert "where is the red circle ?" in panel._suptitle.get_text()
    fig = plots.read_frequency_heatmap(rng.random((3, 22)), SP, layers=[0, 15, 31])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "15", "31"]
    with pytest.raises(ValueError, match="2 layer numbers for 3 rows"):
        plots.read_frequency_heatmap(rng.random((3, 22)), SP, layers=[0, 1])


def test_line_styles_are_distinct_and_one_legend_is_shared():
    import matplotlib.pyplot as plt

    names = [f"m{i}" for i in range(15)] + ["m0"]
    st = plots.line_styles(names)
    assert len(st) == 15 and len({(tuple(v["color"]), v["marker"]) for v in st.values()}) == 15
    assert len({tuple(v["color"]) for v in st.values()}) == 15  # 15 colours, none reused
    fig, axes = plt.subplots(1, 2)
    for ax in axes:
        for n in names[:3]:
            ax.plot([0, 1], [0, 1], label=n, **st[n])
    plots.shared_legend(fig, axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["m0", "m1", "m2"]
    with pytest.raises(ValueError, match="no labelled lines"):
        plots.shared_legend(*plt.subplots(1, 2))


def _full(sample, layer, heads=2, n=22, step=-1, part="language", meta=None, rng=None):
    rng = rng or np.random.default_rng(layer * 100 + max(step, 0))
    return Record(sample, layer, part, "full", {"probs": random_probs(rng, (heads, n, n))}, SP if part == "language" else None,
                  step=step, seq_len=n, heads=heads, meta=meta or {})


def test_explorer_offers_only_captured_layers_and_redraws_at_each():
    from unicache_lib.widgets import attention_explorer

    res = CaptureResult.from_records([_full(s, layer) for s in ("s0", "s1") for layer in (0, 2, 5)])  # LAYERS=[0, 2, 5]
    toks = {s: [f"t{i}" for i in range(19)] + ["circle", "?", ":"] for s in ("s0", "s1")}
    imgs = {s: np.zeros((32, 32, 3), np.uint8) for s in ("s0", "s1")}
    panel = attention_explorer(res, imgs, toks, questions={"s0": "where is the red circle ?"})
    p = panel.data.spec["models"][0]["panels"][0]
    assert p["axes"] == [{"name": "layer", "values": [0, 2, 5]}] and p["heads"] == 2  # only captured layers
    assert p["words"][p["open_word"]] == "19 'circle'"  # opens on the object word, not the closing ':'
    assert [int(w.split()[0]) for w in p["words"]] == [0, 1, 18, 19, 20, 21]  # every text position offered
    seen, maps = [], []
    for layer in (2, 5, 0):  # every stop (a missing record would raise here), each its own map
        panel.select(layer=layer)
        seen.append(panel.caption.value)
        maps.append(panel.values().tobytes())
        assert f"layer {layer}" in seen[-1] and "where is the red circle ?" in seen[-1] and "19 &#x27;circle&#x27;" in seen[-1]
    assert len(set(maps)) == 3
    panel.select(head=1, sample="s1")
    assert "sample s1" in panel.caption.value and "head 1" in panel.caption.value
    holey = CaptureResult.from_records([_full("s0", 0), _full("s0", 2), _full("s1", 0)])  # s1 lacks layer 2
    with pytest.raises(ValueError, match=r"'sample': 's1', 'layer': 2.*capture them all alike"):
        attention_explorer(holey, imgs, toks)
    with pytest.raises(ValueError, match="tokens has no entry for sample 's1'"):
        attention_explorer(res, imgs, {"s0": toks["s0"]})
    with pytest.raises(ValueError, match="full-mode"):
        stats_only = CaptureResult()
        stats_only.records.append(Record("s0", 0, "language", "stats", {"entropy": torch.zeros(2, 22)}, SP))
        attention_explorer(stats_only, {}, {})


def test_step_explorer_offers_only_captured_steps_and_layers():
    from unicache_lib.widgets import step_explorer

    meta = {"n_image": 16, "n_text": 4, "n_text_real": 4, "prompt": "a red cube ."}
    recs = [_full("p0", layer, n=20, step=step, part="joint", meta=meta) for layer in (0, 3) for step in (0, 4, 9)]
    toks = {"p0": ["a", "red", "cube", "."]}
    panel = step_explorer(CaptureResult.from_records(recs), {"p0": np.zeros((32, 32, 3), np.uint8)}, toks)
    p = panel.data.spec["models"][0]["panels"][0]
    assert p["axes"] == [{"name": "step", "values": [0, 4, 9]}, {"name": "layer", "values": [0, 3]}]
    assert p["words"][3] == "3 '.'"
    for layer in (3, 0):
        for step in (4, 9, 0):
            panel.select(layer=layer, step=step)
            assert f"step {step} · layer {layer}" in panel.caption.value and "a red cube ." in panel.caption.value
    with pytest.raises(ValueError, match="'step': 9"):
        step_explorer(CaptureResult.from_records(recs[:-1]), {"p0": None}, toks)


def test_layer_curves_plot_at_the_captured_layer_numbers():
    from unicache_lib import plots

    fig = plots.layer_curves({"x": np.random.default_rng(0).random((3, 3))}, layers=[0, 15, 31], n_layers=32)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_xdata()) == [0, 15, 31]  # a layer subset is not relabelled 0, 1, 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "15", "31"]
    assert {t.get_text() for t in ax.texts} == {"shallow", "middle", "deep"}
    with pytest.raises(ValueError, match="3 columns for 2 positions"):
        plots.layer_curves({"x": np.zeros((2, 3))}, layers=[0, 1])


def test_grid_panels_label_their_scale():
    rng = np.random.default_rng(0)
    own = plots.grid_panels({"a": rng.random((4, 8)), "b": 10 * rng.random((4, 8))}, "head", "layer", "importance")
    labels = [ax.images[-1].colorbar.ax.get_ylabel() for ax in _heatmap_axes(own)]
    assert labels == ["importance (per-panel scale)"] * 2
    shared = plots.grid_panels({"a": rng.random((4, 8)), "b": 10 * rng.random((4, 8))}, "head", "layer", "importance",
                               shared=True)
    clims = {ax.images[-1].get_clim() for ax in _heatmap_axes(shared)}
    assert len(clims) == 1 and [ax.images[-1].colorbar.ax.get_ylabel() for ax in _heatmap_axes(shared)] == ["importance"] * 2
    with pytest.raises(ValueError, match=r"\[rows, cols\]"):
        plots.grid_panels({"a": rng.random(4)}, "head", "layer", "importance")
    fig = plots.layer_step_grid(rng.random((3, 5)), layers=[0, 11, 23])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "11", "23"]


def test_layer_overlays_one_panel_per_layer(tmp_path):
    rng = np.random.default_rng(0)
    img = np.zeros((32, 32, 3), np.uint8)
    fig = plots.layer_overlays(img, {0: rng.random(16), 3: rng.random(16)}, "object word 'circle' reading the image")
    assert len([a for a in fig.axes if a.get_title()]) == 3  # the picture + one panel per layer (colour bars untitled)
    assert [a.get_title().split(" (")[0] for a in fig.axes if a.get_title()] == ["the picture", "layer 0", "layer 3"]
    assert plots.save(fig, tmp_path, "overlays").stat().st_size > 1000
    with pytest.raises(ValueError, match="at least one layer"):
        plots.layer_overlays(img, {})


def test_layer_overlays_draw_the_picture_then_one_panel_per_layer():
    img = np.zeros((32, 32, 3), np.uint8)
    rng = np.random.default_rng(0)
    fig = plots.layer_overlays(img, {0: rng.random(16), 3: rng.random(16)}, "a question")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0] == "the picture" and titles[1].startswith("layer 0") and titles[2].startswith("layer 3")
    with pytest.raises(ValueError, match="at least one layer"):
        plots.layer_overlays(img, {})


def test_first_looks_query_a_content_word():
    from unicache_lib.analysis.token_classes import content_position

    toks = ["<s>", "where", "is", "the", "red", "circle", "?", "ASSISTANT", ":"]
    assert content_position(toks, range(len(toks))) == 5  # the object word, not ':' or '?'
    assert content_position(toks, range(5)) == 4  # a colour when no object word is offered
    assert content_position(["where", "is", "it", "?"], range(4)) == 2  # then any word
    assert content_position(["?", ":"], [0, 1]) == 1  # then the last position
    with pytest.raises(ValueError, match="at least one position"):
        content_position(toks, [])


def test_one_colour_per_method_across_the_workbook():
    from unicache_lib import plots

    a, b = plots.method_style("key_coverage"), plots.method_style("step_skip")
    assert a["color"] == b["color"] == plots.DESIGNED_COLOUR and a["lw"] > plots.method_style("h2o")["lw"]
    assert plots.method_style("steps:7") == plots.method_style("steps:12")  # every fewer-step control one grey
    masked = "kvpress:adakv_snapkv (masked, full memory)"
    assert plots.method_style(masked)["color"] == plots.method_style("kvpress:adakv_snapkv")["color"]
    unknown = plots.method_style("my_new_policy")
    assert unknown == plots.method_style("my_new_policy")  # fixed by the name, not by its place in a figure
    assert unknown["color"] not in (plots.METHOD_COLOURS["random"], plots.METHOD_COLOURS["steps"], plots.DESIGNED_COLOUR)
    with pytest.raises(ValueError, match="at most 6: plot the ones the lesson compares"):
        plots.check_methods([f"m{i}" for i in range(7)])
    assert plots.check_methods(["a", "b", "a"]) == ["a", "b"]


def test_lesson_pictures_kept_patches_gallery_and_token_map():
    import matplotlib

    matplotlib.use("Agg")
    from unicache_lib import plots

    img = np.zeros((16, 16, 3), np.uint8)
    fig = plots.kept_patches(img, {"h2o": np.r_[np.ones(2), np.zeros(14)], "key_coverage": np.full(16, 0.5)},
                             {"h2o": "answers 'x'"}, "t")
    assert len(fig.axes) == 3
    with pytest.raises(ValueError, match="pass grid=\\(rows, cols\\)"):
        plots.kept_patches(img, {"h2o": np.ones(15)})
    # each patch brightens exactly its own block (a 9-pixel block on a 64-pixel picture drifted by up to a patch and
    # drew the last row as one pixel line): a one-hot share on the last patch lights the bottom-right 8 x 8 block only
    white = np.full((64, 64, 3), 255, np.uint8)
    for rows in (8, 7):  # 7 does not divide 64: the blocks are 9 or 10 pixels, none lost or shrunk to a line
        one_hot = np.zeros(rows * rows)
        one_hot[-1] = 1
        shown = plots.kept_patches(white, {"h2o": one_hot}).axes[1].images[0].get_array()
        bright = np.argwhere(np.asarray(shown)[..., 0] > 0.5)
        first = -(-(rows - 1) * 64 // rows)  # the last patch's first pixel row: ceil(64 (rows - 1) / rows)
        assert len(bright) == (64 - first) ** 2 and bright.min(0).tolist() == [first] * 2, rows
    fig = plots.reuse_gallery({"none": img, "step_skip": img, "steps:3": img, "diffusers:pab": img},
                              {"none": 100.0, "step_skip": 41.0, "steps:3": 35.0}, {"none": [True] * 5,
                              "step_skip": [True, True, False, True, True], "steps:3": [True] * 3, "diffusers:pab": None}, 5)
    labels = [ax.get_xlabel() for ax in fig.axes]
    assert "4 of 5 steps run" in labels and "3 steps: a coarser grid" in labels
    assert any(t.get_text() == "decided per block" for ax in fig.axes for t in ax.texts)
    P = torch.tril(torch.ones(3, 3)) / torch.arange(1, 4)[:, None]
    plots.token_map(P, ["a", "b", "c"])
    with pytest.raises(ValueError, match="S tokens"):
        plots.token_map(P, ["a", "b"])


def test_first_figures_compare_on_one_scale_with_even_reading_marked():
    """Issue #46's first-figure rule, on the functions the lessons' first figures use: compared panels share one colour
    scale from 0 in × uniform, with 1 (even reading) marked on each colour bar; the overlay of 01's first figure is
    drawn in × uniform with even reading marked, on the head where the word reads the picture most (peak above 1)."""
    from unicache_lib.analysis.localisation import query_over_image, reading_head

    rng = np.random.default_rng(0)
    recs = [_full("s0", layer, rng=np.random.default_rng(layer)) for layer in (0, 1, 2)]
    q = 19  # a text position after the image block (causal: 20 visible keys)
    maps = query_over_image(recs, "s0", q, uniform=True)
    raw = query_over_image(recs, "s0", q)
    assert all(np.allclose(maps[k], raw[k] * (q + 1)) for k in maps)
    fig = plots.layer_overlays(np.zeros((32, 32, 3), np.uint8), maps, uniform=True)
    overlays = [ax.images[-1] for ax in fig.axes if ax.images and ax.images[-1].get_alpha() == 0.6]
    assert len(overlays) == 3 and len({im.get_clim() for im in overlays}) == 1  # one shared scale
    lo, hi = overlays[0].get_clim()
    assert lo == 0 and hi == pytest.approx(max(1.0, max(float(m.max()) for m in maps.values())))
    bars = [im.colorbar for im in overlays]
    assert all(any(line.get_ydata()[0] == 1.0 for line in cb.ax.lines) for cb in bars)  # even reading marked
    r, h, peak = reading_head(recs, q)
    best = max(float((rec.probs[:, q][:, SP.image_index] * (q + 1)).max()) for rec in recs)
    assert peak == pytest.approx(best) and peak > 1
    assert float((r.probs[h, q, SP.image_index] * (q + 1)).max()) == pytest.approx(peak)
    panel = plots.map_panel(r.probs[h], SP, np.zeros((32, 32, 3), np.uint8), q, [f"t{i}" for i in range(22)])
    over = panel.axes[2].images[-1]
    assert over.get_clim()[0] == 0 and any(line.get_ydata()[0] == 1.0 for line in over.colorbar.ax.lines)


def test_an_overlay_that_never_reaches_even_reading_keeps_its_scale_at_1():
    """A head reading next to nothing of the picture (1e-7 × uniform) is drawn dark on a scale that reaches 1, and the
    figure stays its size (the 'even' mark used to sit far outside a tiny scale and blow the saved figure up)."""
    import io

    fig = plots.image_overlay(np.zeros((32, 32, 3), np.uint8), np.full(16, 1e-7), chance=1.0, cbar="× uniform")
    assert fig.axes[0].images[-1].get_clim() == (pytest.approx(1e-7), 1.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    from PIL import Image

    assert max(Image.open(buf).size) < 2000


def test_figures_made_with_math_text_off_stay_with_pyplot(monkeypatch):
    """The wrapper that draws data text literally must not cost a notebook its figures: an rc_context's exit restored
    the backend and the inline backend dropped every figure made inside (01-05 lost their displayed figures)."""
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.rcParams.copy()
    fig = plots.bars({"a": 1.0, "$x$": 2.0})
    assert fig.number in plt.get_fignums() and matplotlib.rcParams["text.parse_math"] is True
    assert dict(matplotlib.rcParams) == dict(before)  # nothing else of the rc touched


def test_a_curve_counts_only_the_samples_it_is_a_mean_over():
    """#60 round 11 (silent 2): a statistic NaN in every layer of one sample was drawn as the other sample's curve
    while the legend said n=2."""
    from unicache_lib import plots

    v = np.array([[np.nan, np.nan, np.nan], [0.2, 0.3, 0.4]])
    labels = lambda fig: [t.get_text() for t in fig.axes[0].get_legend().get_texts()]  # noqa: E731
    assert labels(plots.layer_curves({"entropy": v})) == ["entropy (n=1 of 2)"]
    v[0, 2] = 0.5  # one layer of the first sample is finite: its points are means over 1 or 2 samples
    assert labels(plots.layer_curves({"entropy": v})) == ["entropy (n=1–2 of 2)"]
    v[0] = [0.1, 0.2, 0.3]
    assert labels(plots.layer_curves({"entropy": v})) == ["entropy (n=2)"]
    v[:, 0] = np.nan  # a column undefined for every sample (step 0's similarity) is a gap, not a smaller n
    assert labels(plots.layer_curves({"entropy": v})) == ["entropy (n=2)"]
