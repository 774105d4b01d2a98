"""ipywidgets panels. Thin: every picture comes from a function in :mod:`unicache_lib.plots`,
which works the same without widgets."""
from __future__ import annotations

from . import plots
from .capture.record import CaptureResult


def attention_explorer(result: CaptureResult, images: dict, tokens: dict):
    """Sample / layer / head / token controls over full-mode records.

    Args:
        result: full-mode records (``probs [H, S, S]``) with spans.
        images: sample id -> ``[H, W, 3]`` uint8 image.
        tokens: sample id -> list of token strings (length S).
    Returns:
        an ``ipywidgets.VBox`` (display it, or let it be the cell's last expression).
    """
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    if not result.records or "probs" not in result.records[0].data:
        raise ValueError("attention_explorer needs full-mode records (capture with mode='full')")
    samples = result.samples
    r0 = result[samples[0], result.layers[0]]
    sample = W.Dropdown(options=samples, description="sample")
    layer = W.IntSlider(min=result.layers[0], max=result.layers[-1], description="layer", continuous_update=False)
    head = W.IntSlider(min=0, max=r0.heads - 1, description="head", continuous_update=False)

    def text_positions(s):
        sp = result[s, result.layers[0]].spans
        return [(f"{i}: {tokens[s][i]}", int(i)) for i in sp.text_index]

    opts = text_positions(samples[0])
    token = W.Dropdown(options=opts, value=opts[-1][1], description="token")
    out = W.Output()

    def draw(*_):
        rec = result[sample.value, layer.value]
        with out:
            out.clear_output(wait=True)
            fig = plots.map_panel(rec.probs[head.value], rec.spans, images[sample.value], token.value,
                                  tokens[sample.value], f"{sample.value} L{layer.value} H{head.value}")
            display(fig)
            plt.close(fig)

    def new_sample(change):
        token.options = text_positions(change["new"])
        token.value = token.options[-1][1]
        draw()

    sample.observe(new_sample, names="value")
    for w in (layer, head, token):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([sample, token]), W.HBox([layer, head]), out])
