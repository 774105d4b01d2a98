"""One call from stores to a report: figures as PNG files plus one self-contained HTML page (images
embedded, no network needed to open it).

    build_report({"tiny-llava": "outputs/02_understanding_maps/stats",
                  "tiny-mmdit": "outputs/03_diffusion_steps/store/tiny-mmdit"}, "outputs/report")

or from a shell: ``unicache-report outputs/02_understanding_maps/stats --out outputs/report``.
Understanding stores (step -1) get entropy curves, a read-frequency heatmap, modality bars, the
anchors over the image grid and the neglect verdict; generator stores (steps >= 0) get step curves.
"""
from __future__ import annotations

import argparse
import base64
import html
from pathlib import Path

import numpy as np

from .. import plots
from ..store import Store, _atomic_write_bytes
from .neglect import detect_neglect


def _understanding_figures(label, recs, out):
    from ..analysis.anchors import image_reads
    from ..analysis.understanding import layer_table

    L = layer_table(recs)
    figs, notes = [], []
    per = lambda c: L.pivot(index="sample", columns="layer", values=c).to_numpy()  # noqa: E731
    figs.append(plots.save(plots.layer_curves({"normalised entropy": per("norm_entropy"), "max weight": per("max_weight")},
                                              f"{label}: focus per layer", layers=sorted(L.layer.unique())),
                           out, f"{label}_entropy"))
    s0 = recs[0].sample
    mine = sorted((r for r in recs if r.sample == s0), key=lambda r: r.layer)
    rf = np.stack([r.data["read_freq_norm"].mean(0).numpy() for r in mine])
    figs.append(plots.save(plots.read_frequency_heatmap(rf, mine[0].spans, f"{label}: read frequency, sample {s0}"),
                           out, f"{label}_read_frequency"))
    if "blocks" in recs[0].data and all(r.spans is not None and r.spans.n_image for r in recs):
        from ..modality import BLOCKS

        b = np.mean([r.data["blocks"].mean(0).numpy() for r in recs], 0)
        figs.append(plots.save(plots.bars(dict(zip(BLOCKS, map(float, b))), f"{label}: modality blocks (mean of {len(recs)} records)",
                                          "share"), out, f"{label}_blocks"))
        reads = np.mean([image_reads(r).numpy() for r in recs], 0)
        g = int(round(len(reads) ** 0.5))
        if g * g == len(reads):
            fig = plots.layer_step_grid(reads.reshape(g, g), f"{label}: where text reads the image (anchors bright)", "reads")
            fig.axes[0].set_xlabel("patch column")
            fig.axes[0].set_ylabel("patch row")
            figs.append(plots.save(fig, out, f"{label}_anchors"))
        notes.append(f"neglect detector: {detect_neglect(recs)}")
    notes.append(f"{L['sample'].nunique()} samples x {L.layer.nunique()} layers")
    return figs, notes


def _generation_figures(label, recs, out):
    from ..analysis.generation import step_table

    T = step_table(recs)
    figs = []
    for part, d in T.groupby("part"):
        vals = {c: d.groupby(["sample", "step"])[c].mean().unstack("step").to_numpy()
                for c in ("img_entropy", "sim", "text_share") if d[c].notna().any()}
        figs.append(plots.save(plots.step_curves(vals, f"{label} · {part}: per step (mean over layers)"), out, f"{label}_{part}_steps"))
    return figs, [f"{T['sample'].nunique()} prompts x {T.layer.nunique()} layers x {T.step.nunique()} steps"]


def build_report(stores: dict, out_dir, title: str = "UniCache attention report") -> Path:
    """Write ``out_dir/report.html`` and the PNGs it shows; returns the HTML path. ``stores``: label ->
    store directory. Refuses to overwrite an existing report unless it was written by this function."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    page = out / "report.html"
    if page.exists() and "<!-- unicache-report -->" not in page.read_text()[:200]:
        raise FileExistsError(f"{page} exists and was not written by build_report: choose another out_dir")
    sections = []
    for label, path in stores.items():
        recs = Store(path).read()
        if not recs:
            raise ValueError(f"store {path} holds no records")
        gen = any(r.step >= 0 for r in recs)
        if gen:
            figs, notes = _generation_figures(label, recs, out)
        else:  # one set of figures per part (a cross-attention VLM: self- and cross-attention layers)
            parts = sorted({r.part for r in recs})
            figs, notes = [], []
            for part in parts:
                f, n = _understanding_figures(label if len(parts) == 1 else f"{label}_{part}",
                                              [r for r in recs if r.part == part], out)
                figs += f
                notes += [f"{part}: {x}" if len(parts) > 1 else x for x in n]
        plt.close("all")
        imgs = "".join(f'<img alt="{html.escape(p.stem)}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
                       for p in figs)
        meta = Store(path).read_meta()
        sections.append(f"<h2>{html.escape(label)} <small>({'generator' if gen else 'understanding'}; "
                        f"{html.escape(str(meta.get('model', '?')))}, {len(recs)} records)</small></h2>"
                        + "".join(f"<p>{html.escape(n)}</p>" for n in notes) + f"<div>{imgs}</div>")
    doc = ("<!-- unicache-report -->\n<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) +
           "</title><style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:48%;margin:4px}"
           "</style></head><body><h1>" + html.escape(title) + "</h1>" + "".join(sections) + "</body></html>")
    _atomic_write_bytes(page, doc.encode())
    return page


def main(argv=None):
    ap = argparse.ArgumentParser(description="Build an offline HTML attention report from capture stores.")
    ap.add_argument("stores", nargs="+", help="store directories (label = folder name, or LABEL=PATH)")
    ap.add_argument("--out", required=True, help="output directory for report.html and the figures")
    ap.add_argument("--title", default="UniCache attention report")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    stores = {}
    for s in args.stores:
        label, _, path = s.partition("=") if "=" in s else (Path(s).name, "", s)
        stores[label] = path
    print(build_report(stores, args.out, args.title))


if __name__ == "__main__":
    main()
