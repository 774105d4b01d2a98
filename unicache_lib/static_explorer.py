"""Explorers that work without a kernel: the widgets' pictures for every stop of one slider, precomputed, in one
self-contained piece of HTML (images as ``data:`` URIs, an ``<input type=range>`` that shows one of them, captions
escaped with :func:`html.escape`). A notebook displays one beside its live explorer; in JupyterLab the live widget is
the one to use, on a static page (``make book``) this one redraws as its slider moves.

Each takes the arguments of its :mod:`unicache_lib.widgets` counterpart (the same precomputed maps) and fixes the
other controls at the widget's opening view (first sample, head 0, the query / word the widget opens on):

- :func:`static_attention_explorer`: a layer slider (notebook 02);
- :func:`static_step_explorer`: a step slider at one layer (notebook 03);
- :func:`static_model_explorer`: a layer slider per model (notebook 08).

Size budget: the whole HTML of one explorer stays within ``budget_bytes`` (default :data:`BUDGET_BYTES`, 2 MB); the
frames are drawn at ``dpi`` and, when they do not fit, drawn again at a lower resolution (down to
:data:`MIN_DPI`); an explorer that still does not fit raises :class:`~unicache_lib.core.errors.InputError` naming
its size (pass fewer stops)."""
from __future__ import annotations

import base64
import html
import io
import itertools
import math
from typing import Callable, Sequence

from . import plots
from .analysis.token_classes import content_position
from .capture.record import CaptureResult
from .core.errors import InputError
from .plots import quoted
from .widgets import _full_maps, _heads, _step_maps

BUDGET_BYTES = 2_000_000  # one explorer's HTML, images included
DPI = 80  # the frames' first resolution (the widgets draw at matplotlib's default, 100)
MIN_DPI = 36  # below this the maps' cells are no longer readable: refuse instead
MAX_FRAMES = 64
_ids = itertools.count()

# the range input's handler: show frame i, hide the others, write its label and caption (as text, never markup)
_ONINPUT = ("var r=this.closest('.ucx'),f=r.querySelectorAll('.ucx-frame'),i=+this.value;"
            "for(var k=0;k<f.length;k++){f[k].hidden=k!==i;}"
            "r.querySelector('.ucx-readout').textContent=f[i].getAttribute('data-label');"
            "r.querySelector('.ucx-caption').textContent=f[i].getAttribute('data-caption');")


class StaticExplorer:
    """Self-contained HTML (``.html``) that notebooks display as ``text/html`` (``_repr_html_``); ``nbytes`` its
    size in bytes, ``stops`` the slider's labels."""

    def __init__(self, html_text: str, stops: list[str], what: str):
        self.html, self.stops, self.what = html_text, stops, what

    @property
    def nbytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"<static {self.what}: {len(self.stops)} stops, {self.nbytes / 1e6:.2f} MB>"


def _png(fig, dpi: float) -> bytes:
    import matplotlib.pyplot as plt  # local: matplotlib loads at the first picture, not at import

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def slider_html(frames: Sequence[tuple[str, str, bytes]], label: str, title: str = "",
                budget_bytes: int = BUDGET_BYTES) -> str:
    """One explorer: ``frames`` as ``(stop label, caption, PNG bytes)``, shown one at a time by a range input named
    ``label``; ``title`` above it. All text is escaped. Raises InputError when there is no frame, more than
    :data:`MAX_FRAMES`, or the HTML is larger than ``budget_bytes``."""
    if not frames:
        raise InputError("a static explorer needs at least one frame")
    if len(frames) > MAX_FRAMES:
        raise InputError(f"a static explorer of {len(frames)} frames: at most {MAX_FRAMES} (pass fewer stops)")
    esc = html.escape
    uid = f"ucx-{next(_ids)}"
    first_label, first_caption = frames[0][0], frames[0][1]
    imgs = "\n".join(
        f'<img class="ucx-frame" data-label="{esc(str(lab))}" data-caption="{esc(str(cap))}" alt="{esc(str(cap))}"'
        f'{"" if i == 0 else " hidden"} style="max-width:100%" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        for i, (lab, cap, png) in enumerate(frames))
    out = (f'<div class="ucx" id="{uid}" data-stops="{len(frames)}" style="border:1px solid #ccc;padding:6px;'
           f'margin:4px 0">\n'
           + (f'<div class="ucx-title" style="font-weight:bold">{esc(title)}</div>\n' if title else "")
           + f'<label style="display:block;margin:4px 0">{esc(label)} '
           f'<input type="range" class="ucx-range" min="0" max="{len(frames) - 1}" step="1" value="0" '
           f'aria-label="{esc(label)}" oninput="{esc(_ONINPUT)}"> '
           f'<output class="ucx-readout">{esc(str(first_label))}</output></label>\n'
           f'<div class="ucx-caption" style="font-size:90%">{esc(str(first_caption))}</div>\n'
           f'{imgs}\n</div>')
    size = len(out.encode("utf-8"))
    if size > budget_bytes:
        raise InputError(f"static explorer of {len(frames)} frames is {size / 1e6:.2f} MB, over its budget of "
                         f"{budget_bytes / 1e6:.2f} MB: pass fewer stops")
    return out


def _fit(stops: list, caption: Callable, draw: Callable, label: str, title: str, budget_bytes: int, dpi: float) -> str:
    """Draw every stop at ``dpi``; when the HTML is over budget, draw again at the resolution that fits (PNG size
    goes with the pixel count, so with dpi squared), down to MIN_DPI."""
    while True:
        frames = [(str(s), caption(s), _png(draw(s), dpi)) for s in stops]
        size = sum(len(f[2]) for f in frames) * 4 / 3 + 2000 * len(frames)
        if size <= budget_bytes * 0.97 or dpi <= MIN_DPI:
            return slider_html(frames, label, title, budget_bytes)
        dpi = max(MIN_DPI, math.floor(dpi * math.sqrt(budget_bytes * 0.9 / size)))


def static_attention_explorer(result: CaptureResult, images: dict, tokens: dict, grids: dict | None = None,
                              questions: dict | None = None, *, sample=None, head: int = 0, token: int | None = None,
                              budget_bytes: int = BUDGET_BYTES, dpi: float = DPI) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.attention_explorer`'s picture at every captured layer: a layer slider for one
    ``sample`` (default: the first), ``head`` and query ``token`` (default: the position the widget opens on)."""
    what = "static_attention_explorer"
    recs, by, samples, layers = _full_maps(result, images, tokens, what)
    s = samples[0] if sample is None else sample
    if s not in samples:
        raise InputError(f"{what}: no sample {s!r} (captured: {samples})")
    n_heads = _heads(recs, what)
    if not 0 <= head < n_heads:
        raise InputError(f"{what}: head {head} outside 0..{n_heads - 1}")
    r0 = by[s, layers[0]]
    positions = [int(i) for i in (range(r0.probs.shape[1]) if r0.part == "cross" else r0.spans.text_index)]
    q_pos = content_position(tokens[s], positions) if token is None else int(token)
    if q_pos not in positions:
        raise InputError(f"{what}: token {q_pos} is not a text position of sample {s!r}")
    q = (questions or {}).get(s)
    grid, cells = (grids or {}).get(s, (None, None))

    def title(layer):
        return f"sample {s} · layer {layer} · head {head}"

    def caption(layer):
        return (title(layer) + (f" · question: {q}" if q else "")
                + f" · query token: {quoted(q_pos, tokens[s][q_pos])}")

    def draw(layer):
        rec = by[s, layer]
        return plots.map_panel(rec.probs[head], rec.spans, images[s], q_pos, tokens[s], title(layer),
                               cross=rec.part == "cross", grid=grid, grid_tokens=cells, question=q)

    page = _fit(layers, caption, draw, "layer", f"{recs[0].part} attention, every captured layer (no kernel needed)",
                budget_bytes, dpi)
    return StaticExplorer(page, [str(x) for x in layers], what)


def static_step_explorer(result: CaptureResult, images: dict, tokens: dict, part: str | None = None, *, sample=None,
                         layer: int | None = None, head: int = 0, word: int = 0, budget_bytes: int = BUDGET_BYTES,
                         dpi: float = DPI) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.step_explorer`'s picture at every captured step: a step slider for one
    ``sample`` (default: the first prompt), ``layer`` (default: the last captured), ``head`` and ``word``."""
    what = "static_step_explorer"
    recs, by, samples, layers, steps = _step_maps(result, images, tokens, part, what)
    s = samples[0] if sample is None else sample
    if s not in samples:
        raise InputError(f"{what}: no prompt {s!r} (captured: {samples})")
    lay = layers[-1] if layer is None else layer
    if lay not in layers:
        raise InputError(f"{what}: layer {lay} was not captured (captured: {layers})")
    n_heads = _heads(recs, what)
    if not 0 <= head < n_heads:
        raise InputError(f"{what}: head {head} outside 0..{n_heads - 1}")
    if not 0 <= word < len(tokens[s]):
        raise InputError(f"{what}: word {word} outside the prompt's {len(tokens[s])} tokens")

    def title(step):
        return f"{by[s, lay, step].part} · step {step} · layer {lay} · head {head}"

    def caption(step):
        prompt = by[s, lay, step].meta.get("prompt")
        return title(step) + (f" · prompt: {prompt}" if prompt else "") + f" · word: {quoted(word, tokens[s][word])}"

    def draw(step):
        return plots.step_panel(by[s, lay, step], head, images[s], word, tokens[s], title(step))

    page = _fit(steps, caption, draw, "step", f"every captured step at layer {lay} (no kernel needed)",
                budget_bytes, dpi)
    return StaticExplorer(page, [str(x) for x in steps], what)


def static_model_explorer(per_model: dict, *, head: int = 0, budget_bytes: int = BUDGET_BYTES,
                          dpi: float = DPI) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.model_explorer` without a kernel: one :func:`static_attention_explorer` per
    model (its layer slider), headed by the model's label; the budget is shared equally between the models."""
    if not per_model:
        raise InputError("static_model_explorer needs at least one model's full-mode capture")
    share = budget_bytes // len(per_model)
    parts, stops = [], []
    for label, args in per_model.items():
        ex = static_attention_explorer(*args, head=head, budget_bytes=share, dpi=dpi)
        parts.append(f'<div class="ucx-model"><h4>{html.escape(str(label))}</h4>\n{ex.html}\n</div>')
        stops += [f"{label}: {x}" for x in ex.stops]
    return StaticExplorer('<div class="ucx-models">\n' + "\n".join(parts) + "\n</div>", stops, "static_model_explorer")
