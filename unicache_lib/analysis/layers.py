"""Layer bands: shallow / middle / deep thirds of a model's depth."""
from __future__ import annotations

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

