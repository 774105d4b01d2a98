"""Modality-neglect detector (claims U9, U10): does the text still read the image, layer by layer?

Signal per layer: the share of the text queries' attention mass that lands on image keys, mean
over heads and samples, from stats-mode capture records (``blocks``). The study's thresholds: under
~15% in a concatenation model the text is not reaching the image (warning); under ~5% a layer marks
a modality cut-off (the detector fires and names the first such layer).
"""
from dataclasses import dataclass

import numpy as np
import torch

from ..capture.runner import inputs_for
from ..claims import NEGLECT_CUTOFF, NEGLECT_WARN
from ..core.errors import AttentionValueError, InputError
from ..core.modality import BLOCKS
from ..core.scoring import kl_divergence

WARN, CUTOFF = NEGLECT_WARN, NEGLECT_CUTOFF  # U9's and U10's thresholds: written once, in unicache_lib/claims.py


def text_image_share_per_sample(records) -> tuple[list[str], np.ndarray]:
    """Sample ids and ``[n_samples, n_layers]``: text queries' share of attention on image keys
    (mean over heads), per sample and layer (for intervals over samples)."""
    cells: dict[tuple[str, int], float] = {}
    records = list(records)
    if len(parts := sorted({r.part for r in records})) > 1:  # one verdict over self- and cross-attention would mix
        raise InputError(f"records of {len(parts)} parts ({', '.join(parts)}): pass one part's, e.g. "
                         f"[r for r in records if r.part == {parts[-1]!r}]")
    for r in records:
        if r.part == "cross" or getattr(r, "spans", None) is not None and not r.spans.n_image:  # 1 or 0 by construction
            raise AttentionValueError(f"not measurable here: layer {r.layer} ({r.part}) " + (
                "reads only the image (a cross-attention layer)" if r.part == "cross" else "holds no image positions "
                "(the image enters through cross-attention layers)") + "; the detector reads self-attention layers "
                "that hold the image")
        if "blocks" not in r.data:
            raise InputError("records lack 'blocks': capture in stats mode with modality spans")
        b = r.data["blocks"].float()  # [H, 4] shares of all mass
        ti, tt = b[:, BLOCKS.index("text->image")], b[:, BLOCKS.index("text->text")]
        cells[(str(r.sample), r.layer)] = float((ti / (ti + tt).clamp(min=1e-12)).mean())
    samples = sorted({s for s, _ in cells})
    layers = sorted({li for _, li in cells})
    if (missing := [(s, li) for s in samples for li in layers if (s, li) not in cells]):
        raise InputError(f"records miss {len(missing)} (sample, layer) cells, e.g. {missing[0]}: capture every layer of "
                         "every sample")
    # a NaN compares False with every threshold: it would read as "healthy"
    if (bad := [(s, li) for s in samples for li in layers if not np.isfinite(cells[s, li])]):
        raise AttentionValueError(f"not measurable: {len(bad)} of {len(cells)} (sample, layer) cells have a NaN or "
                                  f"infinite share of image attention (e.g. sample {bad[0][0]}, layer {bad[0][1]}), so "
                                  f"the neglect detector cannot judge them: recapture in float32 (a half-precision "
                                  f"overflow is the usual cause) and check the model's attention for NaN")
    return samples, np.array([[cells[s, li] for li in layers] for s in samples])


def text_image_share(records) -> np.ndarray:
    """``[n_layers]``: text queries' share of attention on image keys (mean over samples, heads)."""
    return text_image_share_per_sample(records)[1].mean(0)


@dataclass
class NeglectVerdict:
    """``shares[i]``: captured layer ``layers[i]``'s share; ``first_cutoff_layer`` and ``warn_layers`` are positions
    in ``layers`` (a capture of ``layers=[0, 15, 31]`` has three); the text names the layers and the thresholds used."""
    shares: np.ndarray
    fires: bool
    first_cutoff_layer: int | None
    warn_layers: list[int]
    layers: list[int] | None = None  # the captured layer numbers (default 0..n-1)
    cutoff: float = CUTOFF
    warn: float = WARN

    def __str__(self) -> str:
        L = list(range(len(self.shares))) if self.layers is None else self.layers
        s = "image share of text queries' reads " + ", ".join(f"L{li} {v:.1%}" for li, v in zip(L, self.shares))
        if self.fires:
            return f"MODALITY CUT-OFF from layer {L[self.first_cutoff_layer]} (share < {self.cutoff:.0%}): {s}"
        return (f"warning: text reads the image weakly in layers {[L[i] for i in self.warn_layers]} "
                f"(< {self.warn:.0%}): {s}" if self.warn_layers else f"healthy: {s}")


def detect_neglect(records, cutoff: float = CUTOFF, warn: float = WARN) -> NeglectVerdict:
    """Fires when any layer's image share of the text queries' reads is below ``cutoff``. Records whose shares are
    NaN or infinite are refused (:class:`AttentionValueError`, "not measurable"), never called healthy."""
    for what, v in (("cutoff", cutoff), ("warn", warn)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not 0 <= float(v) <= 1:
            raise InputError(f"{what} must be a share in [0, 1] (the study's: cutoff {CUTOFF}, warn {WARN}), got {v!r}")
    records = list(records)
    sh = text_image_share(records)
    low = [i for i, v in enumerate(sh) if v < cutoff]
    return NeglectVerdict(sh, bool(low), low[0] if low else None, [i for i, v in enumerate(sh) if v < warn],
                          sorted({r.layer for r in records}), float(cutoff), float(warn))


def image_dependence(model, processor, samples, seed: int = 0) -> float:
    """Mean KL(answer with its image || answer with another sample's image) over ``samples``: how much
    the answers depend on the image at all. Near 0 = the image is ignored, whatever the attention
    shares say (the complement the attention-share detector needs, see notebook 07)."""
    def answer_logits(image, question):
        return model(**inputs_for(model, processor, image, question)).logits[0, -1]

    perm = np.random.default_rng(seed).permutation(len(samples))
    perm = np.where(perm == np.arange(len(samples)), np.roll(perm, 1), perm)
    with torch.no_grad():
        return float(np.mean([float(kl_divergence(answer_logits(s.image, s.question),
                                                  answer_logits(samples[perm[i]].image, s.question)))
                              for i, s in enumerate(samples)]))
