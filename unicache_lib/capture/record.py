"""What a capture records: one :class:`Record` per (sample, layer, part, step), kept in a
:class:`CaptureResult` that is indexable like TransformerLens' cache (negative layers allowed)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..modality import Spans


@dataclass
class Record:
    """One layer's attention for one sample.

    ``data`` holds float32 CPU tensors: ``{"probs": [H, Sq, Sk]}`` in full mode, the
    :data:`~unicache_lib.stats.LAYER_STATS` dict in stats mode. ``step`` is the denoising step for
    generators (-1 for understanding models). ``query_stride`` / ``key_stride`` say how a full
    map was thinned (1 = every position).
    """

    sample: str
    layer: int
    part: str
    mode: str
    data: dict[str, torch.Tensor]
    spans: Spans | None = None
    step: int = -1
    seq_len: int = 0
    heads: int = 0
    query_stride: int = 1
    key_stride: int = 1
    meta: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.sample, self.part, self.layer, self.step)

    @property
    def probs(self) -> torch.Tensor:
        if "probs" not in self.data:
            raise KeyError(f"record {self.key} was captured in {self.mode!r} mode and holds no probabilities; "
                           f"capture with mode='full' to keep the maps")
        return self.data["probs"]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.data.values())


class CaptureResult:
    """Records of one capture, in capture order.

    ``result[layer]`` -> the record of that layer for the only (or first) sample;
    ``result[sample, layer]`` / ``result[sample, layer, step]`` for more; ``result.layers``,
    ``result.samples``; iteration yields records.
    """

    def __init__(self, part: str = "language"):
        self.records: list[Record] = []
        self.part = part

    @classmethod
    def from_records(cls, records, part: str = "language") -> "CaptureResult":
        """Wrap records (e.g. read back from a store)."""
        res = cls(part)
        res.records = list(records)
        return res

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def layers(self) -> list[int]:
        return sorted({r.layer for r in self.records})

    @property
    def samples(self) -> list[str]:
        return list(dict.fromkeys(r.sample for r in self.records))

    @property
    def steps(self) -> list[int]:
        return sorted({r.step for r in self.records})

    def nbytes(self) -> int:
        return sum(r.nbytes() for r in self.records)

    def select(self, sample=None, layer=None, part=None, step=None) -> list[Record]:
        layers = self.layers
        if layer is not None and layer < 0:
            layer = layers[layer]
        return [r for r in self.records
                if (sample is None or r.sample == sample) and (layer is None or r.layer == layer)
                and (part is None or r.part == part) and (step is None or r.step == step)]

    def __getitem__(self, key) -> Record:
        if not isinstance(key, tuple):
            key = (None, key)
        sample, layer, *rest = key
        step = rest[0] if rest else None
        found = self.select(sample, layer, self.part if any(r.part == self.part for r in self.records) else None, step)
        if not found:
            raise KeyError(f"no record for sample={sample!r} layer={layer} step={step}; captured layers: "
                           f"{self.layers}, samples: {self.samples[:5]}{'...' if len(self.samples) > 5 else ''}")
        return found[0]

    def stack(self, name: str, part: str | None = None, sample=None) -> np.ndarray:
        """One statistic for every layer of a sample, stacked: ``[L, ...]`` as numpy."""
        rs = sorted(self.select(sample or self.samples[0], part=part or self.part), key=lambda r: r.layer)
        return np.stack([r.data[name].numpy() for r in rs])
