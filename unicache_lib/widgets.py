"""ipywidgets panels. Thin: every picture comes from a function in :mod:`unicache_lib.plots`,
which works the same without widgets."""
from __future__ import annotations

from . import plots
from .capture.record import CaptureResult


def attention_explorer(result: CaptureResult, images: dict, tokens: dict, grids: dict | None = None):
    """Sample / layer / head / token controls over full-mode records.

    Args:
        result: full-mode records (``probs [H, S, S]``, or cross-attention ``[H, T, V]``) with spans;
            the layer slider steps through the captured layers only.
        images: sample id -> ``[H, W, 3]`` uint8 image.
        tokens: sample id -> list of token strings (length S).
        grids: sample id -> ``(grid, grid_tokens)`` of its image tokens over the picture (default: square).
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
    layer = W.SelectionSlider(options=result.layers, description="layer", continuous_update=False)
    head = W.IntSlider(min=0, max=r0.heads - 1, description="head", continuous_update=False)

    def text_positions(s):
        r = result[s, result.layers[0]]
        idx = range(r.probs.shape[1]) if r.part == "cross" else r.spans.text_index
        return [(f"{i}: {tokens[s][i]}", int(i)) for i in idx]

    opts = text_positions(samples[0])
    token = W.Dropdown(options=opts, value=opts[-1][1], description="token")
    out = W.Output()

    def draw(*_):
        rec = result[sample.value, layer.value]
        with out:
            out.clear_output(wait=True)
            grid, cells = (grids or {}).get(sample.value, (None, None))
            fig = plots.map_panel(rec.probs[head.value], rec.spans, images[sample.value], token.value,
                                  tokens[sample.value], f"{sample.value} L{layer.value} H{head.value}",
                                  cross=rec.part == "cross", grid=grid, grid_tokens=cells)
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


def step_explorer(result: CaptureResult, images: dict, tokens: dict, part: str | None = None):
    """Step / layer / head sliders and a word selector over full-mode diffusion records.

    Left: the head's map at that step and layer (joint: ``[image | text]`` both ways; cross: image
    queries x text keys). Right: the chosen word's column over the generated image.

    Args:
        result: full-mode records of :class:`~unicache_lib.capture.diffusion.DiffusionCapture`.
        images: sample id -> generated ``[H, W, 3]`` uint8 image.
        tokens: sample id -> real text tokens.
        part: ``"joint"`` or ``"cross"`` (default: the first part holding text keys).
    """
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    recs = [r for r in result.records if "probs" in r.data and r.meta.get("n_text", 0) > 0
            and (part is None or r.part == part)]
    if not recs:
        raise ValueError("step_explorer needs full-mode records with text keys (DiffusionCapture(mode='full'))")
    samples = list(dict.fromkeys(r.sample for r in recs))
    by = {(r.sample, r.layer, r.step): r for r in recs}
    layers = sorted({r.layer for r in recs})
    steps = sorted({r.step for r in recs})
    sample = W.Dropdown(options=samples, description="prompt")
    step = W.IntSlider(min=steps[0], max=steps[-1], description="step", continuous_update=False)
    layer = W.IntSlider(min=layers[0], max=layers[-1], description="layer", continuous_update=False)
    head = W.IntSlider(min=0, max=recs[0].heads - 1, description="head", continuous_update=False)

    def word_options(s):
        return [(f"{i}: {t}", i) for i, t in enumerate(tokens[s])]

    word = W.Dropdown(options=word_options(samples[0]), description="word")
    out = W.Output()

    def draw(*_):
        r = by[(sample.value, layer.value, step.value)]
        P = r.probs[head.value]
        n_img, n_real = r.meta["n_image"], r.meta["n_text_real"]
        joint = r.part == "joint"
        text_first = joint and r.meta.get("token_order", "image|text").startswith("text")  # Flux: [text | image]
        img0 = r.meta["n_text"] if text_first else 0  # first image row / column
        col = (0 if text_first else n_img) + word.value if joint else word.value
        with out:
            out.clear_output(wait=True)
            fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
            plots.attention_map(P, None, f"{r.part} L{r.layer} H{head.value} step {r.step}", ax=axes[0])
            if joint:
                cut = (r.meta["n_text"] if text_first else n_img) - 0.5
                axes[0].axvline(cut, color="w", lw=0.8)
                axes[0].axhline(cut, color="w", lw=0.8)
            plots.image_overlay(images[sample.value], P[img0:img0 + n_img, col],
                                f"image -> {tokens[sample.value][word.value]!r}", ax=axes[1])
            fig.tight_layout()
            display(fig)
            plt.close(fig)

    def new_sample(change):
        word.options = word_options(change["new"])
        draw()

    sample.observe(new_sample, names="value")
    for w in (step, layer, head, word):
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([sample, word]), W.HBox([step, layer, head]), out])
