"""Layer bands: shallow / middle / deep thirds of a model's depth."""
from __future__ import annotations

from ..core.errors import InputError

BANDS: tuple[str, ...] = ("shallow", "middle", "deep")


def layer_band(layer: int, n_layers: int) -> str:
    """Thirds of the depth, by layer centre: 4 layers -> [0] [1, 2] [3]; 32 -> [0-10] [11-20] [21-31]."""
    if not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} outside 0..{n_layers - 1}")
    return BANDS[min(2, int(3 * (layer + 0.5) / n_layers))]


def band_layers(n_layers: int) -> dict[str, list[int]]:
    return {b: [i for i in range(n_layers) if layer_band(i, n_layers) == b] for b in BANDS}


def require_bands(layers, n_layers: int, name: str = "LAYERS") -> dict[str, list[int]]:
    """The captured ``layers`` of each band; raises ValueError when a band has none (the depth comparisons
    need at least one layer per band), naming the missing bands and a layer list that covers them.
    Negative layers count from the last, as in capture."""
    if n_layers < len(BANDS):
        raise InputError(f"this model has {n_layers} layer(s): the notebook compares shallow, middle and deep layers and "
                         f"needs at least {len(BANDS)} (one per band); use a model with {len(BANDS)} or more layers")
    have = sorted({li % n_layers if -n_layers <= li < n_layers else _out_of_range(li, n_layers) for li in layers})
    out = {b: [li for li in ls if li in have] for b, ls in band_layers(n_layers).items()}
    missing = [b for b, ls in out.items() if not ls]
    if missing:
        full = band_layers(n_layers)
        fix = sorted(set(have) | {full[b][len(full[b]) // 2] for b in missing})
        spans = ", ".join(f"{b} (layers {full[b][0]}-{full[b][-1]})" for b in missing)
        raise InputError(f"{name} = {list(layers)} has no layer in the {spans} band(s) of this {n_layers}-layer model: "
                         f"the notebook compares shallow, middle and deep layers and needs one of each, e.g. {name} = {fix}")
    return out


def _out_of_range(li: int, n_layers: int):
    raise InputError(f"layer {li} outside -{n_layers}..{n_layers - 1}")
