"""One call from stores to a report: figures as PNG files plus one self-contained HTML page (images
embedded, no network needed to open it).

    build_report({"tiny-llava": "outputs/02_understanding_maps/stats",
                  "tiny-mmdit": "outputs/03_diffusion_steps/store/tiny-mmdit"}, "outputs/report")

or from a shell: ``unicache-report outputs/02_understanding_maps/stats --out outputs/report``.
``build_report(..., explorers={"tiny-llava": ex})`` also embeds each explorer's HTML form (:mod:`unicache_lib.explorer`:
an ``attention_explorer(...)`` widget, its ``.static()`` or its data), so the page's reader moves the layer, head and
query-token sliders without a kernel; each within the explorer's budget (:data:`~unicache_lib.explorer.BUDGET_BYTES`),
its text escaped by the explorer, nothing fetched. (The CLI draws figures only: a store holds no pictures or tokens.)
Understanding stores (step -1) get entropy curves, a read-frequency heatmap, modality bars, the
anchors over the image grid and the neglect verdict; generator stores (steps >= 0) get step curves.
An understanding store captured in ``full`` mode (maps instead of statistics) is reported from the
statistics of its maps (:meth:`~unicache_lib.capture.record.Record.statistics`, the numbers a
``stats`` capture of the same samples records).

Every store is read and checked before anything is written: a missing, empty, damaged or unusable
store raises :class:`ReportError` (the CLI prints it as one line and exits with status 2) and leaves
the output directory untouched. Figures are drawn in a temporary directory and copied into place
(each file atomically, the page last) only when all of them were drawn.

The output directory is checked by :func:`unicache_lib.paths.output_folder`: never empty, never the
repository or one of its own folders, and new, empty or a report folder of its own: its
``.unicache-output`` lists what the report wrote there, and only those files are ever overwritten or
removed (a figure of the previous report that this one does not draw). A folder holding anything else
(a ``real_entropy.png`` of yours) is refused in one line before anything is read.
"""
import argparse
import base64
import contextlib
import dataclasses
import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from .. import plots
from ..analysis.anchors import image_reads
from ..analysis.generation import step_table
from ..analysis.understanding import layer_table
from ..core.errors import InputError, ReportError
from ..core.modality import BLOCKS
from ..core.untrusted import html_text, read_inside
from ..explorer.payload import BUDGET_BYTES
from ..paths import OUTPUT_MARKER, OutputFolder, output_folder
from ..plots import literal_text
from ..store import Store, StoreError, _atomic_write_bytes
from .neglect import detect_neglect

MARK = "<!-- unicache-report -->"
# What the figures read from each record: understanding records (stats mode) and generator records.
UNDERSTANDING_KEYS = ("norm_entropy", "max_weight", "read_freq_norm", "diag", "distance", "variance")
GENERATOR_KEYS = ("row_entropy", "max_weight", "sim_prev", "block_entropy", "blocks", "text_share",
                  "text_entropy", "sim_prev_all", "out_sim_prev", "head_sim")


def _understanding_figures(label, recs, out, stem):
    L = layer_table(recs)
    figs, notes = [], []
    per = lambda c: L.pivot(index="sample", columns="layer", values=c).to_numpy()  # noqa: E731
    figs.append(plots.save(plots.layer_curves({"normalised entropy": per("norm_entropy"), "max weight": per("max_weight")},
                                              f"{label}: focus per layer", layers=sorted(L.layer.unique())),
                           out, f"{stem}_entropy"))
    s0 = recs[0].sample
    mine = sorted((r for r in recs if r.sample == s0), key=lambda r: r.layer)
    figs.append(plots.save(plots.read_frequency_heatmap(
        np.stack([r.data["read_freq_norm"].mean(0).numpy() for r in mine]), mine[0].spans,
        f"{label}: read frequency, sample {s0}"), out, f"{stem}_read_frequency"))
    if "blocks" in recs[0].data and all(r.spans is not None and r.spans.n_image for r in recs):
        b = np.mean([r.data["blocks"].mean(0).numpy() for r in recs], 0)
        figs.append(plots.save(plots.bars(dict(zip(BLOCKS, map(float, b))), f"{label}: modality blocks (mean of {len(recs)} records)",
                                          "share"), out, f"{stem}_blocks"))
        reads = np.mean([image_reads(r).numpy() for r in recs], 0)
        g = int(round(len(reads) ** 0.5))
        if g * g == len(reads):
            fig = plots.layer_step_grid(reads.reshape(g, g), f"{label}: where text reads the image (anchors bright)", "reads")
            fig.axes[0].set(xlabel="patch column", ylabel="patch row")
            figs.append(plots.save(fig, out, f"{stem}_anchors"))
        try:
            if recs[0].part == "cross":  # a cross-attention layer's queries read nothing but the image
                raise InputError("not measurable here: in cross-attention layers the text's queries read only the "
                                 "image (a share of 1 by construction); the detector reads self-attention layers")
            notes.append(f"neglect detector: {detect_neglect(recs)}")
        except InputError as e:  # NaN / inf shares (or cells missing): said as not measurable, never "healthy"
            notes.append(f"neglect detector: {e}")
    notes.append(f"{L['sample'].nunique()} samples x {L.layer.nunique()} layers")
    return figs, notes


def _generation_figures(label, recs, out, stem):
    T = step_table(recs)
    figs = []
    for part, d in T.groupby("part"):
        vals = {c: d.groupby(["sample", "step"])[c].mean().unstack("step").to_numpy()
                for c in ("img_entropy", "sim", "text_share") if d[c].notna().any()}
        figs.append(plots.save(plots.step_curves(vals, f"{label} · {part}: per step (mean over layers)"), out,
                               f"{stem}_{part}_steps"))
    return figs, [f"{T['sample'].nunique()} prompts x {T.layer.nunique()} layers x {T.step.nunique()} steps"]


def _from_maps(r, path):
    """A full-mode understanding record (of the store at ``path``) as the stats-mode record of the same map."""
    if r.query_stride > 1 or r.key_stride > 1:
        raise ReportError(f"store {path}: record {r.key} holds a strided map (query_stride={r.query_stride}, key_stride={r.key_stride}), "
                          f"whose statistics are not the layer's: capture in stats mode, or in full mode without strides")
    try:
        stats = r.statistics()
    except (KeyError, ValueError, RuntimeError) as e:
        raise ReportError(f"store {path}: record {r.key}: its map gives no statistics ({e})") from e
    return dataclasses.replace(r, mode="stats", data=stats)


def load_store(path):
    """``(records, meta, note)`` of the store at ``path``, checked for what the report draws.

    Full-mode understanding records (attention maps) are replaced by the statistics of their maps
    (``note`` then says so; otherwise it is empty). Raises :class:`ReportError` for a path that is
    missing, a file, an empty folder or not a store, a damaged store (:class:`StoreError`: corrupt
    index, missing or corrupt chunk), a store without records, and records the report cannot draw.
    """
    p = Path(path)
    if not p.exists():
        raise ReportError(f"no store at {p}: the path does not exist")
    if not p.is_dir():
        raise ReportError(f"{p} is a file, not a store directory")
    has_meta, has_index = (p / "meta.json").exists(), any(p.glob("index-rank*.json*"))
    if not (has_meta or has_index):
        what = "an empty directory" if not any(p.iterdir()) else "a directory without meta.json or index-rank*.jsonl"
        raise ReportError(f"{p} is not a capture store ({what}): run a capture that writes to it first")
    store = Store(p)
    try:
        meta = store.read_meta() if has_meta else {}
        recs = store.read()
    except StoreError as e:
        raise ReportError(str(e)) from e
    except (ValueError, KeyError, TypeError, OSError) as e:  # JSON of the wrong shape, unreadable chunk
        raise ReportError(f"store {p} is damaged ({type(e).__name__}: {e})") from e
    if not recs:
        raise ReportError(f"store {p} holds no records: run a capture that writes to it first")
    gen = any(r.step >= 0 for r in recs)
    note = ""
    if not gen and any("probs" in r.data and "norm_entropy" not in r.data for r in recs):
        recs = [_from_maps(r, p) if "norm_entropy" not in r.data and "probs" in r.data else r for r in recs]
        note = "statistics computed from the attention maps of a full-mode capture"
    for part in sorted({r.part for r in recs}):  # every (sample, layer, step): what repair() dropped is recaptured first
        have = {(r.sample, r.layer, r.step) for r in recs if r.part == part}
        if (lost := sorted(set(itertools.product(*({h[i] for h in have} for i in range(3)))) - have)):
            raise ReportError(f"store {p} misses {len(lost)} {part} records, e.g. sample {lost[0][0]} layer "
                              f"{lost[0][1]}{f' step {lost[0][2]}' if gen else ''} (dropped by repair(), or an "
                              f"interrupted capture): run the same capture on this store again, it recaptures only "
                              f"what is missing")
    need = GENERATOR_KEYS if gen else UNDERSTANDING_KEYS
    for r in recs:
        if (lack := [k for k in need if k not in r.data]):
            raise ReportError(f"store {p}: record {r.key} ({r.mode} mode) lacks {', '.join(lack)}, which the "
                              f"{'generator' if gen else 'understanding'} report needs")
    # NaN marks what a statistic is undefined for (a query row with one key; step 0's similarity to the step before)
    # and is left out of the means; a statistic NaN in every record would draw an empty curve still counted in the
    # legend, and inf is never one
    bad = next((k for k in need if (arrays := [a for r in recs if (a := np.asarray(r.data[k])).dtype.kind == "f"
                                               and a.size])
                and (any(np.isinf(a).any() for a in arrays) or not any(np.isfinite(a).any() for a in arrays))), None)
    if bad is not None:  # (arrays: the statistic that stopped the search)
        raise ReportError(f"store {p}: {bad} is "
                          f"{'infinite in a record' if any(np.isinf(a).any() for a in arrays) else 'NaN in every record'}"
                          f" (a capture that overflowed, e.g. in float16): nothing honest can be drawn from it; "
                          f"recapture it in float32 (Store.drop its records, then run the capture again)")
    return recs, meta, note


def _stem(label: str, taken: set) -> str:
    """A file-name prefix for ``label`` (at most 80 characters of it: a figure's name stays under the file system's
    limit), not in ``taken`` (and added to it)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._")[:80].strip("._") or "store"  # a file name stays short
    stem, i = base, 2
    while stem.lower() in taken:
        stem, i = f"{base}-{i}", i + 1
    taken.add(stem.lower())
    return stem


TOOL = "unicache-report"


def _earlier_report(folder: Path) -> set | None:
    """What a report written before ``.unicache-output`` existed left in ``folder`` (its page, marked, and the
    figures the page shows), or None when ``folder`` holds no such report."""
    try:
        text = read_inside(folder, "report.html").decode(errors="replace")
    except (InputError, OSError):
        return None
    return None if MARK not in text[:200] else {"report.html"} | {alt + ".png" for alt in re.findall(r'<img alt="([A-Za-z0-9._-]+)"', text)}


def report_folder(out_dir, option: str = "out_dir") -> OutputFolder:
    """The output directory, checked (:func:`unicache_lib.paths.output_folder`); :class:`ReportError` otherwise."""
    try:
        return output_folder(out_dir, TOOL, option=option, legacy=_earlier_report)
    except InputError as e:
        raise ReportError(str(e)) from e


def explorer_html(ex, label: str = "explorer") -> str:
    """The HTML form of ``ex`` (an explorer widget, its ``.static()``, or its :class:`~unicache_lib.explorer.ExplorerData`),
    checked against the explorer's budget; :class:`ReportError` for anything else or a form over the budget."""
    form = getattr(ex, "html", None)
    form = form() if callable(form) else form
    if not isinstance(form, str) or 'class="ucx"' not in form:
        raise ReportError(f"explorer {label!r} is a {type(ex).__name__}, not an explorer: pass what "
                          f"unicache_lib.explorer.attention_explorer(...) returns (or its .static())")
    size = len(form.encode("utf-8"))
    if size > BUDGET_BYTES:
        raise ReportError(f"explorer {label!r} takes {size / 1e6:.2f} MB, over the explorer's budget of "
                          f"{BUDGET_BYTES / 1e6:.0f} MB: build it on fewer samples or layers (samples=[...], layers=[...])")
    return form


def build_report(stores: dict, out_dir, title: str = "UniCache attention report", option: str = "out_dir",
                 explorers: dict | None = None) -> Path:
    """Write ``out_dir/report.html`` and the PNGs it shows; returns the HTML path. ``stores``: label ->
    store directory; each label gets its own section and its own file names. ``explorers``: label -> an explorer
    (:func:`explorer_html`), embedded after the figures under its own heading: its sliders work in the page, no kernel.

    All stores are read and checked first (:func:`load_store`); any :class:`ReportError` leaves
    ``out_dir`` untouched. Refuses (:class:`ReportError`, a ``FileExistsError``) an ``out_dir`` that is empty, the
    repository or one of its folders, or holds anything this function did not write (:func:`report_folder`);
    ``option`` names it in that message (the CLI's ``--out``)."""
    import matplotlib.pyplot as plt  # local: only the figures need it; main() selects Agg before pyplot loads

    folder = report_folder(out_dir, option)
    out = folder.path
    page = out / "report.html"
    if not stores:
        raise ReportError("no stores given")
    loaded = {label: load_store(path) for label, path in stores.items()}  # everything checked before drawing
    forms = {str(label): explorer_html(ex, str(label)) for label, ex in (explorers or {}).items()}
    sections, taken = [], set()

    # labels, model names and prompts from the stores drawn as typed (math text off: `$\frac{$` shows, not fails)
    with tempfile.TemporaryDirectory(prefix="unicache-report-") as tmp, literal_text():
        files, used = [], set()  # (file name in out, drawn file); the names given, lower-case
        for i, (label, (recs, meta, note)) in enumerate(loaded.items()):
            stem, tmp_i = _stem(str(label), taken), Path(tmp) / str(i)  # each store's figures in their own folder
            tmp_i.mkdir()
            gen = any(r.step >= 0 for r in recs)
            if gen:
                figs, notes = _generation_figures(label, recs, tmp_i, stem)
            else:  # one set of figures per part (a cross-attention VLM: self- and cross-attention layers)
                parts = sorted({r.part for r in recs})
                figs, notes = [], []
                for part in parts:
                    one = len(parts) == 1
                    f, n = _understanding_figures(label if one else f"{label}_{part}",
                                                  [r for r in recs if r.part == part], tmp_i, stem if one else f"{stem}_{part}")
                    figs += f
                    notes += [x if one else f"{part}: {x}" for x in n]
            plt.close("all")
            named = []  # a name another store's figure already has (store m's m_cross_*, store m_cross's) gets -2, -3
            for p in figs:
                name, k = p.name, 2
                while name.lower() in used:
                    name, k = f"{p.stem}-{k}{p.suffix}", k + 1
                used.add(name.lower())
                named.append((name, p))
            files += named
            sections.append(f"<h2>{html_text(str(label))} <small>({'generator' if gen else 'understanding'}; "
                            f"{html_text(str(meta.get('model', '?')))}, {len(recs)} records)</small></h2>"
                            + "".join(f"<p>{html_text(n)}</p>" for n in ([note] if note else []) + notes)
                            + "<div>" + "".join(f'<img alt="{html_text(Path(name).stem)}" src="data:image/png;base64,'
                                                f'{base64.b64encode(p.read_bytes()).decode()}">' for name, p in named)
                            + "</div>")
        sections += [f"<h2>{html_text(label)} <small>(explorer: layer, head or their mean, query token; views "
                     f"t2i, i2t, full; PNG and JSON export)</small></h2>{form}" for label, form in forms.items()]
        doc = (f"{MARK}\n<!doctype html><html><head><meta charset='utf-8'><title>" + html_text(title) +
               "</title><style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:48%;margin:4px}"
               "</style></head><body><h1>" + html_text(title) + "</h1>" + "".join(sections) + "</body></html>")
        _put_in_place(folder, [(out / name, f.read_bytes()) for name, f in files] + [(page, doc.encode())])
    return page


def _put_in_place(folder: OutputFolder, items: list) -> None:
    """Write ``(path, bytes)`` items in order (the page last), each atomically, listed in the folder's marker before
    they are written; then the earlier report's files this one did not rewrite are removed. A failure (a full or
    read-only disk) removes what this call created, so nothing is left behind, and raises a one-line
    :class:`ReportError`."""
    out = folder.path
    fresh = not out.exists()
    before, names = set(folder.files), {path.name for path, _ in items}
    created = []
    try:
        folder.record(before | names)  # listed first: a run cut short leaves nothing the next run would refuse
        for path, data in items:
            new = not path.exists()
            _atomic_write_bytes(path, data)
            if new:
                created.append(path)
    except OSError as e:
        for path in created:
            path.unlink(missing_ok=True)
        if fresh and out.is_dir():  # not there at all when its parent is a file
            (out / OUTPUT_MARKER).unlink(missing_ok=True)
            if not any(out.iterdir()):
                out.rmdir()
        else:
            # (if this fails, the marker still lists what this run meant to write: nothing unlisted is left)
            with contextlib.suppress(OSError):
                folder.record(before)
        raise ReportError(f"cannot write the report to {out} ({e.strerror or e}): free some space or choose another "
                          f"--out") from e
    folder.clean(keep=names)  # the earlier report's figures this one does not draw


def cli_stores(args: list[str]) -> dict:
    """``label -> path`` from the CLI's ``PATH`` / ``LABEL=PATH`` arguments. A plain path is labelled
    by its folder name, or, where folder names collide (``runs/a/store``, ``runs/b/store``), by as many
    trailing folders as tell them apart (``a/store``, ``b/store``). Raises :class:`ReportError` for a
    store or label given twice. An argument that exists as a path, or whose part before ``=`` holds a ``/``, is a
    path, ``=`` in it or not (``runs/lr=0.1/store``)."""
    def labelled(s: str) -> bool:
        return "=" in s and not os.path.lexists(s) and "/" not in s.split("=", 1)[0]

    named = [tuple(s.split("=", 1)) for s in args if labelled(s)]
    plain = [s for s in args if not labelled(s)]
    full = [Path(os.path.abspath(s)) for s in plain]  # the names as given (symlinks kept)
    real = [Path(s).resolve() for s in plain]
    if (dup := [s for s, f in zip(plain, real) if real.count(f) > 1]):
        raise ReportError(f"store {dup[0]} is given twice")
    depth = [1] * len(plain)
    while True:
        labels = [str(f) if d >= len(f.parts) else "/".join(f.parts[-d:]) for f, d in zip(full, depth)]
        clash = [i for i, lab in enumerate(labels) if labels.count(lab) > 1]
        if not clash:
            break
        depth = [d + (i in clash) for i, d in enumerate(depth)]
    stores = {}
    for label, path in named + list(zip(labels, plain)):
        if label in stores:
            raise ReportError(f"label {label!r} names two stores: give each store its own LABEL=PATH")
        stores[label] = path
    return stores


def main(argv=None):
    """The ``unicache-report`` command. Prints the page's path; exits with status 2 and a one-line
    message (no traceback) when a store is missing, empty, damaged or unusable, or the output
    directory is refused (empty, the repository or one of its folders, or holding files the report did not
    write); nothing is written then."""
    ap = argparse.ArgumentParser(description="Build an offline HTML attention report from capture stores.")
    ap.add_argument("stores", nargs="+", help="store directories (label = folder name, with parent folders "
                                                "where names collide; or LABEL=PATH)")
    ap.add_argument("--out", required=True, help="output directory for report.html and the figures: new, empty or one this command wrote (it overwrites only the files it wrote there)")
    ap.add_argument("--title", default="UniCache attention report")
    args = ap.parse_args(argv)
    import matplotlib  # local: only the CLI sets the Agg backend, before pyplot is first imported

    matplotlib.use("Agg")
    try:
        page = build_report(cli_stores(args.stores), args.out, args.title, option="--out")
    except (ReportError, FileExistsError) as e:
        print(f"unicache-report: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    print(page)


if __name__ == "__main__":
    main()
