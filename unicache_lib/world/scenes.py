"""Synthetic scenes of coloured shapes, rendered with per-object masks.

Everything is deterministic given a ``numpy.random.Generator``. Images are float32 arrays
``[H, W, 3]`` in ``[0, 1]``; masks are boolean ``[n_objects, H, W]`` (visible pixels only, so an
object partly covered by a later one loses the covered pixels).

Five scene types cover the study's standard sample set:

``single``   one object on a clean background
``overlap``  two or three objects at neighbouring positions, large enough to touch or overlap
``text``     a poster: rows of text-like glyph strips plus one or two objects
``clutter``  three or four objects, a noisy textured background and small grey distractor dots
``diagram``  two to four objects joined by grey lines, like a flow chart
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..core.errors import InputError

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.75, 0.15),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.90, 0.10),
    "purple": (0.60, 0.15, 0.80),
    "orange": (1.00, 0.55, 0.00),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
POSITIONS: dict[str, tuple[float, float]] = {  # (x, y) as fractions of the image side
    "left": (0.19, 0.50),
    "right": (0.81, 0.50),
    "top": (0.50, 0.19),
    "bottom": (0.50, 0.81),
    "centre": (0.50, 0.50),
}
SCENE_TYPES: tuple[str, ...] = ("single", "overlap", "text", "clutter", "diagram")
BACKGROUND = (0.08, 0.08, 0.08)
# Positions that are neighbours of each other (used to make objects touch in ``overlap`` scenes).
NEIGHBOURS = {"centre": ("left", "right", "top", "bottom"),
              "left": ("centre",), "right": ("centre",), "top": ("centre",), "bottom": ("centre",)}


@dataclass(frozen=True)
class SceneObject:
    """One object: its attributes and its centre/radius in pixels."""

    colour: str
    shape: str
    position: str
    cx: float
    cy: float
    radius: float

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass
class Scene:
    """A rendered scene. ``image``: float32 ``[H, W, 3]``; ``masks``: bool ``[n, H, W]``."""

    scene_type: str
    objects: list[SceneObject]
    image: np.ndarray
    masks: np.ndarray
    extras: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.image.shape[0]

    def describe(self) -> list[dict]:
        return [asdict(o) for o in self.objects]

    def uint8(self) -> np.ndarray:
        return (np.clip(self.image, 0, 1) * 255).round().astype(np.uint8)


def shape_mask(shape: str, cx: float, cy: float, r: float, size: int) -> np.ndarray:
    """Boolean ``[size, size]`` mask of one shape centred at pixel (cx, cy) with radius r."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    if shape == "circle":
        return (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
    if shape == "square":
        h = r * 0.85
        return (np.abs(xs - cx) <= h) & (np.abs(ys - cy) <= h)
    if shape == "triangle":
        top, base = cy - r, cy + 0.8 * r
        frac = (ys - top) / (base - top)  # 0 at the apex, 1 at the base
        return (frac >= 0) & (frac <= 1) & (np.abs(xs - cx) <= frac * r * 1.05)
    raise InputError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def _place(rng: np.random.Generator, position: str, size: int, radius: float, jitter: float) -> tuple[float, float]:
    """``(cx, cy)`` of an object at ``position``, jittered by up to ``jitter`` of the side (x drawn first), its
    ``radius`` inside the picture."""
    return tuple(float(np.clip(f * size + rng.uniform(-jitter * size, jitter * size), radius, size - radius))
                 for f in POSITIONS[position])


def _draw_glyph_strips(rng, img, size):
    """Rows of short light bars (text-like), in the top and bottom bands of the poster."""
    rows = []
    for band in (0.04, 0.90):
        y0 = int(band * size)
        x = int(0.04 * size)
        while x < size * 0.94:
            w = int(rng.integers(max(1, size // 32), max(2, size // 10)))
            h = max(1, size // 21)
            img[y0 : y0 + h, x : x + w] = 0.85
            rows.append((x, y0, w, h))
            x += w + max(1, size // 32)
    return rows


def _draw_line(img, x0, y0, x1, y1, value=0.5):
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, n).round().astype(int).clip(0, img.shape[1] - 1)
    ys = np.linspace(y0, y1, n).round().astype(int).clip(0, img.shape[0] - 1)
    img[ys, xs] = value


def make_scene(rng: np.random.Generator, scene_type: str = "single", size: int = 64, n_objects: int | None = None,
               fixed: list[dict] | None = None, forbid_shapes: tuple[str, ...] = (),
               radius_range: tuple[float, float] = (0.12, 0.17), jitter: float = 0.03) -> Scene:
    """Render one scene.

    Args:
        rng: random generator (the only source of randomness).
        scene_type: one of :data:`SCENE_TYPES`.
        size: image side in pixels.
        n_objects: number of objects; defaults depend on the scene type.
        fixed: attribute dicts (keys among colour/shape/position) for the first objects; the rest
            are sampled. Colours and positions are always distinct within a scene.
        forbid_shapes: shapes the sampled (non-fixed) objects must not have.
        radius_range: object radius as a fraction of ``size``.
    """
    if scene_type not in SCENE_TYPES:
        raise InputError(f"unknown scene type {scene_type!r}; expected one of {SCENE_TYPES}")
    lo, hi = {"single": (1, 1), "overlap": (2, 3), "text": (1, 2), "clutter": (3, 4), "diagram": (2, 4)}[scene_type]
    fixed = list(fixed or [])
    if n_objects is None:
        n_objects = max(int(rng.integers(lo, hi + 1)), len(fixed))
    if not 1 <= n_objects <= 4:
        raise InputError(f"n_objects must be between 1 and 4, got {n_objects}")
    if len(fixed) > n_objects:
        raise InputError("more fixed objects than n_objects")

    used_c = {f["colour"] for f in fixed if "colour" in f}
    used_p = {f["position"] for f in fixed if "position" in f}
    specs = []
    for i in range(n_objects):
        spec = dict(fixed[i]) if i < len(fixed) else {}
        if "colour" not in spec:
            spec["colour"] = str(rng.choice([c for c in COLOURS if c not in used_c]))
            used_c.add(spec["colour"])
        if "shape" not in spec:
            spec["shape"] = str(rng.choice([s for s in SHAPES if s not in forbid_shapes] or list(SHAPES)))
        specs.append(spec)
    # positions: fixed first, then free ones; overlap scenes chain neighbours so objects touch
    for spec in specs:
        if "position" in spec:
            continue
        free = [p for p in POSITIONS if p not in used_p]
        if scene_type == "overlap" and used_p:
            near = [p for p in free if any(p in NEIGHBOURS[q] for q in used_p)]
            free = near or free
        spec["position"] = str(rng.choice(free))
        used_p.add(spec["position"])

    img = np.full((size, size, 3), BACKGROUND, np.float32)
    extras: dict = {}
    if scene_type == "clutter":
        img += rng.normal(0, 0.04, img.shape).astype(np.float32)
        dots = []
        for _ in range(int(rng.integers(6, 12))):
            x, y = rng.integers(0, size, 2)
            d = max(1, size // 32)
            img[y : y + d, x : x + d] = 0.55
            dots.append((int(x), int(y)))
        extras["dots"] = dots
    if scene_type == "text":
        extras["glyphs"] = _draw_glyph_strips(rng, img, size)
    r_lo, r_hi = (0.17, 0.20) if scene_type == "overlap" else radius_range
    objs = []
    for spec in specs:
        r = rng.uniform(r_lo, r_hi) * size
        cx, cy = _place(rng, spec["position"], size, r, jitter)
        objs.append(SceneObject(spec["colour"], spec["shape"], spec["position"], cx, cy, float(r)))
    if scene_type == "diagram":
        extras["lines"] = [(a.cx, a.cy, b.cx, b.cy) for a, b in zip(objs[:-1], objs[1:])]
        for line in extras["lines"]:
            _draw_line(img, *line)
    masks = np.zeros((len(objs), size, size), bool)
    for i, o in enumerate(objs):
        m = shape_mask(o.shape, o.cx, o.cy, o.radius, size)
        img[m] = COLOURS[o.colour]
        masks[:i, m] = False
        masks[i] = m
    np.clip(img, 0, 1, out=img)
    return Scene(scene_type, objs, img, masks, extras)


def grid_cover(masks: np.ndarray, grid) -> np.ndarray:
    """``[n, cells]`` share of each grid cell covered by each mask, row-major.

    ``grid``: a patch side in pixels (cells are exact ``patch x patch`` blocks; the side must divide
    the image) or ``(rows, cols)`` of the model's image tokens over the picture (cells of
    ``H/rows x W/cols`` pixels, any sizes: a 64-px scene under a 24 x 24 token grid).
    """
    n, h, w = masks.shape
    if isinstance(grid, (int, np.integer)):
        if h % grid or w % grid:
            raise InputError(f"image side {h}x{w} is not a multiple of the patch size {grid}")
        return masks.reshape(n, h // grid, grid, w // grid, grid).mean(axis=(2, 4)).reshape(n, -1)
    rows, cols = (int(x) for x in grid)
    # a cell covers pixel i with the overlap of [i, i+1) and the cell's span (fractional at the borders)
    def weights(edges, size):
        i = np.arange(size)
        lo, hi = edges[:-1, None], edges[1:, None]
        return np.clip(np.minimum(hi, i + 1) - np.maximum(lo, i), 0, None) / (hi - lo)
    wr, wc = weights(np.linspace(0, h, rows + 1), h), weights(np.linspace(0, w, cols + 1), w)  # [rows, H], [cols, W]
    return np.einsum("rh,nhw,cw->nrc", wr, masks.astype(np.float64), wc).reshape(n, -1)


def patch_grid_masks(masks: np.ndarray, grid, min_cover: float = 0.25) -> np.ndarray:
    """Which patches (grid cells) belong to which object.

    Args:
        masks: bool ``[n, H, W]``.
        grid: patch side in pixels, or ``(rows, cols)`` of image tokens (:func:`grid_cover`).
    Returns:
        int64 ``[cells]``: index of the object covering the cell (largest cover, at least
        ``min_cover`` of the cell), or -1 for background. Row-major, as vision towers order their
        patch tokens.
    """
    cover = grid_cover(masks, grid)
    return (np.full(cover.shape[1], -1, np.int64) if masks.shape[0] == 0  # (no object: all background)
            else np.where(cover.max(0) >= min_cover, cover.argmax(0), -1).astype(np.int64))
