"""An explorer's payload and the exact maps behind it (:class:`ExplorerData`): the selection, the caption, the exact
numbers of the current view and their export (``save``), and the HTML form that runs without a kernel
(:meth:`ExplorerData.html`, :class:`StaticExplorer`)."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from ..core.errors import ContractError, InputError, InputTypeError
from ..core.untrusted import folder_inside, html_text, name_problem, write_inside
from ..paths import check_output_path, record_output_files
from . import payload as P
from .payload import VIEWS, module_source

DEFAULT_STEM = "view"  # save(): the file name (without .npz / .json) when the path names a folder
SAVE_TOOL = "the explorer's save"  # one name for every explorer's exports in a folder's .unicache-output
JSON_MAP_CELLS = 100_000  # save(): the map goes into the JSON too when it has at most this many cells (always in the .npz)


class ExplorerData:
    """An explorer's payload (``spec``, ``blob``) and the exact maps behind it (``models``: label -> panels)."""

    def __init__(self, models: list, spec: dict, blob: bytes, what: str):
        self.models, self.spec, self.blob, self.what = models, spec, blob, what
        self.key = hashlib.sha256(P.spec_json(spec).encode() + blob).hexdigest()[:16]

    # ------------------------------------------------------------------------------------------- selection
    def normal(self, sel: dict | None) -> dict:
        """``sel`` with every index clamped to what exists (as explorer.js does)."""
        s = {**self.spec["open"], **(sel or {})}
        mi = min(max(0, int(s.get("model", 0))), len(self.models) - 1)
        panels = self.models[mi][1]
        si = min(max(0, int(s.get("sample", 0))), len(panels) - 1)
        p = panels[si]
        axes = list(s.get("axes") or [])
        if len(axes) != len(p.axes):
            axes = [0] * len(p.axes)
        axes = [min(max(0, int(a)), len(v) - 1) for a, (_, v) in zip(axes, p.axes)]
        head = min(max(0, int(s.get("head", 0))), p.heads)
        word = int(s.get("word", p.open_word))
        if not 0 <= word < len(p.words):
            word = p.open_word
        views = P.panel_views(p)
        view = s.get("view") if s.get("view") in views else views[0]
        return {"model": mi, "sample": si, "view": view, "axes": axes, "head": head, "word": word}

    def panel(self, sel: dict) -> P.Panel:
        return self.models[sel["model"]][1][sel["sample"]]

    def frame(self, sel: dict) -> int:
        """The frame of ``sel``'s axis stops (frames are row-major over the panel's axes)."""
        return int(np.ravel_multi_index(tuple(sel["axes"]), [len(v) for _, v in self.panel(sel).axes]))

    def choose(self, sel: dict | None, **values) -> dict:
        """``sel`` with ``values`` given by what they are: ``model`` (label), ``sample`` (id), ``view`` (t2i / i2t /
        full), an axis by its value (``layer=2``, ``step=4``), ``head`` (a number or ``"mean"``), ``word`` (the
        position in the labels: the sequence position of an understanding model's token, the word index of a
        prompt); unknown names or values are refused in one line."""
        s = self.normal(sel)
        if "model" in values:
            labels = [m[0] for m in self.models]
            if values["model"] not in labels:
                raise InputError(f"{self.what}: no model {values['model']!r} (models: {labels})")
            s.update(model=labels.index(values.pop("model")), sample=0, axes=[], word=-1)
            s = self.normal(s)
        p = self.panel(s)
        if "sample" in values:
            ids = [q.sample for q in self.models[s["model"]][1]]
            if str(values["sample"]) not in ids:
                raise InputError(f"{self.what}: no sample {values['sample']!r} (samples: {ids})")
            s.update(sample=ids.index(str(values.pop("sample"))), word=-1)
            s = self.normal(s)
            p = self.panel(s)
        for i, (name, vals) in enumerate(p.axes):
            if name in values:
                v = values.pop(name)
                if v not in vals:
                    raise InputError(f"{self.what}: {name} {v!r} was not captured (captured: {vals})")
                s["axes"][i] = vals.index(v)
        if "head" in values:
            h = values.pop("head")
            h = p.heads if h == "mean" else h
            if not isinstance(h, (int, np.integer)) or not 0 <= h <= p.heads:
                raise InputError(f"{self.what}: head {h!r} outside 0..{p.heads - 1} (or 'mean')")
            s["head"] = int(h)
        if "word" in values:
            w = values.pop("word")
            pos = [int(lab.split(" ", 1)[0]) for lab in p.words]
            if w not in pos:
                raise InputError(f"{self.what}: {w!r} is not a word position of sample {p.sample!r} (positions: "
                                 f"{pos[:12]}{'...' if len(pos) > 12 else ''})")
            s["word"] = pos.index(w)
        if "view" in values:
            v = values.pop("view")
            if v not in P.panel_views(p):
                raise InputError(f"{self.what}: no view {v!r} here (views: {P.panel_views(p)})")
            s["view"] = v
        if values:
            raise InputError(f"{self.what}: cannot choose {sorted(values)}: model, sample, view, "
                             f"{', '.join(n for n, _ in p.axes)}, head or word")
        return s

    # ------------------------------------------------------------------------------------------- words
    def settings(self, sel: dict) -> dict:
        sel = self.normal(sel)
        p = self.panel(sel)
        return {"model": self.models[sel["model"]][0], "sample": p.sample, "view": sel["view"],
                **{name: vals[sel["axes"][i]] for i, (name, vals) in enumerate(p.axes)},
                "head": "mean" if sel["head"] >= p.heads else sel["head"], "word": p.words[sel["word"]]}

    def caption(self, sel: dict | None) -> str:
        """The current view in words, as HTML: every piece from the data escaped (``html_text``)."""
        sel = self.normal(sel)
        p, st = self.panel(sel), self.settings(sel)
        head = f"mean of {p.heads} heads" if st["head"] == "mean" else f"head {st['head']}"
        where = " · ".join(f"{n} {st[n]}" for n, _ in p.axes)
        title, what = ((f"{p.part} · {where} · {head}", "word") if p.kind == "steps"
                       else (f"sample {p.sample} · {where} · {head}", "query token"))
        if len(self.models) > 1:
            title = f"{st['model']} · {title}"
        note = f" · {p.note_name}: <i>{html_text(p.note)}</i>" if p.note else ""
        return (f"<b>{html_text(title)}</b>{note} · {what}: <code>{html_text(st['word'])}</code>"
                f" · view: {html_text(VIEWS[sel['view']])}")

    # ------------------------------------------------------------------------------------------- numbers
    def values(self, sel: dict | None) -> np.ndarray | None:
        """The exact numbers of the current view (:func:`~.payload.view_values`)."""
        sel = self.normal(sel)
        return P.view_values(self.panel(sel), sel["view"], self.frame(sel), sel["head"], sel["word"])

    def save(self, path, sel: dict | None = None) -> tuple[Path, Path]:
        """Write the current view's exact numbers: ``path.npz`` (``map``: the view; ``heads``: the same view for each
        head, ``[H, ...]``) and ``path.json`` (settings, labels, unit, shape and, when small, the map). A ``path`` that
        ends in a separator or names an existing folder means inside it: ``path/view.npz`` and ``path/view.json``. ``path``'s
        folder is checked like every output folder (:func:`unicache_lib.paths.check_output_path`: not the repository
        or a folder of it but outputs/, not another tool's), an existing file is replaced only when an earlier save
        wrote it with the content it holds now (the folder's .unicache-output lists what it wrote, with each file's
        SHA-256), and nothing is written through a symbolic link: not the files, not the folder, not a folder on the
        way to it (a link at the top level, such as macOS's /tmp -> /private/tmp, aside), so a link to /etc in the
        path is refused, never followed (core.untrusted.folder_inside, write_inside)."""
        sel = self.normal(sel)
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) and not isinstance(path, bytes) else None
        if not isinstance(text, str):
            raise InputTypeError(f"{self.what}.save: path must be a text or a Path, got {type(path).__name__} "
                                 f"{path!r:.80}: e.g. 'outputs/mine/view'")
        p = Path(text)
        if text and (text.endswith(("/", os.sep)) or os.path.isdir(os.path.expanduser(text))):
            p = p / DEFAULT_STEM  # a folder: the files go inside it (never beside it as <folder>.npz)
        elif p.suffix in (".npz", ".json"):
            p = p.with_suffix("")
        why = name_problem(p.name) if p.name else "is empty"
        if why:
            raise InputError(f"{self.what}.save: path {str(path)!r} {why}: name the file to write, e.g. "
                             f"'outputs/mine/view'")
        names = [p.name + ".npz", p.name + ".json"]  # an existing one only when an earlier save wrote it (its marker)
        named = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(str(p.parent))))  # the folder as named
        folder = check_output_path(named, option="path", tool=SAVE_TOOL, files=names)  # where it leads: the policy
        top, _, rest = named.lstrip(os.sep).partition(os.sep)
        if rest:  # below the top level no symbolic link is followed: the folder named is the folder written
            base = os.path.realpath(os.sep + top)
            folder_inside(base, rest, create=True, what=f"{self.what}.save: folder",
                          fix=f"Name the real folder (save never writes through a symbolic link), e.g. "
                              f"'outputs/mine/view'")
            folder = Path(base, rest)
        folder.mkdir(parents=True, exist_ok=True)
        panel = self.panel(sel)
        values = self.values(sel)
        heads = [P.view_values(panel, sel["view"], self.frame(sel), h, sel["word"]) for h in range(panel.heads)]
        buf = io.BytesIO()
        np.savez_compressed(buf, map=values if values is not None else np.zeros(0, np.float32),
                            **({"heads": np.stack(heads)} if all(h is not None for h in heads) else {}))
        view = sel["view"]
        info = {
            "explorer": self.spec["title"], "settings": self.settings(sel), "view": VIEWS[view],
            "unit": "attention weight" if view == "full" else "multiples of the uniform weight (1 = even reading)",
            "shape": None if values is None else list(values.shape),
            "layout": ({"rows": "query positions", "cols": "key positions", "image_keys": panel.key_band,
                        "image_queries": panel.query_band} if view == "full" else
                       {"rows": "patch rows of the picture", "cols": "patch columns", "grid": list(panel.grid)}),
            "words": panel.words, "npz": {"file": p.name + ".npz", "map": "the view",
                                         "heads": "the view for each head, [heads, ...]"},
        }
        if values is None:
            info["note"] = ("this word cannot see the picture (it comes before it: causal mask)" if view == "t2i" else
                            "no image token can see this word (it comes after the picture: causal mask)")
        elif values.size <= JSON_MAP_CELLS:
            info["map"] = [[float(f"{x:.7g}") for x in row] for row in np.atleast_2d(values)]
        data = {names[0]: buf.getvalue(), names[1]: (json.dumps(info, indent=1, ensure_ascii=False) + "\n").encode()}
        record_output_files(folder, SAVE_TOOL, data)  # listed first, with their SHA-256: a later save may replace these
        return tuple(write_inside(folder, n, b, what="explorer export") for n, b in data.items())  # (.npz, .json)

    # ------------------------------------------------------------------------------------------- sizes, HTML
    @property
    def stops(self) -> list[str]:
        """The first slider's stops (the layers of an attention explorer, the steps of a step explorer)."""
        return [str(v) for v in self.models[0][1][0].axes[0][1]]

    def summary(self) -> str:
        return (f"{len(self.models)} models, " if len(self.models) > 1 else "") + P.size_words(self.models)

    def html(self, sel: dict | None = None) -> str:
        """The explorer's HTML form: its data and its module inline, started by a module script; runs in any page
        that runs the scripts of a notebook's HTML (an nbconvert export, the course site). Nothing is fetched."""
        js = module_source()
        if "</script" in js.lower():
            raise ContractError("explorer.js holds '</script': it would end its own inline script")
        data = {"spec": self.spec, "data": base64.b64encode(self.blob).decode("ascii"), "selection": self.normal(sel)}
        return (f'<div class="ucx" data-ucx="{self.key}" style="margin:4px 0">\n'
                f'<div class="ucx-fallback" style="color:#555;font-size:90%">{html_text(self.spec["title"])} '
                f'({html_text(self.summary())}): an explorer drawn by its script, in a page that runs it (JupyterLab, '
                f'an HTML export, the course site).</div>\n'
                f'<script type="application/json" class="ucx-data">{P.spec_json(data)}</script>\n'
                f'<script type="module">\n{js}\n{_BOOT.replace("@@KEY@@", self.key)}</script>\n</div>')

    @property
    def nbytes(self) -> int:
        """Bytes of the HTML form (what one explorer adds to a notebook or a page; the selection aside)."""
        if getattr(self, "_nbytes", None) is None:
            self._nbytes = len(self.html().encode("utf-8"))
        return self._nbytes


# the HTML form's start: the first not yet started root with this key gets a model backed by its inlined data
_BOOT = """;(() => {
  const root = Array.from(document.querySelectorAll('div.ucx[data-ucx="@@KEY@@"]')).find((e) => !e.dataset.ucxStarted);
  if (!root) return;
  root.dataset.ucxStarted = "1";
  const d = JSON.parse(root.querySelector("script.ucx-data").textContent);
  const raw = atob(d.data), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const values = { _spec: d.spec, _data: new DataView(bytes.buffer), selection: d.selection }, handlers = {};
  const model = {
    get: (k) => values[k],
    set: (k, v) => { values[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
    on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); },
    off: (e, f) => { handlers[e] = (handlers[e] || []).filter((g) => g !== f); },
    save_changes: () => {},
    send: () => {},
  };
  const fallback = root.querySelector(".ucx-fallback");
  if (fallback) fallback.remove();
  const mount = root.appendChild(document.createElement("div"));
  render({ model, el: mount });
})();
"""


class StaticExplorer:
    """An explorer's HTML form alone (``text/html`` through ``_repr_html_``), for a page without widgets: ``html`` the
    markup, ``nbytes`` its size, ``stops`` the first slider's stops, ``data`` the :class:`ExplorerData` (``save``)."""

    def __init__(self, data: ExplorerData, selection: dict | None = None, what: str = "explorer"):
        self.data, self.selection, self.what = data, data.normal(selection), what
        self.html = data.html(self.selection)
        self.stops = data.stops

    @property
    def nbytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path) -> tuple[Path, Path]:
        return self.data.save(path, self.selection)

    def __repr__(self) -> str:
        return (f"<{self.what}, kernel-free: {self.data.summary()}, {len(self.stops)} stops, "
                f"{self.nbytes / 1e6:.2f} MB>")
