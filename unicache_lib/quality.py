"""Image quality against a reference: PSNR and SSIM (float32, images in [0, 1] or uint8; channels last
``[N, H, W, C]`` as :func:`~unicache_lib.runtime.sampling.to_uint8` gives, or channels first ``[N, C, H, W]``
as :func:`~unicache_lib.runtime.sampling.sample` returns).

Used wherever a change to a generator (pruned heads, reused attention) is judged by what it does
to the picture: the reference is the unchanged model's image for the same prompt and seed.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .core.errors import InputError


PSNR_CAP = 100.0  # dB: bit-identical images have an infinite PSNR; it is capped here so that means stay finite


def _as_float(x) -> torch.Tensor:
    """``[N, H, W, C]`` (or ``[N, C, H, W]``: C of 1 or 3 first and not last) uint8 / float ->
    ``[N, C, H, W]`` float32 in [0, 1]; channels last wins when both ends could be channels."""
    t = torch.as_tensor(np.asarray(x.detach().cpu() if torch.is_tensor(x) else x))
    t = t[None] if t.dim() == 3 else t
    t = t.float() / 255.0 if t.dtype == torch.uint8 or t.max() > 1.5 else t.float()
    return t if t.shape[-1] not in (1, 3) and t.shape[1] in (1, 3) else t.permute(0, 3, 1, 2)  # (channels first already)


def psnr(images, reference, max_value: float = 1.0) -> np.ndarray:
    """Per-image PSNR in dB ``[N]``; identical images give ``inf``."""
    a, b = _as_float(images), _as_float(reference)
    if a.shape != b.shape:
        raise InputError(f"image shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    mse = ((a - b) ** 2).flatten(1).mean(1)
    with np.errstate(divide="ignore"):
        return (10 * np.log10(max_value**2 / mse.numpy())).astype(np.float64)


def ssim(images, reference, window: int = 7, sigma: float = 1.5) -> np.ndarray:
    """Per-image SSIM ``[N]`` (Wang et al. 2004; Gaussian window, channels averaged), 1 = identical."""
    a, b = _as_float(images), _as_float(reference)
    if a.shape != b.shape:
        raise InputError(f"image shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    c = a.shape[1]
    x = torch.arange(window, dtype=torch.float32) - (window - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    k = (g[:, None] * g[None, :]).expand(c, 1, window, window)

    def blur(t):
        return F.conv2d(t, k, groups=c)

    mu_a, mu_b = blur(a), blur(b)
    saa = blur(a * a) - mu_a**2
    sbb = blur(b * b) - mu_b**2
    sab = blur(a * b) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    m = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2))
    return m.flatten(1).mean(1).numpy().astype(np.float64)
