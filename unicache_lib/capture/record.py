"""What a capture records: one :class:`Record` per (sample, layer, part, step), kept in a
:class:`CaptureResult` that is indexable like TransformerLens' cache (negative layers allowed)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import stats as S
from ..core.errors import InputError, UnknownNameError
from ..core.modality import TEXT, Spans
from ..inputs import resolve_layers


@dataclass
class Record:
    """One layer's attention for one sample.

    ``data`` holds CPU tensors: in full mode ``{"probs": [H, Sq, Sk] float32, "visible": [Sq, Sk] bool}``
    (the probabilities and the mask the model applied), in stats mode the float32
    :data:`~unicache_lib.stats.LAYER_STATS` dict. ``part``: ``language``, ``cross`` (queries are the
    text positions, keys the vision tokens), ``vision``, or a generator's part. ``step`` is the denoising step for
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
            raise UnknownNameError(f"record {self.key} was captured in {self.mode!r} mode and holds no probabilities; "
                           f"capture with mode='full' to keep the maps")
        return self.data["probs"]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.data.values())

    @property
    def visible(self) -> torch.Tensor:
        """``[Sq, Sk]`` bool: the keys each query could see under the mask the model applied."""
        if "visible" not in self.data:
            raise UnknownNameError(f"record {self.key} holds no mask (captured in {self.mode!r} mode, or by a version that did "
                           f"not keep masks): capture it again in full mode")
        return self.data["visible"] > 0.5 if self.data["visible"].dtype != torch.bool else self.data["visible"]

    def statistics(self) -> dict[str, torch.Tensor]:
        """:func:`~unicache_lib.stats.layer_statistics` of a full-mode map, under its own mask, spans and
        part (what stats mode would have recorded; strided maps excepted)."""
        if self.query_stride > 1 or self.key_stride > 1:
            raise InputError(f"record {self.key} is strided: its statistics would not be the layer's")
        P = self.probs
        sq, sk = P.shape[-2:]
        cross = self.part == "cross"
        return S.layer_statistics(P, self.spans, self.visible, None if cross else torch.arange(sk - sq, sk),
                                  [TEXT] * sq if cross else None)


@dataclass(eq=False)
class CaptureResult:
    """Records of one capture, in capture order.

    ``result[layer]`` -> the record of that layer for the only (or first) sample;
    ``result[sample, layer]`` / ``result[sample, layer, step]`` for more; ``result.layers``,
    ``result.samples``; iteration yields records.
    """

    part: str = "language"
    records: list[Record] = field(default_factory=list)

    @classmethod
    def from_records(cls, records, part: str = "language") -> "CaptureResult":
        """Wrap records (e.g. read back from a store)."""
        return cls(part, list(records))

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
        """Records matching every given field; ``layer`` may be negative (``-1``: the last captured
        layer; out of range: :class:`~unicache_lib.inputs.LayerError` naming the captured layers)."""
        if layer is not None and layer < 0:
            layer = resolve_layers([layer], self.layers, "the capture result")[0]
        return [r for r in self.records
                if (sample is None or r.sample == sample) and (layer is None or r.layer == layer)
                and (part is None or r.part == part) and (step is None or r.step == step)]

    def __getitem__(self, key) -> Record:
        sample, layer, step = (*key, None)[:3] if isinstance(key, tuple) else (None, key, None)
        found = self.select(sample, layer, None, step)
        if len({r.part for r in found}) > 1:  # e.g. language and vision layer 0: the result's own part first
            found = [r for r in found if r.part == self.part] or found
        if not found:
            raise UnknownNameError(f"no record for sample={sample!r} layer={layer} step={step}; captured layers: "
                           f"{self.layers}, samples: {self.samples[:5]}{'...' if len(self.samples) > 5 else ''}")
        return found[0]
