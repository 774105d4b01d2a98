"""The explorers without a kernel, by their former names: the HTML form of :mod:`unicache_lib.explorer`'s one
explorer (its ES module and its quantised maps inline, nothing fetched), which redraws in the page as its sliders
move: every sample, layer (and step), head and query token or word, not one slider of pre-drawn pictures.

Each takes the arguments of its :mod:`unicache_lib.widgets` counterpart and opens on the view it names (first
sample, head 0, the query / word the widget opens on, unless given):

- :func:`static_attention_explorer` (notebook 02);
- :func:`static_step_explorer` (notebook 03; opens on the last captured layer);
- :func:`static_model_explorer` (notebook 08).

Size budget: one explorer's HTML stays within ``budget_bytes`` (default :data:`BUDGET_BYTES`, 2 MB); an explorer
over it is refused before its maps are quantised, naming the parameter to lower (:mod:`unicache_lib.explorer`).
``dpi`` is accepted for the former signature and not used: the browser draws the maps at the screen's resolution."""
from __future__ import annotations

from .core.errors import InputError
from .explorer import BUDGET_BYTES, StaticExplorer, explorer_data, model_explorers_data
from .explorer import payload as _payload

DPI = 80  # former frames' resolution: accepted, not used

__all__ = ["BUDGET_BYTES", "StaticExplorer", "static_attention_explorer", "static_step_explorer",
           "static_model_explorer"]


def static_attention_explorer(result, images: dict, tokens: dict, grids: dict | None = None,
                              questions: dict | None = None, *, sample=None, head: int = 0, token: int | None = None,
                              budget_bytes: int = BUDGET_BYTES, dpi: float = DPI, **options) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.attention_explorer` without a kernel, opening on ``sample`` (default: the first),
    ``head`` and query ``token`` (a sequence position; default: the one the widget opens on). ``options``:
    ``samples``, ``layers``, ``full_side``, ``title``."""
    what = "static_attention_explorer"
    panels = _payload.attention_panels(result, images, tokens, grids, questions, samples=options.pop("samples", None),
                                       layers=options.pop("layers", None), what=what)
    data = explorer_data([("", panels)], options.pop("title", None) or f"{panels[0].part} attention: where each word "
                         f"reads the picture (no kernel needed)", full_side=options.pop("full_side", None),
                         budget_bytes=budget_bytes, what=what, lower="samples (samples=[...])")
    _no_more(options, what)
    chosen = {"head": head, **({} if sample is None else {"sample": sample}), **({} if token is None else {"word": token})}
    return StaticExplorer(data, data.choose(None, **chosen), what)


def static_step_explorer(result, images: dict, tokens: dict, part: str | None = None, *, sample=None,
                         layer: int | None = None, head: int = 0, word: int = 0, budget_bytes: int = BUDGET_BYTES,
                         dpi: float = DPI, **options) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.step_explorer` without a kernel, opening on ``sample`` (default: the first
    prompt), the first step, ``layer`` (default: the last captured), ``head`` and ``word``. ``options``:
    ``samples``, ``layers``, ``steps``, ``full_side``, ``title``."""
    what = "static_step_explorer"
    panels = _payload.step_panels(result, images, tokens, part, samples=options.pop("samples", None),
                                  layers=options.pop("layers", None), steps=options.pop("steps", None), what=what)
    lower = "steps (steps=[...])" if len(panels[0].axes[0][1]) > 1 else "samples (samples=[...])"
    data = explorer_data([("", panels)], options.pop("title", None) or f"{panels[0].part} attention, step by step "
                         f"(no kernel needed)", full_side=options.pop("full_side", None), budget_bytes=budget_bytes,
                         what=what, lower=lower)
    _no_more(options, what)
    layers = panels[0].axes[1][1]
    chosen = {"head": head, "word": word, "layer": layers[-1] if layer is None else layer,
              **({} if sample is None else {"sample": sample})}
    return StaticExplorer(data, data.choose(None, **chosen), what)


def static_model_explorer(per_model: dict, *, head: int = 0, budget_bytes: int = BUDGET_BYTES, dpi: float = DPI,
                          **options) -> StaticExplorer:
    """:func:`~unicache_lib.widgets.model_explorer` without a kernel: one explorer with a model menu, one budget for
    all the models (``options``: ``full_side``, ``title``)."""
    what = "static_model_explorer"
    data = model_explorers_data(per_model, full_side=options.pop("full_side", None), budget_bytes=budget_bytes,
                                what=what, title=options.pop("title", None))
    _no_more(options, what)
    return StaticExplorer(data, data.choose(None, head=head), what)


def _no_more(options: dict, what: str) -> None:
    if options:
        raise InputError(f"{what}: unknown option(s) {sorted(options)}")
