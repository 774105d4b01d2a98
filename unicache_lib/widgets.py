"""The lessons' explorers, by their former names: thin wrappers over :mod:`unicache_lib.explorer`, the one explorer
(an anywidget drawn in the browser from the captured maps; its HTML form runs without a kernel).

Sliders offer only what was captured (a ``LAYERS=[0, 15, 31]`` capture gives a layer slider with those three stops),
and an incomplete capture (a layer or step missing for some sample) is refused when the explorer is built, so no
slider position can reach a missing record."""
from __future__ import annotations


def attention_explorer(result, images: dict, tokens: dict, grids: dict | None = None, questions: dict | None = None,
                       **options):
    """Sample / view / layer / head / query-token explorer over an understanding model's full-mode records: see
    :func:`unicache_lib.explorer.attention_explorer` (``options``: ``samples``, ``layers``, ``full_side``,
    ``budget_bytes``, ``title``). Returns the widget; its ``caption.value`` names the view in words."""
    from .explorer import attention_explorer as build  # local: anywidget is imported only when an explorer is built

    return build(result, images, tokens, grids, questions, **options)


def model_explorer(per_model: dict, **options):
    """A model menu over the attention explorers of several models, one widget: see
    :func:`unicache_lib.explorer.model_explorer` (``per_model``: label -> ``(result, images, tokens, grids,
    questions)``)."""
    from .explorer import model_explorer as build  # local: anywidget is imported only when an explorer is built

    return build(per_model, **options)


def step_explorer(result, images: dict, tokens: dict, part: str | None = None, **options):
    """Prompt / view / step / layer / head / word explorer over a generator's full-mode records: see
    :func:`unicache_lib.explorer.step_explorer` (``options``: ``samples``, ``layers``, ``steps``, ``full_side``,
    ``budget_bytes``, ``title``)."""
    from .explorer import step_explorer as build  # local: anywidget is imported only when an explorer is built

    return build(result, images, tokens, part, **options)
