"""One call, one figure. Every function returns the matplotlib ``Figure`` and validates its input.

Widgets (``widgets.py``) only call these functions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .modality import Spans


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _np(x) -> np.ndarray:
    return x.detach().float().cpu().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float32)


def layer_curves(values: dict[str, np.ndarray], title: str = "", ylabel: str = "", bands: int = 3):
    """Per-layer curves with spread. ``values``: name -> ``[n_samples, n_layers]``; the line is the
    mean over samples, the shaded band +-1 standard deviation; shallow/middle/deep bands marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    n_layers = None
    for name, v in values.items():
        v = _np(v)
        if v.ndim != 2:
            raise ValueError(f"{name}: expected [n_samples, n_layers], got shape {v.shape}")
        n_layers = v.shape[1]
        x = np.arange(n_layers)
        m, s = np.nanmean(v, 0), np.nanstd(v, 0)
        ax.plot(x, m, marker="o", label=f"{name} (n={v.shape[0]})")
        ax.fill_between(x, m - s, m + s, alpha=0.2)
    if n_layers and bands:
        edges = np.linspace(-0.5, n_layers - 0.5, bands + 1)
        for i, lab in enumerate(["shallow", "middle", "deep"][:bands]):
            ax.axvspan(edges[i], edges[i + 1], color=f"C{i}", alpha=0.04)
            ax.text((edges[i] + edges[i + 1]) / 2, 1.0, lab, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title, pad=14)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def attention_map(probs, spans: Spans | None = None, title: str = "", log: bool = True, ax=None):
    """One head's map ``[Sq, Sk]`` with the image block outlined."""
    plt = _plt()
    P = _np(probs)
    if P.ndim != 2:
        raise ValueError(f"attention_map expects one head's map [Sq, Sk], got shape {P.shape}: pick a head first")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(4, 4))
    img = np.log10(P + 1e-6) if log else P
    ax.imshow(img, cmap="viridis", interpolation="nearest", aspect="auto")
    if spans is not None:
        spans.check(P.shape[-1])
        a, b = spans.image_range()
        ax.axvspan(a - 0.5, b - 0.5, fill=False, edgecolor="w", lw=0.8)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title + (" (log10)" if log else ""), fontsize=9)
    return fig or ax.figure


def bars(values: dict[str, float], title: str = "", ylabel: str = "", log: bool = False):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3))
    names = list(values)
    ax.bar(names, [values[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    for i, n in enumerate(names):
        ax.text(i, values[n], f"{values[n]:.3g}", ha="center", va="bottom", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def save(fig, out_dir: str | Path, name: str) -> Path:
    """Save ``fig`` as ``out_dir/name.png`` (directory created) and return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"{name}.png"
    fig.savefig(p, dpi=110, bbox_inches="tight")
    return p
