"""Read a generated image back: segment it by the world's palette and score prompt following.

Used to measure the generators (colour / position / shape correct) without a learned judge.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from .scenes import BACKGROUND, COLOURS, POSITIONS, SHAPES, shape_mask
from .text import scorable

_PALETTE = np.array([BACKGROUND] + list(COLOURS.values()), np.float32)  # [7, 3]
_NAMES = ["background"] + list(COLOURS)


def colour_labels(image: np.ndarray, max_dist: float = 0.35) -> np.ndarray:
    """``[H, W]`` index into ``["background", *COLOURS]`` of each pixel's nearest palette colour
    (-1 when no palette colour is within ``max_dist``). ``image``: ``[H, W, 3]`` float in [0, 1]
    or uint8."""
    img = image.astype(np.float32) / (255.0 if image.dtype == np.uint8 else 1.0)
    d = np.linalg.norm(img[:, :, None, :] - _PALETTE[None, None], axis=-1)
    return np.where(d.min(-1) > max_dist, -1, d.argmin(-1))


def colour_mask(image: np.ndarray, colour: str) -> np.ndarray:
    """Boolean ``[H, W]`` mask of the pixels closest to ``colour``."""
    return colour_labels(image) == _NAMES.index(colour)


def classify_shape(mask: np.ndarray) -> str | None:
    """Best-matching shape template (IoU) for one blob, placed at the blob's centroid with the
    radius its area implies; None for an empty mask."""
    area = mask.sum()
    if area < 3:
        return None
    ys, xs = np.nonzero(mask)
    cy, cx = ys.mean() + 0.5, xs.mean() + 0.5
    area_per_r2 = {"circle": np.pi, "square": 1.7 ** 2, "triangle": 0.5 * 2.1 * 1.8}

    def iou(s):  # the template of shape s over the blob (a triangle's centroid sits below its centre)
        r = float(np.sqrt(area / area_per_r2[s]))
        t = shape_mask(s, cx, cy - 0.2 * r if s == "triangle" else cy, r, mask.shape[0])
        return (t & mask).sum() / max(1, (t | mask).sum())

    return max(SHAPES, key=iou)  # the first of equals


def nearest_position(mask: np.ndarray) -> str | None:
    if mask.sum() == 0:
        return None
    ys, xs = np.nonzero(mask)
    fx, fy = (xs.mean() + 0.5) / mask.shape[0], (ys.mean() + 0.5) / mask.shape[0]
    return min(POSITIONS, key=lambda p: (POSITIONS[p][0] - fx) ** 2 + (POSITIONS[p][1] - fy) ** 2)


def score_object(image: np.ndarray, obj: dict, min_fraction: float = 0.012) -> dict:
    """Did the image draw ``obj`` (a dict with colour, shape, position)? An object the detector cannot judge (None, or
    words outside the synthetic world: :func:`~unicache_lib.world.text.scorable`) gets NaN for all three, so a mean
    over your own prompts says "not measured" rather than "wrong".

    Colour is correct when the object's colour is the most frequent non-background palette colour
    and covers at least ``min_fraction`` of the image (12 pixels of a 32x32 image; a drawn object
    covers ~80). Position and shape are judged on the pixels of that colour. Every threshold is a
    fraction of the image (area, side), so any square size works (a pipeline's 512 or 1024 px).
    """
    if image.ndim != 3 or image.shape[0] != image.shape[1]:
        raise InputError(f"score_object takes a square [H, W, 3] image (shapes and positions are judged on a "
                         f"square canvas, at any size), got shape {image.shape}")
    if not scorable(obj):
        return {"colour": float("nan"), "position": float("nan"), "shape": float("nan")}
    lab = colour_labels(image)
    counts = np.bincount(lab[lab > 0].ravel(), minlength=len(_NAMES))
    k = _NAMES.index(obj["colour"])
    m = lab == k
    colour_ok = bool(counts[k] >= min_fraction * lab.size and counts[k] == counts[1:].max())
    return {"colour": colour_ok, "position": bool(colour_ok and nearest_position(m) == obj["position"]),
            "shape": bool(colour_ok and classify_shape(m) == obj["shape"])}
