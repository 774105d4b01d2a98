"""The explorer as an ipywidgets widget (anywidget): the spec is widget state (``_spec``), the maps go to each view
once, as one binary message when it opens; the reader's choices come back in ``selection``. Its mimebundle carries
the HTML form as ``text/html`` too, so a page without a widget manager (an nbconvert export, the course site) runs
the same explorer."""
from __future__ import annotations

from types import SimpleNamespace

import anywidget
import traitlets

from .data import ExplorerData, StaticExplorer
from .payload import module_source


class Explorer(anywidget.AnyWidget):
    """Attention explorer widget; build one with :func:`~unicache_lib.explorer.attention_explorer`,
    :func:`~unicache_lib.explorer.step_explorer` or :func:`~unicache_lib.explorer.model_explorer`.

    ``selection`` (synced both ways): ``{"model", "sample", "view", "axes", "head", "word"}`` as indices (``head``
    equal to the head count: the mean of the heads); :meth:`select` sets it by value. ``caption.value`` names the
    current view in (escaped) HTML; :meth:`save` writes its exact numbers; :meth:`static` is the HTML form alone."""

    _esm = module_source()
    _spec = traitlets.Dict().tag(sync=True)
    # the maps are not widget state: a view asks for them once, by message, when it opens (see _on_msg), so a notebook
    # that saves its widget state holds them once (in the HTML form), not twice
    _data = traitlets.Bytes(b"").tag(sync=True)
    selection = traitlets.Dict().tag(sync=True)

    def __init__(self, data: ExplorerData, selection: dict | None = None, **kwargs):
        super().__init__(_spec=data.spec, selection=data.normal(selection), **kwargs)
        self.data = data
        self.on_msg(self._on_msg)

    def _on_msg(self, _widget, content, _buffers) -> None:
        """A view opened and asks for the maps: one message, the blob as its binary buffer."""
        if isinstance(content, dict) and content.get("type") == "ucx-data":
            self.send({"type": "ucx-data", "key": self.data.key}, buffers=[self.data.blob])

    def select(self, **values) -> "Explorer":
        """Set the view by value: ``select(layer=2, head="mean", word=71, view="full", sample="s1")`` (see
        :meth:`ExplorerData.choose`); returns the explorer, so a cell can end with it."""
        self.selection = self.data.choose(self.selection, **values)
        return self

    @property
    def caption(self):
        """``caption.value``: the current view in words (HTML, every piece from the data escaped)."""
        return SimpleNamespace(value=self.data.caption(self.selection))

    def settings(self) -> dict:
        return self.data.settings(self.selection)

    def values(self):
        """The current view's exact numbers (a ``[rows, cols]`` grid over the picture, or the whole map)."""
        return self.data.values(self.selection)

    def save(self, path):
        """Write the current view's exact numbers as ``path.npz`` + ``path.json`` (:meth:`ExplorerData.save`)."""
        return self.data.save(path, self.selection)

    def html(self) -> str:
        """The HTML form at the current selection (module and data inline)."""
        return self.data.html(self.selection)

    def static(self) -> StaticExplorer:
        """The HTML form alone, as an object a notebook displays as ``text/html``."""
        return StaticExplorer(self.data, self.selection, self.data.what)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def stops(self) -> list[str]:
        return self.data.stops

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        data = {**data, "text/plain": repr(self), "text/html": self.html()}
        return (data, meta) if meta else data  # a dict where it can be (lesson 08 merges it into another bundle)

    def __repr__(self) -> str:
        return f"<{self.data.what}: {self.data.summary()}, {self.data.nbytes / 1e6:.2f} MB in its HTML form>"
