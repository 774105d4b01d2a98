"""ipywidgets panels. Thin: every picture comes from a function in :mod:`unicache_lib.plots`,
which works the same without widgets.

Sliders offer only what was captured (a ``LAYERS=[0, 15, 31]`` capture gives a layer slider with
those three stops), and an incomplete capture (a layer or step missing for some sample) is refused
when the panel is built, so no slider position can reach a missing record."""
from __future__ import annotations

import base64
import io
from itertools import product

from . import plots
from .analysis.token_classes import content_position
from .capture.record import CaptureResult, Record
from .core.errors import InputError
from .core.untrusted import html_text
from .plots import quoted


def _index(recs: list[Record], fields: tuple[str, ...], what: str) -> tuple[dict, list[list]]:
    """``{(field values): record}`` over ``recs`` and the captured values of each field (samples in
    capture order, the rest sorted); raises ValueError naming the first missing combination, so the
    explorer's sliders never reach a record that is not there."""
    by = {tuple(getattr(r, f) for f in fields): r for r in recs}
    axes = [list(dict.fromkeys(k[i] for k in by)) for i in range(len(fields))]
    axes = [axes[0]] + [sorted(a) for a in axes[1:]]
    missing = [k for k in product(*axes) if k not in by]
    if missing:
        raise InputError(f"{what}: no record for {dict(zip(fields, missing[0]))} ({len(missing)} of "
                         f"{len(by) + len(missing)} combinations missing); every sample needs the same "
                         f"{' and '.join(f + 's' for f in fields[1:])}: capture them all alike, or pass only "
                         f"the complete samples (CaptureResult.from_records([...]))")
    return by, axes


def _heads(recs: list[Record], what: str) -> int:
    """The one head count of ``recs`` (each ``probs [H, ...]``); raises if the records disagree."""
    heads = {int(r.probs.shape[0]) for r in recs}
    if len(heads) != 1:
        raise InputError(f"{what}: records with different head counts {sorted(heads)}: pass one part's records")
    return heads.pop()


def _need(mapping: dict, keys, name: str, what: str):
    """Raise (at construction, not in a slider callback) when ``mapping`` lacks one of ``keys``."""
    gone = [k for k in keys if k not in mapping]
    if gone:
        raise InputError(f"{what}: {name} has no entry for sample {gone[0]!r}: pass {name} for every sample")


def _show(out, fig):
    """Replace what ``out`` shows with ``fig`` as a PNG (then closed, so figures do not pile up).

    The picture is set as the Output widget's state, not captured with ``with out:`` /
    ``clear_output(wait=True)``: headless executors (papermill / nbclient) intercept captured output
    through the kernel's message ids, and that path intermittently left a run waiting forever on the
    explorer cell; a state update has no such path."""
    import matplotlib.pyplot as plt  # local: matplotlib loads at the first figure, as in plots

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(fig)}},)


def _full_maps(result: CaptureResult, images: dict, tokens: dict, what: str):
    """``(records, (sample, layer) -> record, samples, layers)`` of the full-mode records of ``result``'s part (or the
    first part holding maps), with ``images`` and ``tokens`` checked to cover every sample: what an attention explorer
    draws from, live or static."""
    recs = [r for r in result.records if "probs" in r.data]
    if not recs:
        raise InputError(f"{what} needs full-mode records (capture with mode='full')")
    parts = {r.part for r in recs}
    part = result.part if result.part in parts else recs[0].part
    recs = [r for r in recs if r.part == part]
    by, (samples, layers) = _index(recs, ("sample", "layer"), what)
    for name, m in (("images", images), ("tokens", tokens)):
        _need(m, samples, name, what)
    return recs, by, samples, layers


def _step_maps(result: CaptureResult, images: dict, tokens: dict, part: str | None, what: str):
    """``(records, (sample, layer, step) -> record, samples, layers, steps)`` of the full-mode records with text keys
    of ``part`` (default: the first part holding them), with ``images`` and ``tokens`` checked to cover every sample:
    what a step explorer draws from, live or static."""
    recs = [r for r in result.records if "probs" in r.data and r.meta.get("n_text", 0) > 0
            and (part is None or r.part == part)]
    if not recs:
        raise InputError(f"{what} needs full-mode records with text keys (DiffusionCapture(mode='full'))")
    recs = [r for r in recs if r.part == recs[0].part]
    by, (samples, layers, steps) = _index(recs, ("sample", "layer", "step"), what)
    for name, m in (("images", images), ("tokens", tokens)):
        _need(m, samples, name, what)
    return recs, by, samples, layers, steps


def attention_explorer(result: CaptureResult, images: dict, tokens: dict, grids: dict | None = None,
                       questions: dict | None = None):
    """Sample / layer / head / query-token controls over full-mode records.

    Args:
        result: full-mode records (``probs [H, S, S]``, or cross-attention ``[H, T, V]``) with spans,
            of one part (``result.part`` if several); every sample must have the same layers. The
            layer slider offers the captured layers only.
        images: sample id -> ``[H, W, 3]`` uint8 image.
        tokens: sample id -> list of token strings (length S).
        grids: sample id -> ``(grid, grid_tokens)`` of its image tokens over the picture (default: square).
        questions: sample id -> the question asked (shown above the picture).
    Returns:
        an ``ipywidgets.VBox`` (display it, or let it be the cell's last expression); its ``caption``
        (an ``HTML`` widget) names the sample, layer, head, question and query token in words. It opens on the
        last text position naming an object or a colour (:func:`~unicache_lib.analysis.token_classes.content_position`).
    """
    import ipywidgets as W  # local: optional dependency (the notebooks extra)

    what = "attention_explorer"
    recs, by, samples, layers = _full_maps(result, images, tokens, what)
    sample = W.Dropdown(options=samples, description="sample")
    layer = W.SelectionSlider(options=layers, description="layer", continuous_update=False)
    head = W.IntSlider(min=0, max=_heads(recs, what) - 1, description="head", continuous_update=False)

    def text_positions(s):
        r = by[s, layers[0]]
        idx = range(r.probs.shape[1]) if r.part == "cross" else r.spans.text_index
        return [(quoted(int(i), tokens[s][i]), int(i)) for i in idx]

    def first_query(s):  # a content word (an object or colour), not the prompt's closing punctuation
        return content_position(tokens[s], [p for _, p in text_positions(s)])

    opts = text_positions(samples[0])
    token = W.Dropdown(options=opts, value=first_query(samples[0]), description="query token")
    caption, out = W.HTML(), W.Output()

    def draw(*_):
        s, rec = sample.value, by[sample.value, layer.value]
        q = (questions or {}).get(s)
        title = f"sample {s} · layer {layer.value} · head {head.value}"
        caption.value = (f"<b>{html_text(title)}</b>" + (f" · question: <i>{html_text(q)}</i>" if q else "")
                         + f" · query token: <code>{html_text(quoted(token.value, tokens[s][token.value]))}</code>")
        grid, cells = (grids or {}).get(s, (None, None))
        _show(out, plots.map_panel(rec.probs[head.value], rec.spans, images[s], token.value, tokens[s], title,
                                   cross=rec.part == "cross", grid=grid, grid_tokens=cells, question=q))

    def new_sample(change):
        token.options = text_positions(change["new"])
        token.value = first_query(change["new"])
        draw()

    sample.observe(new_sample, names="value")
    for w in (layer, head, token):
        w.observe(draw, names="value")
    draw()
    panel = W.VBox([W.HBox([sample, token]), W.HBox([layer, head]), caption, out])
    panel.caption = caption
    return panel


def model_explorer(per_model: dict):
    """A model dropdown over :func:`attention_explorer` panels, one per model.

    Args:
        per_model: model label -> ``(result, images, tokens, grids, questions)``, the arguments of
            :func:`attention_explorer` for that model's full-mode capture.
    Returns:
        an ``ipywidgets.VBox``: the dropdown, then the chosen model's explorer (built when first chosen).
    """
    import ipywidgets as W  # local: optional dependency (the notebooks extra)

    if not per_model:
        raise InputError("model_explorer needs at least one model's full-mode capture")
    built: dict = {}
    pick = W.Dropdown(options=list(per_model), description="model")
    box = W.VBox()

    def show(*_):
        if pick.value not in built:
            built[pick.value] = attention_explorer(*per_model[pick.value])
        box.children = (built[pick.value],)

    pick.observe(show, names="value")
    show()
    panel = W.VBox([pick, box])
    panel.explorers = built
    return panel


def step_explorer(result: CaptureResult, images: dict, tokens: dict, part: str | None = None):
    """Step / layer / head sliders and a word selector over full-mode diffusion records.

    Left: the head's map ``probs [H, Sq, Sk]`` at that step and layer (joint: ``[image | text]`` both
    ways, the border named in a legend; cross: image queries x text keys). Right: the chosen word's
    column over the generated image. Step and layer sliders offer the captured steps and layers only;
    every prompt must have the same (layer, step) records.

    Args:
        result: full-mode records of :class:`~unicache_lib.capture.diffusion.DiffusionCapture`.
        images: sample id -> generated ``[H, W, 3]`` uint8 image.
        tokens: sample id -> real text tokens.
        part: ``"joint"`` or ``"cross"`` (default: the first part holding text keys).
    Returns:
        an ``ipywidgets.VBox`` with a ``caption`` (``HTML``) naming prompt, step, layer, head and word.
    """
    import ipywidgets as W  # local: optional dependency (the notebooks extra)

    what = "step_explorer"
    recs, by, samples, layers, steps = _step_maps(result, images, tokens, part, what)
    sample = W.Dropdown(options=samples, description="prompt")
    step = W.SelectionSlider(options=steps, description="step", continuous_update=False)
    layer = W.SelectionSlider(options=layers, description="layer", continuous_update=False)
    head = W.IntSlider(min=0, max=_heads(recs, what) - 1, description="head", continuous_update=False)

    def word_options(s):
        return [(quoted(i, t), i) for i, t in enumerate(tokens[s])]

    word = W.Dropdown(options=word_options(samples[0]), description="word")
    caption, out = W.HTML(), W.Output()

    def draw(*_):
        r = by[sample.value, layer.value, step.value]
        prompt = r.meta.get("prompt")
        title = f"{r.part} · step {r.step} · layer {r.layer} · head {head.value}"
        caption.value = (f"<b>{html_text(title)}</b>" + (f" · prompt: <i>{html_text(prompt)}</i>" if prompt else "")
                         + f" · word: <code>{html_text(quoted(word.value, tokens[sample.value][word.value]))}</code>")
        _show(out, plots.step_panel(r, head.value, images[sample.value], word.value, tokens[sample.value], title))

    def new_sample(change):
        word.options = word_options(change["new"])
        draw()

    sample.observe(new_sample, names="value")
    for w in (step, layer, head, word):
        w.observe(draw, names="value")
    draw()
    panel = W.VBox([W.HBox([sample, word]), W.HBox([step, layer, head]), caption, out])
    panel.caption = caption
    return panel
