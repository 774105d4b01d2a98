"""Layer bands (shallow / middle / deep) and per-layer tables read from a store."""
from __future__ import annotations

import numpy as np

BANDS: tuple[str, ...] = ("shallow", "middle", "deep")


def layer_band(layer: int, n_layers: int) -> str:
    """Thirds of the depth, by layer centre: 4 layers -> [0] [1, 2] [3]; 32 -> [0-10] [11-20] [21-31]."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} outside 0..{n_layers - 1}")
    return BANDS[min(2, int(3 * (layer + 0.5) / n_layers))]


def band_layers(n_layers: int) -> dict[str, list[int]]:
    out = {b: [] for b in BANDS}
    for i in range(n_layers):
        out[layer_band(i, n_layers)].append(i)
    return out


def per_sample_layer(records, fn) -> tuple[np.ndarray, list[str]]:
    """``[n_samples, n_layers]`` array of ``fn(record)`` (a float) over records of one part,
    with the sample order."""
    samples = list(dict.fromkeys(r.sample for r in records))
    layers = sorted({r.layer for r in records})
    pos = {(r.sample, r.layer): r for r in records}
    out = np.full((len(samples), len(layers)), np.nan)
    for i, s in enumerate(samples):
        for j, li in enumerate(layers):
            if (s, li) in pos:
                out[i, j] = fn(pos[(s, li)])
    return out, samples
