"""One call, one figure. Every function returns the matplotlib ``Figure`` and validates its input.

Widgets (``widgets.py``) only call these functions.
"""
from __future__ import annotations

import functools
import json
import warnings
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from .analysis.layers import band_layers
from .core.errors import InputError
from .core.modality import Spans


def _plt():
    import matplotlib.pyplot as plt  # local: matplotlib (0.6 s) is loaded at the first figure, not by `import unicache_lib.widgets`

    return plt


def _np(x) -> np.ndarray:
    return x.detach().float().cpu().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float32)


@contextmanager
def literal_text():
    """Math text off while figures are made: the one rcParam set and put back by hand, not with ``rc_context``, whose
    exit restores the whole rc (the backend with it), which made the notebooks' inline backend drop every figure made
    inside before the cell could show it."""
    import matplotlib  # local: matplotlib loads at the first figure (see _plt)

    old = matplotlib.rcParams["text.parse_math"]
    matplotlib.rcParams["text.parse_math"] = False
    try:
        yield
    finally:
        matplotlib.rcParams["text.parse_math"] = old


def _plain_log_ticks(fig) -> None:
    """A log axis labels its ticks in math text (``$\\mathdefault{10^{2}}$``), which literal text would show raw: label
    them as plain numbers (``100``, ``0.01``) instead, the minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter  # local: matplotlib loads at the first figure

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if isinstance(axis.get_major_formatter(), LogFormatter):
                axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())


def _literal_text(fn):
    """Every text of the figure ``fn`` returns drawn as typed (math text off): a label, token or question from your
    data holding ``$`` shows its dollars instead of failing the figure (``$\\frac{$``) or turning into math."""
    @functools.wraps(fn)
    def drawn(*args, **kwargs):
        with literal_text():  # texts made (and laid out) inside: literal
            out = fn(*args, **kwargs)
        from matplotlib.figure import Figure  # local: matplotlib loads at the first figure (see _plt)
        from matplotlib.text import Text  # local: matplotlib loads at the first figure (see _plt)

        if isinstance(out, Figure):  # and those drawn later (a notebook's savefig) too
            for t in out.findobj(Text):
                t.set_parse_math(False)
            _plain_log_ticks(out)
        return out

    return drawn



def _axes(ax, figsize):
    """``(figure, ax)``: a new figure of ``figsize`` when ``ax`` is None, else ``(None, ax)`` (the caller returns
    ``fig or ax.figure``)."""
    return _plt().subplots(figsize=figsize) if ax is None else (None, ax)


def _finish(fig, title: str = "", fontsize: int = 10, ax=None):
    """``fig`` with ``title`` over it (when there is one), laid out; ``ax.figure`` as it is when ``fig`` is None (the
    caller's axes, see :func:`_axes`)."""
    if fig is None:
        return ax.figure
    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    return fig


SPAN_COLOUR = "red"  # image/text boundaries on every map (legend entry: what the line marks)


def _colorbar(ax, im, label: str):
    """A colour bar beside ``ax`` for ``im``, labelled with the quantity and its unit (or scale)."""
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cb.set_label(label, fontsize=8)
    cb.ax.tick_params(labelsize=7)
    return cb


def _heatmap(ax, values, title: str, xlabel: str, ylabel: str, cbar: str | None = None, ticks: bool = True,
             fontsize: int = 9, **imshow):
    """``values`` drawn on ``ax`` (nearest cells), its axes labelled and titled, whole-number ticks with ``ticks`` and a
    colour bar labelled ``cbar`` (None: none); returns the image."""
    im = ax.imshow(values, interpolation="nearest", **imshow)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=fontsize)
    if ticks:  # whole-number ticks on position / layer axes (no 2.5th token)
        from matplotlib.ticker import MaxNLocator  # local: matplotlib loads at the first figure (see _plt)

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
    if cbar:
        _colorbar(ax, im, cbar)
    return im


def _span_legend(ax):
    """The legend of a map's span lines in a row of its own above the axes (the title raised over it),
    so it covers neither the data, the axis labels nor the title."""
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, frameon=False, handlelength=1.2,
              borderaxespad=0.0, borderpad=0.2, ncol=2)
    ax.set_title(ax.get_title(), fontsize=9, pad=17)


def _weight_label(log: bool) -> str:
    return "log10(attention weight)" if log else "attention weight"


def quoted(pos: int, token: str) -> str:
    """``74 ':'``: a position and its token, quoted so punctuation and spaces stay readable."""
    return f"{pos} {token!r}"


def _mean_bands(ax, values: dict, axis_name: str, marker: str, x=None) -> int | None:
    """Plot each ``[n_samples, n]`` array of ``values`` as its mean over samples with a +-1 s.d. band,
    at positions ``x`` (default ``0..n-1``); returns ``n`` (None for no values). NaN entries are skipped
    (an all-NaN column, e.g. step 0 of an adjacent-step similarity, gives a gap), and the label's ``n`` counts the
    samples a point is a mean over ("n=1 of 2" where one sample is NaN there)."""
    n = None
    for name, v in values.items():
        v = _np(v)
        if v.ndim != 2:
            raise InputError(f"{name}: expected [n_samples, {axis_name}], got shape {v.shape}")
        n = v.shape[1]
        if x is not None and len(x) != n:
            raise InputError(f"{name}: {n} columns for {len(x)} positions")
        x = np.arange(n) if x is None else np.asarray(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m, s = np.nanmean(v, 0), np.nanstd(v, 0)
        k = np.isfinite(v).sum(0)  # the samples each point is a mean over: a sample NaN there is not counted
        lo, hi = (int(k[k > 0].min()), int(k.max())) if k.any() else (0, 0)
        counted = f"{v.shape[0]}" if lo == v.shape[0] else f"{lo}{'' if lo == hi else f'–{hi}'} of {v.shape[0]}"
        ax.plot(x, m, marker=marker, label=f"{name} (n={counted})")
        ax.fill_between(x, m - s, m + s, alpha=0.2)
    return n


@_literal_text
def layer_curves(values: dict[str, np.ndarray], title: str = "", ylabel: str = "", layers=None,
                 n_layers: int | None = None):
    """Per-layer curves with spread. ``values``: name -> ``[n_samples, n]``; the line is the mean over
    samples, the shaded band +-1 standard deviation; shallow/middle/deep bands marked.

    ``layers``: the layer index of each column (a subset such as ``[0, 15, 31]``, or a cross-attention
    VLM's cross layers ``[3, 8, ...]``; default ``0..n-1``); ``n_layers``: the model's depth, for the bands.
    """
    fig, ax = _plt().subplots(figsize=(6, 3.2))
    n = _mean_bands(ax, values, "n_layers", "o", layers)
    x = list(range(n)) if (layers is None and n) else list(layers or [])
    if n:
        for i, (lab, ls) in enumerate(band_layers(n_layers or max(x) + 1).items()):
            if (inside := [li for li in x if li in ls]):
                ax.axvspan(inside[0] - 0.5, inside[-1] + 0.5, color=f"C{i}", alpha=0.05)
                ax.text((inside[0] + inside[-1]) / 2, 1.0, lab, transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=8)
    if x and len(x) <= 40:
        ax.set_xticks(x, [str(li) for li in x], fontsize=7 if len(x) > 16 else None)
    ax.set(xlabel="layer", ylabel=ylabel)
    ax.set_title(title, pad=14)
    ax.legend(fontsize=8)
    return _finish(fig)


@_literal_text
def attention_map(probs, spans: Spans | None = None, title: str = "", log: bool = True, ax=None,
                  cbar: bool = True):
    """One head's map ``probs [Sq, Sk]`` with a colour bar; the image keys (one block in ``spans``,
    which covers ``Sk``) are outlined and named in a legend."""
    P = _np(probs)
    if P.ndim != 2:
        raise InputError(f"attention_map expects one head's map [Sq, Sk], got shape {P.shape}: pick a head first")
    fig, ax = _axes(ax, (4.6, 4))
    _heatmap(ax, np.log10(P + 1e-6) if log else P, title, "key position", "query position",
             _weight_label(log) if cbar else None, cmap="viridis", aspect="auto")
    if (block := _image_block(spans, P.shape[-1])):
        ax.axvspan(block[0] - 0.5, block[1] - 0.5, fill=False, edgecolor=SPAN_COLOUR, lw=1, label="image keys")
        _span_legend(ax)
    return fig or ax.figure


@_literal_text
def bars(values: dict[str, float], title: str = "", ylabel: str = "", log: bool = False):
    fig, ax = _plt().subplots(figsize=(5, 3))
    names = list(values)
    ax.bar_label(ax.bar(names, [values[n] for n in names], color=[f"C{i}" for i in range(len(names))]), fmt="{:.3g}",
                 fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set(ylabel=ylabel, title=title)
    return _finish(fig)


def _image_block(spans: Spans | None, n: int) -> tuple[int, int] | None:
    """``(start, end)`` of the image tokens when they are one block (to mark on a figure), else None."""
    if spans is None:
        return None
    spans.check(n, "figure's key axis")
    idx = spans.image_index
    return None if len(idx) == 0 or idx[-1] - idx[0] + 1 != len(idx) else (int(idx[0]), int(idx[-1]) + 1)


def save(fig, out_dir: str | Path, name: str) -> Path:
    """Save ``fig`` as ``out_dir/name.png`` (directory created) and return the path; what its colour-mapped panels show
    (:func:`figure_facts`) goes beside it as ``name.facts.json``, which the tests read (a lesson's first figure:
    compared panels on one scale, chance marked, something above it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{name}.png"
    fig.savefig(p, dpi=110, bbox_inches="tight")
    (out / f"{name}.facts.json").write_text(json.dumps(figure_facts(fig), indent=1))
    return p


def figure_facts(fig) -> dict:
    """What the compared panels of ``fig`` show: its attention overlays (:func:`image_overlay`) where it has any, else
    every colour-mapped panel (pictures in RGB left out). ``panels`` (how many), ``clims`` (each panel's colour scale),
    ``shared`` (one scale for all), ``peak`` (the largest value drawn), ``overlays`` (how many), ``chance`` (the
    even-reading level marked on each overlay's colour bar, None where none is), ``units`` (their colour bars'
    labels), ``titles`` (each picture panel's title and the line under it, which a lesson's first figure reads
    itself out with: an answer right or wrong, a PSNR) and ``curves`` (each line chart's labelled lines, e.g. the
    methods compared with ``random``)."""
    panels = [im for ax in fig.axes for im in ax.images if np.ndim(im.get_array()) == 2]
    overlays = [im for im in panels if hasattr(im, "unicache_overlay")]
    panels = overlays or panels  # the compared panels: the overlays where there are any (a matrix beside them is not one)
    clims = [[float(v) for v in im.get_clim()] for im in panels]
    peak = max((float(np.nanmax(np.asarray(im.get_array(), dtype=float))) for im in panels), default=float("nan"))
    return {"panels": len(panels), "clims": clims, "shared": len({tuple(c) for c in clims}) <= 1, "peak": peak,
            "overlays": len(overlays), "chance": [im.unicache_overlay["chance"] for im in overlays],
            "units": sorted({str(im.unicache_overlay["unit"]) for im in overlays}),
            "titles": [" | ".join(t for t in (ax.get_title(), ax.get_xlabel()) if t) for ax in fig.axes if ax.images],
            "curves": [labels for ax in fig.axes if (labels := [ln.get_label() for ln in ax.get_lines()
                                                                 if not ln.get_label().startswith("_")])]}


@_literal_text
def read_frequency_heatmap(reads, spans: Spans | None = None, title: str = "KV read frequency", log: bool = True,
                           quantity: str = "normalised read frequency", layers=None):
    """``reads [n_layers, S]`` (e.g. normalised read frequency, mean over heads) as a layer x position
    heatmap, coloured by ``quantity`` (log10 with ``log``); the image block (``spans`` over ``S``) is
    marked by two lines named in a legend. ``layers``: the layer number of each row (a subset such as
    ``[0, 15, 31]``; default ``0..n_layers-1``). Anchors show up as vertical bands."""
    R = _np(reads)
    if R.ndim != 2:
        raise InputError(f"expected [n_layers, seq], got shape {R.shape}")
    fig, ax = _plt().subplots(figsize=(7, 2.8))
    _heatmap(ax, np.log10(R + 1e-6) if log else R, title, "key position", "layer",
             f"log10({quantity})" if log else quantity, aspect="auto", cmap="magma")
    if layers is not None:
        if len(layers) != R.shape[0]:
            raise InputError(f"{len(layers)} layer numbers for {R.shape[0]} rows")
        ax.set_yticks(range(len(layers)), [str(li) for li in layers])
    if (block := _image_block(spans, R.shape[1])):
        ax.axvline(block[0] - 0.5, color="c", lw=1, label="image block")
        ax.axvline(block[1] - 0.5, color="c", lw=1)
        _span_legend(ax)
    return _finish(fig)


@_literal_text
def per_layer_boxes(values, title: str = "", ylabel: str = ""):
    """``values [n_layers, n]`` (e.g. per-head cross-modal share): one box per layer."""
    V = _np(values)
    if V.ndim != 2:
        raise InputError(f"expected [n_layers, n], got shape {V.shape}")
    fig, ax = _plt().subplots(figsize=(5, 3))
    ax.boxplot([v[~np.isnan(v)] for v in V], positions=np.arange(len(V)))
    ax.set(xlabel="layer", ylabel=ylabel)
    ax.set_title(title, fontsize=9)
    return _finish(fig)


@_literal_text
def image_overlay(image, weights, title: str = "", ax=None, alpha: float = 0.6, grid=None, grid_tokens=None,
                  cbar: str | None = "attention weight", vmin: float | None = None, vmax: float | None = None,
                  chance: float | None = None):
    """A token's attention over the image tokens (``weights [n_image]``) upsampled over ``image [H, W, 3]``,
    with a colour bar labelled ``cbar`` (None: no colour bar).

    ``grid``: ``(rows, cols)`` of the image tokens over the picture (default: a square grid of all of
    them); ``grid_tokens``: which of the weights form that grid (e.g. one tile without its class token).
    ``vmin`` / ``vmax``: a fixed colour scale (e.g. shared by several panels); ``chance``: the weight a key would get
    if the query read evenly, marked on the colour bar, so a near-uniform map does not look hot.
    """
    w = _np(weights).ravel()
    if grid_tokens is not None:
        w = w[np.asarray(grid_tokens)]
    if grid is None:
        g = int(round(len(w) ** 0.5))
        if g * g != len(w):
            raise InputError(f"{len(w)} image-token weights do not form a square grid: pass grid=(rows, cols)")
        grid = (g, g)
    rows, cols = grid
    if rows * cols != len(w):
        raise InputError(f"{len(w)} image-token weights for a {rows} x {cols} grid")
    img = np.asarray(image)
    if chance is not None:  # the scale always reaches even reading: a map that never does looks dark, as it should
        vmax = max(float(w.max()) if vmax is None else vmax, chance)
    fig, ax = _axes(ax, (3.6, 3))
    ax.imshow(img)
    im = ax.imshow(w.reshape(rows, cols), cmap="inferno", alpha=alpha, extent=(0, img.shape[1], img.shape[0], 0),
                   interpolation="nearest", vmin=vmin, vmax=vmax)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    im.unicache_overlay = {"chance": chance if cbar else None, "unit": cbar}  # read back by figure_facts
    if cbar:
        cb = _colorbar(ax, im, cbar)
        if chance is not None and cb is not None:
            cb.ax.axhline(chance, color="cyan", lw=1.5)
            cb.ax.text(1.05, chance, "even", transform=cb.ax.get_yaxis_transform(), fontsize=6, color="k", va="bottom")
    return fig or ax.figure


@_literal_text
def layer_overlays(image, maps: dict, title: str = "", grid=None, grid_tokens=None, label: str = "layer",
                   uniform: bool = False):
    """The picture, then one panel per layer with a query's attention laid over it.

    ``image [H, W, 3]``; ``maps``: layer -> ``[n_image]`` weights (e.g.
    :func:`unicache_lib.analysis.localisation.query_over_image`). ``uniform``: the weights are in multiples of the
    uniform weight (``query_over_image(..., uniform=True)``): every panel then shares one colour scale from 0, with
    even reading (1) marked on it, so panels compare by brightness too; otherwise each panel has its own scale
    (labelled). ``grid`` / ``grid_tokens`` as in :func:`image_overlay`."""
    if not maps:
        raise InputError("layer_overlays needs at least one layer's weights")
    fig, axes = _picture_row(image, "the picture", len(maps), (2.7, 2.6), 9)
    top = max(float(np.max(_np(w))) for w in maps.values())
    for ax, (li, w) in zip(axes[1:], maps.items()):
        peak = float(np.max(_np(w)))
        if uniform:
            image_overlay(image, w, f"{label} {li} (peak {peak:.1f}×)", ax=ax, grid=grid, grid_tokens=grid_tokens,
                          cbar="× uniform (shared scale)", vmin=0.0, vmax=max(top, 1.0), chance=1.0)
        else:
            image_overlay(image, w, f"{label} {li} (max {peak:.2f})", ax=ax, grid=grid,
                          grid_tokens=grid_tokens, cbar="weight (own scale)")
    return _finish(fig, title)


@_literal_text
def blocked_map(probs, spans: Spans, title: str = "image first, then text", ax=None, log: bool = True):
    """One head's map ``probs [S, S]`` (``spans`` over ``S``) with positions regrouped image-first,
    text-second, so the four modality blocks are contiguous; the image|text border is drawn and named
    in a legend; colour bar of the (log10) weight."""
    P = _np(probs)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise InputError(f"blocked_map expects one head's square map [S, S], got shape {P.shape}")
    spans.check(P.shape[0])
    order = np.concatenate([spans.image_index, spans.text_index])
    fig, ax = _axes(ax, (4.6, 4))
    Q = P[np.ix_(order, order)]
    _heatmap(ax, np.log10(Q + 1e-6) if log else Q, title, "keys: image | text", "queries: image | text",
             _weight_label(log), cmap="viridis")
    n = spans.n_image - 0.5
    ax.axhline(n, color=SPAN_COLOUR, lw=1, label="image | text border")
    ax.axvline(n, color=SPAN_COLOUR, lw=1)
    _span_legend(ax)
    return fig or ax.figure


@_literal_text
def map_panel(probs, spans: Spans, image, token_pos: int, tokens: list[str] | None = None, title: str = "",
              cross: bool = False, grid=None, grid_tokens=None, question: str | None = None):
    """Views of one head: raw map, modality-blocked map (self-attention only), and the chosen query
    token's attention over the image in multiples of the uniform weight (1 = what the row would give every key it
    can see if it read evenly, so a near-uniform row does not look hot and a faint one does not look empty), each
    with a colour bar. ``probs [S, S]`` (``[T, V]`` text queries
    over vision tokens with ``cross``); ``spans`` over ``S``; ``token_pos`` indexes the text sequence,
    ``tokens`` its strings; ``title`` (e.g. sample, layer, head) and ``question`` head the figure;
    ``grid`` / ``grid_tokens`` as in :func:`image_overlay`."""
    P = _np(probs)
    if not 0 <= token_pos < P.shape[0]:
        raise InputError(f"token_pos {token_pos} outside the sequence of {P.shape[0]}")
    fig, axes = _plt().subplots(1, 2 if cross else 3, figsize=(9 if cross else 14, 4.2))
    query = quoted(token_pos, tokens[token_pos]) if tokens else str(token_pos)
    if cross:
        attention_map(P, None, "cross-attention: text queries x vision keys", ax=axes[0])
        axes[0].set(xlabel="key: vision token", ylabel="query: text position")
        pick = P[token_pos]
    else:
        attention_map(P, spans, "all positions, in sequence order", ax=axes[0])
        blocked_map(P, spans, "regrouped: image first, then text", ax=axes[1])
        pick = P[token_pos, spans.image_index]
    visible = P.shape[1] if cross else token_pos + 1  # keys the query row can see (causal self-attention)
    image_overlay(image, pick * visible, f"query token {query} reading the image", ax=axes[-1], grid=grid,
                  grid_tokens=grid_tokens, cbar="× uniform (1 = even over the visible keys)", vmin=0.0, chance=1.0)
    return _finish(fig, " · ".join(t for t in (title, f"question: {question!r}" if question else "") if t))


@_literal_text
def step_curves(values: dict[str, np.ndarray], title: str = "", ylabel: str = "", threshold: float | None = None,
                ax=None):
    """Per-step curves with spread and the study's phases shaded (early 0-20%, middle 20-60%, late).

    ``values``: name -> ``[n_samples, n_steps]`` (NaN allowed, e.g. step 0 of a similarity); line =
    mean over samples, band = +-1 standard deviation. ``threshold`` draws a horizontal line.
    """
    fig, ax = _axes(ax, (6, 3.2))
    n_steps = _mean_bands(ax, values, "n_steps", ".")
    if n_steps:
        for i, (lab, lo, hi) in enumerate((("early", 0, 0.2), ("middle", 0.2, 0.6), ("late", 0.6, 1.0))):
            ax.axvspan(lo * n_steps - 0.5, hi * n_steps - 0.5, color=f"C{i}", alpha=0.05)
            ax.text((lo + hi) / 2 * n_steps - 0.5, 1.0, lab, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=8)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=0.8)
    ax.set(xlabel="denoising step", ylabel=ylabel)
    ax.set_title(title, pad=14, fontsize=10)
    ax.legend(fontsize=7)
    return _finish(fig, ax=ax)


@_literal_text
def layer_step_grid(grid, title: str = "", cbar: str = "", ax=None, vmin=None, vmax=None, layers=None):
    """``grid [n_layers, n_steps]`` as a heatmap (layer rows, step columns) with a colour bar labelled
    ``cbar``; ``layers``: the layer number of each row (a subset such as ``[0, 11, 23]``; default 0..)."""
    G = _np(grid)
    if G.ndim != 2:
        raise InputError(f"expected [n_layers, n_steps], got shape {G.shape}")
    fig, ax = _axes(ax, (6, 0.5 * G.shape[0] + 1.5))
    im = _heatmap(ax, G, title, "denoising step", "layer", ticks=False, aspect="auto", cmap="viridis", vmin=vmin,
                  vmax=vmax)
    if layers is not None and len(layers) != G.shape[0]:
        raise InputError(f"{len(layers)} layer numbers for {G.shape[0]} rows")
    ax.set_yticks(range(G.shape[0]), [str(li) for li in (range(G.shape[0]) if layers is None else layers)])
    ax.figure.colorbar(im, ax=ax, fraction=0.04, label=cbar)
    return _finish(fig, ax=ax)


def _picture_row(image, title: str, n_panels: int, panel_size: tuple[float, float], fontsize: int):
    """A figure of ``1 + n_panels`` axes in a row, the first showing ``image [H, W, 3]`` under ``title``."""
    fig, (axes,) = _plt().subplots(1, n_panels + 1, figsize=(panel_size[0] * (n_panels + 1), panel_size[1]), squeeze=False)
    axes[0].imshow(np.asarray(image))
    axes[0].set_axis_off()
    axes[0].set_title(title, fontsize=fontsize)
    return fig, axes


@_literal_text
def word_regions(image, maps: dict[str, np.ndarray], title: str = "", chance: float | None = None,
                 keys: int | None = None):
    """The generated ``image [H, W, 3]`` next to each word's attention over the image patches
    (``maps``: word -> ``[n_image]`` weights on a square grid), all on one colour scale from 0 to the largest weight
    (so a word whose map is nearly flat looks flat, not hot); ``chance``: the even-reading level, marked on each
    colour bar. ``keys``: how many keys an image query reads (its even share is ``1 / keys``): the maps are then
    shown in multiples of that share (× uniform, the unit of every lesson), chance 1 marked and on the scale."""
    fig, axes = _picture_row(image, "generated", len(maps), (2.6, 2.4), 8)
    unit = "attention weight (shared scale)"
    if keys is not None:
        maps, chance, unit = {w: _np(m) * keys for w, m in maps.items()}, 1.0, "× uniform (shared scale)"
    top = max(float(_np(m).max()) for m in maps.values()) if maps else 1.0
    top = max(top, chance) if chance is not None else top
    for ax, (w, m) in zip(axes[1:], maps.items()):
        image_overlay(image, m, repr(w), ax=ax, cbar=unit, vmin=0.0, vmax=top, chance=chance)
    fig.suptitle(title, fontsize=9)  # even an empty one: it keeps the row's layout
    return _finish(fig)


MARKERS = "ovs^D<>ph*Xd8P"


def line_styles(names) -> dict[str, dict]:
    """name -> ``{"color", "marker"}``, distinct for every name (tab20 colours, then the markers cycle
    too), in the order given; pass ``**styles[name]`` to ``ax.plot`` so one name looks the same on
    every panel of a figure."""
    colours = _plt().get_cmap("tab20").colors
    names = list(dict.fromkeys(names))
    if len(names) > len(colours) * len(MARKERS):
        raise InputError(f"{len(names)} lines are too many to tell apart: plot fewer per figure")
    return {n: {"color": colours[i % len(colours)], "marker": MARKERS[i % len(MARKERS)]} for i, n in enumerate(names)}


@_literal_text
def shared_legend(fig, axes, ncol: int = 4, fontsize: int = 7):
    """One legend for all ``axes`` of ``fig`` (each label once, first occurrence wins), under the figure
    (call after ``tight_layout``; :func:`save` and notebooks' inline display crop to include it)."""
    handles = {}
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if not handles:
        raise InputError("shared_legend: no labelled lines on these axes (pass label= to ax.plot)")
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=ncol, fontsize=fontsize,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


@_literal_text
def step_panel(rec, head: int, image, word: int, tokens: list[str], title: str = ""):
    """One diffusion record's head next to a word's attention over the generated image.

    ``rec``: a full-mode record, ``probs [H, Sq, Sk]`` (joint: ``[image | text]`` both ways, or
    ``[text | image]`` with meta ``token_order``; cross: image queries x text keys) with meta
    ``n_image``, ``n_text``; ``image [H, W, 3]``; ``word`` indexes ``tokens`` (the real text tokens).
    """
    P = _np(rec.probs[head])
    n_img, joint = rec.meta["n_image"], rec.part == "joint"
    text_first = joint and rec.meta.get("token_order", "image|text").startswith("text")  # Flux: [text | image]
    img0 = rec.meta["n_text"] if text_first else 0  # first image row / column
    col = (0 if text_first else n_img) + word if joint else word
    fig, axes = _plt().subplots(1, 2, figsize=(9.5, 4))
    attention_map(P, None, f"{rec.part} attention" + (": image and text" if joint else ": image queries x text keys"),
                  ax=axes[0])
    if joint:
        cut = (rec.meta["n_text"] if text_first else n_img) - 0.5
        axes[0].axvline(cut, color=SPAN_COLOUR, lw=1, label="text | image border" if text_first else "image | text border")
        axes[0].axhline(cut, color=SPAN_COLOUR, lw=1)
        _span_legend(axes[0])
    else:
        axes[0].set(xlabel="key: text token", ylabel="query: image token")
    # × uniform: each image query's weight on the word over what an even read of its P.shape[1] visible keys gives
    image_overlay(image, P[img0:img0 + n_img, col] * P.shape[1], f"image reading word {quoted(word, tokens[word])}",
                  ax=axes[1], cbar="× uniform (1 = even over the visible keys)", vmin=0.0, chance=1.0)
    return _finish(fig, title)


@_literal_text
def grid_panels(grids: dict, xlabel: str, ylabel: str, cbar: str, shared: bool = False):
    """One heatmap per entry of ``grids`` (name -> ``[rows, cols]``, e.g. a scorer's ``[n_layers, n_heads]``
    head scores), side by side, each with a colour bar labelled ``cbar``: on one shared colour scale with
    ``shared``, else each on its own scale (and ``cbar`` is suffixed "(per-panel scale)")."""
    G = {n: _np(g) for n, g in grids.items()}
    bad = {n: g.shape for n, g in G.items() if g.ndim != 2}
    if not G or bad:
        raise InputError(f"grid_panels expects name -> [rows, cols] grids, got shapes {bad or 'none'}")
    lo, hi = (min(np.nanmin(g) for g in G.values()), max(np.nanmax(g) for g in G.values())) if shared else (None, None)
    fig, axes = _plt().subplots(1, len(G), figsize=(2.9 * len(G), 2.8), squeeze=False)
    for ax, (n, g) in zip(axes[0], G.items()):
        _heatmap(ax, g, n, xlabel, ylabel, cbar if shared else f"{cbar} (per-panel scale)", fontsize=8, cmap="viridis",
                 aspect="auto", vmin=lo, vmax=hi)
    return _finish(fig)


LAYOUT_COLOURS = {"image->image": "#f4a261", "image->text": "#264653", "text->image": "#e76f51", "text->text": "#2a9d8f"}


@_literal_text
def attention_layouts(layouts: dict, title: str = "who can read whom: query rows x key columns"):
    """One small panel per architecture: which queries (rows) may read which keys (columns), coloured by
    the modality pair (``X->Y``: queries of X reading keys of Y; white: masked). ``layouts``: name ->
    ``(query kinds, key kinds, allowed [n_q, n_k] bool)`` with kinds ``"I"``/``"T"`` per position, e.g.
    :func:`unicache_lib.analysis.architectures.layout_masks`."""
    from matplotlib.colors import ListedColormap  # local: matplotlib loads at the first figure (see _plt)
    from matplotlib.patches import Patch  # local: matplotlib loads at the first figure (see _plt)

    names = list(LAYOUT_COLOURS)
    cmap = ListedColormap(["white"] + [LAYOUT_COLOURS[n] for n in names])
    fig, axes = _plt().subplots(1, len(layouts), figsize=(2.1 * len(layouts), 2.9))
    for ax, (name, (q, k, allowed)) in zip(np.atleast_1d(axes), layouts.items()):
        # 1 + the pair's place in LAYOUT_COLOURS (image->image, image->text, text->image, text->text); 0: masked
        code = np.where(allowed, 1 + 2 * (np.array(list(q)) != "I")[:, None] + (np.array(list(k)) != "I")[None, :], 0)
        ax.imshow(code, cmap=cmap, vmin=0, vmax=len(names), interpolation="nearest")
        ax.set_xticks(range(len(k)), ["img" if a == "I" else "txt" for a in k], fontsize=5, rotation=90)
        ax.set_yticks(range(len(q)), ["img" if a == "I" else "txt" for a in q], fontsize=5)
        ax.set_xticks(np.arange(-0.5, len(k)), minor=True)
        ax.set_yticks(np.arange(-0.5, len(q)), minor=True)
        ax.grid(which="minor", color="0.85", linewidth=0.5)
        ax.tick_params(which="both", length=0)
        ax.set_title(name.replace(": ", "\n"), fontsize=8)
    np.atleast_1d(axes)[0].set(xlabel="key", ylabel="query")
    fig.legend(handles=[Patch(color=LAYOUT_COLOURS[n], label=n) for n in names] + [Patch(facecolor="white",
               edgecolor="0.7", label="masked")], loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# One colour per method across the whole workbook: the same method looks the same in every figure of every notebook.
# The designed policies (key_coverage, step_skip) are always DESIGNED_COLOUR and drawn thick; references black;
# controls grey. A name not listed gets a colour fixed by its name (not by its position in a figure).
DESIGNED_COLOUR = "#d62728"
METHOD_COLOURS = {
    "key_coverage": DESIGNED_COLOUR, "step_skip": DESIGNED_COLOUR, "step_skip (stride 2)": "#ff9896",
    "full": "black", "none": "black", "random": "#7f7f7f", "oracle": "#17becf", "steps": "#555555",
    "divprune": "#1f77b4", "h2o": "#ff7f0e", "snapkv": "#2ca02c", "fastv": "#9467bd", "streaming": "#8c564b",
    "unicache": "#e377c2", "unicache_swapped": "#f7b6d2",
    "pooling": "#8c6d31", "downsample": "#bd9e39", "divprune_keys": "#9ecae1", "key_coverage_features": "#fc9272",  # control and ablations
    "key_coverage_prefill": "#a50f15",
    # the merging variant and its depth schedules (05 §8): indigo / olive, never the designed red or oracle's cyan
    "key_coverage_merge": "#393b79", "key_coverage_merge@profile": "#6b6ecf", "key_coverage_merge@keep_then_drop": "#9c9ede",
    "key_coverage_merge@pyramid": "#637939", "kvpress:pyramidkv": "#b5cf6b",
    "kvpress:expected_attention": "#bcbd22", "kvpress:observed_attention": "#dbdb8d", "kvpress:snapkv": "#98df8a",
    "kvpress:tova": "#c5b0d5", "kvpress:knorm": "#c49c94", "kvpress:streaming": "#c7c7c7",
    "diffusers:pab": "#aec7e8", "diffusers:fastercache": "#ffbb78", "diffusers:first_block": "#1f77b4",
    "diffusers:taylorseer": "#9467bd", "diffusers:magcache": "#2ca02c",
    "adaptive": "#e377c2", "every_2": "#8c564b", "static_last_third": "#17becf", "text_side": "#bcbd22",
    # head scorers (notebook 04)
    "attention_combined": "#1f77b4", "gradient": "#2ca02c", "high_entropy": "#ff7f0e", "low_variance": "#e377c2",
    "weight_norm": "#8c564b", "redundancy": "#17becf",
}
DESIGNED = ("key_coverage", "step_skip")
MAX_METHODS = 6  # methods per chart; the rest go in tables


def method_style(name: str) -> dict:
    """``{"color", "marker", "lw"}`` for a method, the same in every figure of the workbook: :data:`METHOD_COLOURS`
    (fewer-step controls ``steps:N`` share one grey; a press labelled with a note, e.g. ``kvpress:adakv_snapkv (masked,
    full memory)``, is looked up without it), else a tab10 colour (never the controls' grey) chosen from the name's
    checksum. The designed policies are thick."""
    base = str(name).split(" (")[0] if str(name) not in METHOD_COLOURS else str(name)
    key = "steps" if base.startswith("steps:") else base
    colour = METHOD_COLOURS[key] if key in METHOD_COLOURS else [  # tab10 without its grey: grey is the controls'
        c for i, c in enumerate(_plt().get_cmap("tab10").colors) if i != 7][zlib.crc32(key.encode()) % 9]
    designed = base.split(" (")[0] in DESIGNED  # step_skip (stride 2) too, not the ablation key_coverage_features
    return {"color": colour, "marker": "*" if designed else MARKERS[zlib.crc32(key.encode()) % len(MARKERS)],
            "lw": 2.5 if designed else 1.2}


def check_methods(names, limit: int = MAX_METHODS) -> list:
    """The methods of one chart, refused beyond ``limit`` (a chart of 18 lines teaches nothing: plot the few
    that decide, put the rest in a table)."""
    names = list(dict.fromkeys(names))
    if len(names) > limit:
        raise InputError(f"{len(names)} methods on one chart ({', '.join(map(str, names))}); at most {limit}: "
                         "plot the ones the lesson compares and give the rest as a table")
    return names


def _framed(ax, colour) -> None:
    """A picture panel framed in its method's ``colour``, without ticks."""
    ax.set(xticks=[], yticks=[])
    _plt().setp(list(ax.spines.values()), edgecolor=colour, linewidth=3)


@_literal_text
def kept_patches(image, kept: dict, answers: dict | None = None, title: str = "", grid=None):
    """What each eviction policy keeps of one image: one panel per policy, the picture dimmed where the policy
    dropped a patch and shown where it kept it. ``kept``: name -> ``[n_patches]`` share of the image-KV layers
    that keep each patch (1: every layer; a prefill-stage policy keeps the same patches in all), in row-major
    grid order; ``answers``: name -> the answer given on that cache (shown under the panel); ``grid``: ``(rows,
    cols)`` (default square)."""
    if not kept:
        raise InputError("kept_patches: no policy given")
    img = np.asarray(image).astype(np.float32) / (255.0 if np.asarray(image).dtype == np.uint8 else 1.0)
    fig, axes = _picture_row(img, "the image", len(kept), (2.6, 2.9), 9)
    for ax, (name, share) in zip(axes[1:], kept.items()):
        s = _np(share).ravel()
        rows, cols = grid or (int(round(len(s) ** 0.5)),) * 2
        if rows * cols != len(s):
            raise InputError(f"{name}: {len(s)} patch shares for a {rows} x {cols} grid: pass grid=(rows, cols)")
        H, W = img.shape[:2]  # pixel row y lies in patch row y * rows // H (so each patch covers its own block)
        up = s.reshape(rows, cols)[np.arange(H) * rows // H][:, np.arange(W) * cols // W, None]
        ax.imshow(img * (0.15 + 0.85 * up))  # dropped patches dark, kept ones as they are
        c = method_style(name)["color"]
        _framed(ax, c)
        ax.set_title(name, fontsize=9, color=c)
        if answers and name in answers:
            ax.set_xlabel(answers[name], fontsize=8)
    return _finish(fig, title)


@_literal_text
def reuse_gallery(images: dict, psnrs: dict, schedules: dict, steps: int, title: str = ""):
    """Images of one prompt under each reuse method side by side (PSNR vs the uncached image in the title), and
    under each a strip of the ``steps`` denoising steps: dark where the transformer ran, light where its output was
    reused or predicted. ``schedules``: name -> booleans, one per step the method samples (``steps`` of them, or
    fewer for the fewer-step control, drawn stretched over the same width: a coarser grid), or None when the
    method decides inside a step (a strip would mislead; "decided per block" is written instead)."""
    if not images:
        raise InputError("reuse_gallery: no image given")
    n = len(images)
    fig, axes = _plt().subplots(2, n, figsize=(2.5 * n, 3.3), gridspec_kw={"height_ratios": [8, 1]}, squeeze=False)
    for ax, s, (name, im) in zip(axes[0], axes[1], images.items()):
        c = method_style(name)["color"]
        ax.imshow(np.asarray(im))
        _framed(ax, c)
        p = psnrs.get(name)
        label = "uncached (reference)" if name == "none" else "identical" if p is not None and p >= 100 else (
            "" if p is None else f"{p:.1f} dB")
        ax.set_title(f"{name}\n{label}", fontsize=8, color=c)
        sched = schedules.get(name)
        s.set(xticks=[], yticks=[])
        if sched is None:
            s.text(0.5, 0.5, "decided per block", ha="center", va="center", fontsize=7, transform=s.transAxes)
            continue
        sched = np.asarray(sched, dtype=float)
        s.imshow(sched[None, :], cmap="Greys", vmin=-0.3, vmax=1, aspect="auto", extent=(0, steps, 0, 1))
        s.set_xlim(0, steps)
        s.set_xlabel(f"{int(sched.sum())} of {steps} steps run" if len(sched) == steps
                     else f"{len(sched)} steps: a coarser grid", fontsize=7)
    return _finish(fig, title)


@_literal_text
def token_map(probs, tokens: list[str], title: str = "", ax=None, cbar: bool = True):
    """One head's map ``probs [S, S]`` over a short text, its rows and columns labelled with the ``tokens`` (``[S]``);
    keys a query cannot see (the causal mask: above the diagonal) are drawn grey, so "zero because masked" and
    "zero because not read" look different. Linear colour scale, weights in [0, 1]."""
    P = _np(probs)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or P.shape[0] != len(tokens):
        raise InputError(f"token_map expects one head's square map [S, S] and S tokens, got {P.shape} and {len(tokens)} tokens")
    fig, ax = _axes(ax, (4.8, 4.2))
    masked = np.triu(np.ones_like(P, dtype=bool), 1)
    cmap = _plt().get_cmap("viridis").copy()
    cmap.set_bad("#d9d9d9")
    _heatmap(ax, np.ma.masked_array(P, masked), title, "key (what is read)", "query (who reads)",
             "attention weight (grey: masked)" if cbar else None, ticks=False, cmap=cmap, vmin=0, vmax=1)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
    return fig or ax.figure


def depth_budgets(widths, counts: dict, shares, methods, tokens: int, title: str = ""):
    """Budgets by depth in one figure. Left: per layer, how many image keys the question reads (``widths``, bars) and
    the image positions each schedule keeps at ``tokens`` (``counts``: name -> per-layer counts, lines; the uniform
    budget dashed). Right, one panel per token budget: each method's share of the full cache's accuracy with its 95%
    interval (``shares``: rows of ``method``, ``tokens``, ``share_of_full``, ``lo``, ``hi``)."""
    methods = check_methods(methods, MAX_METHODS + 2)
    budgets = sorted(shares.tokens.unique())
    fig, axes = _plt().subplots(1, 1 + len(budgets), figsize=(4.4 + 3.6 * len(budgets), 0.4 * len(methods) + 1.9),
                             gridspec_kw={"width_ratios": [1.25] + [1] * len(budgets)})
    ax = axes[0]
    layers = np.arange(len(widths))
    ax.bar(layers, widths, color="0.85", label="keys the question reads")
    for name, c in counts.items():
        ax.plot(layers, c, **method_style(name), label=f"kept: {name.split('@')[-1]}")  # color, marker, lw
    ax.axhline(tokens, color="k", lw=0.8, ls="--", label=f"uniform: {tokens} per layer")
    ax.set_yscale("log")  # a whole layer (hundreds) beside a few positions
    ax.set_xticks(layers)
    ax.set(xlabel="layer", ylabel="image positions")
    ax.set_title(f"per layer, at {tokens} image tokens", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    for ax, tok in zip(axes[1:], budgets):
        for i, m in enumerate(methods):
            r = shares[(shares.method == m) & (shares.tokens == tok)]
            if not len(r):
                continue
            r, st = r.iloc[0], method_style(m)
            ax.errorbar(r.share_of_full, i, xerr=[[r.share_of_full - r.lo], [r.hi - r.share_of_full]],
                        fmt=st["marker"], color=st["color"], ms=8 if st["lw"] > 2 else 5, capsize=3)
            ax.text(r.hi + 0.003, i, f"{r.share_of_full:.3f}", va="center", fontsize=7)
        ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
        ax.set_yticks(range(len(methods)), methods if ax is axes[1] else [""] * len(methods), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{tok} image tokens: share of full accuracy", fontsize=9)
    lo = min(float(shares[shares.method.isin(methods)].lo.min()), 0.95)  # the methods shown decide the scale
    for ax in axes[1:]:
        ax.set_xlim(lo - 0.005, 1.02)
    fig.suptitle(title, fontsize=10)  # even an empty one: it keeps the layout
    return _finish(fig)
