import matplotlib

matplotlib.use("Agg")
import numpy as np
import pytest
import torch

from unicache_lib import plots
from unicache_lib.capture.record import CaptureResult, Record
from unicache_lib.modality import Spans

from .conftest import random_probs

SP = Spans.from_kinds([0] * 2 + [1] * 16 + [0] * 4)


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


def test_explorer_redraws_on_slider_moves():
    from unicache_lib.widgets import attention_explorer

    rng = np.random.default_rng(1)
    res = CaptureResult()
    for layer in (0, 2, 5):  # a layer subset, as LAYERS=[...] captures
        res.records.append(Record("s0", layer, "language", "full", {"probs": random_probs(rng, (2, 22, 22))}, SP,
                                  seq_len=22, heads=2))
    panel = attention_explorer(res, {"s0": np.zeros((32, 32, 3), np.uint8)}, {"s0": [f"t{i}" for i in range(22)]})
    controls = {w.description: w for box in panel.children[:2] for w in box.children}
    assert set(controls) == {"sample", "query token", "layer", "head"}
    assert controls["layer"].options == (0, 2, 5) and controls["head"].max == 1  # only captured layers
    controls["layer"].value = 5  # redraws without error
    controls["head"].value = 1
    with pytest.raises(ValueError, match="full-mode"):
        stats_only = CaptureResult()
        stats_only.records.append(Record("s0", 0, "language", "stats", {"entropy": torch.zeros(2, 22)}, SP))
        attention_explorer(stats_only, {}, {})


def test_layer_curves_plot_at_the_captured_layer_numbers():
    from unicache_lib import plots

    fig = plots.layer_curves({"x": np.random.default_rng(0).random((3, 3))}, layers=[0, 15, 31], n_layers=32)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_xdata()) == [0, 15, 31]  # a layer subset is not relabelled 0, 1, 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "15", "31"]
    assert {t.get_text() for t in ax.texts} == {"shallow", "middle", "deep"}
    with pytest.raises(ValueError, match="3 columns for 2 positions"):
        plots.layer_curves({"x": np.zeros((2, 3))}, layers=[0, 1])
