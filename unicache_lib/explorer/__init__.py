"""One attention explorer, drawn in the browser from the captured maps: the same in JupyterLab (an anywidget) and on
a page without a kernel (its HTML form), with export.

    from unicache_lib.explorer import attention_explorer, step_explorer, model_explorer

    ex = attention_explorer(result, images, tokens, grids, questions)   # an ipywidgets widget (anywidget)
    ex                                  # JupyterLab draws it; an HTML export / the course site runs its HTML form
    ex.select(layer=2, head="mean", word=71, view="full")   # set the view from Python (the sliders follow)
    ex.save("outputs/mine/view")        # the current view's exact numbers: view.npz + view.json
    ex.static()                         # the HTML form alone (text/html), for a page without widgets

Controls: model (several models), sample or prompt, view, layer (and step), head (the last stop is the mean of the
heads), query token or word. Views (:data:`~.payload.VIEWS`): ``t2i`` the word reading the picture, ``i2t`` the
picture reading the word (both in multiples of the uniform weight, even reading marked on the colour bar, one colour
scale per view and model), ``full`` the whole map with the image keys outlined (log colour). Every slider move redraws
in the browser (explorer.js), no kernel round trip; the maps travel once, quantised (:mod:`.payload`), and one
explorer's HTML form stays within :data:`BUDGET_BYTES` (2 MB): an explorer over it is refused before its maps are
quantised, with the parameter to lower named. The buttons under the picture save the view as PNG and its numbers as
JSON; :meth:`ExplorerData.save` (``ex.save``) writes the exact numbers from Python.

The HTML form holds the module and the data inline (``<script type="module">``, the data as JSON in a
``<script type="application/json">``): no widget manager, no CDN, nothing fetched. Text from the data is escaped
(JSON with ``<``/``>``/``&`` as ``\\u003c``...; the module sets text with ``textContent`` only)."""
from __future__ import annotations

from ..core.errors import InputError
from . import payload as P
from .data import JSON_MAP_CELLS, ExplorerData, StaticExplorer
from .payload import BUDGET_BYTES, IMAGE_SIDE, MIN_FULL_SIDE, VIEWS, module_source

__all__ = ["BUDGET_BYTES", "MIN_FULL_SIDE", "IMAGE_SIDE", "VIEWS", "JSON_MAP_CELLS", "ExplorerData", "StaticExplorer",
           "attention_explorer", "step_explorer", "model_explorer", "explorer_data", "module_source"]


# ----------------------------------------------------------------------------------------------- constructors


def explorer_data(models: list, title: str, *, full_side=None, budget_bytes: int = BUDGET_BYTES,
                  what: str = "explorer", lower: str = "samples", opening: dict | None = None) -> ExplorerData:
    """Plan within the budget (refusing before any map is quantised), then build: ``models`` is a list of
    ``(label, panels)``."""
    p0 = models[0][1][0]
    open_sel = {"model": 0, "sample": 0, "view": "i2t" if p0.kind == "steps" else P.panel_views(p0)[0],
                "axes": [0] * len(p0.axes), "head": 0, "word": p0.open_word, **(opening or {})}
    plan = P.fit(models, title, full_side, budget_bytes, what, open_sel, lower)
    return ExplorerData(models, *P.build(models, plan), what)  # (spec, blob)


def attention_explorer(result, images: dict, tokens: dict, grids: dict | None = None, questions: dict | None = None,
                       *, samples=None, layers=None, full_side: int | None = None,
                       budget_bytes: int = BUDGET_BYTES, title: str | None = None):
    """The explorer of an understanding model's full-mode capture (the signature of the former
    ``widgets.attention_explorer``).

    Args:
        result: full-mode records (``probs [H, S, S]``, or cross-attention ``[H, T, V]``) with spans, of one part
            (``result.part`` if several); every sample must have the same layers (a missing one is refused here).
        images: sample id -> ``[H, W, 3]`` picture; tokens: sample id -> token strings (length S, or T).
        grids: sample id -> ``(grid, grid_tokens)`` of the image tokens over the picture (default: square).
        questions: sample id -> the question asked (shown in the caption).
        samples / layers: a subset to carry (default: all captured); full_side: the whole map's longest side in
            cells (larger maps are block-averaged; default: as large as the budget allows); budget_bytes: the
            HTML form's limit (:data:`BUDGET_BYTES`).
    Returns:
        an :class:`~unicache_lib.explorer.widget.Explorer` widget, opening on the first sample, layer and head and on
        the last text position naming an object or a colour."""
    from .widget import Explorer  # local: the widget imports anywidget, needed only when an explorer is built

    what = "attention_explorer"
    panels = P.attention_panels(result, images, tokens, grids, questions, samples=samples, layers=layers, what=what)
    return Explorer(explorer_data([("", panels)], title or f"{panels[0].part} attention: where each word reads the "
                                  f"picture", full_side=full_side, budget_bytes=budget_bytes, what=what,
                                  lower="samples (samples=[...])"))


def step_explorer(result, images: dict, tokens: dict, part: str | None = None, *, samples=None, layers=None,
                  steps=None, full_side: int | None = None, budget_bytes: int = BUDGET_BYTES, title: str | None = None):
    """The explorer of a generator's full-mode capture (``DiffusionCapture(mode="full")``; the signature of the
    former ``widgets.step_explorer``): prompt, view, step, layer, head and word. ``part``: ``"joint"`` or
    ``"cross"`` (default: the first part holding text keys); ``samples`` / ``layers`` / ``steps``: a subset to
    carry; the rest as :func:`attention_explorer`. Opens on the picture reading the first word, first step and
    layer."""
    from .widget import Explorer  # local: the widget imports anywidget, needed only when an explorer is built

    what = "step_explorer"
    panels = P.step_panels(result, images, tokens, part, samples=samples, layers=layers, steps=steps, what=what)
    lower = "steps (steps=[...])" if len(panels[0].axes[0][1]) > 1 else "samples (samples=[...])"
    return Explorer(explorer_data([("", panels)], title or f"{panels[0].part} attention, step by step: where each word "
                                  f"lands", full_side=full_side, budget_bytes=budget_bytes, what=what, lower=lower))


def model_explorer(per_model: dict, *, full_side: int | None = None, budget_bytes: int = BUDGET_BYTES,
                   title: str | None = None):
    """One explorer over several models (the signature of the former ``widgets.model_explorer``): ``per_model`` maps
    a label to the arguments of :func:`attention_explorer` (``(result, images, tokens, grids, questions)``); a model
    menu picks the model, the other controls as :func:`attention_explorer`. One budget for all the models."""
    from .widget import Explorer  # local: the widget imports anywidget, needed only when an explorer is built

    what = "model_explorer"
    if not per_model:
        raise InputError(f"{what} needs at least one model's full-mode capture")
    models = [(str(label), P.attention_panels(*args, what=f"{what} ({label})")) for label, args in per_model.items()]
    return Explorer(explorer_data(models, title or "attention by model: where each word reads the picture",
                                  full_side=full_side, budget_bytes=budget_bytes, what=what,
                                  lower="models or samples (one sample a model)"))
