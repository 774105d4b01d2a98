"""Which sequence positions are image tokens and which are text, and the four-block split.

Direction convention everywhere in the workbook: ``X->Y`` means *queries of X reading keys of Y*.
So ``text->image`` is the text tokens' attention on the image (what U5 measures) and
``image->text`` is the image tokens' attention on the text.
"""
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .errors import SpanError

TEXT, IMAGE = 0, 1
BLOCKS: tuple[str, ...] = ("image->image", "text->text", "image->text", "text->image")


@dataclass(frozen=True)
class Spans:
    """Modality of every position of one sequence: ``kinds[i]`` is TEXT (0) or IMAGE (1)."""

    kinds: tuple[int, ...]

    @classmethod
    def from_kinds(cls, kinds) -> "Spans":
        k = tuple(int(x) for x in np.asarray(kinds).ravel())
        bad = set(k) - {TEXT, IMAGE}
        if bad:
            raise SpanError(f"modality kinds must be 0 (text) or 1 (image); got {sorted(bad)}")
        return cls(k)

    @classmethod
    def joint(cls, n_image: int, n_text: int, image_first: bool = True) -> "Spans":
        """The MMDiT joint sequence ``[image tokens | text tokens]`` (SD3's layout)."""
        return cls(tuple([IMAGE] * n_image + [TEXT] * n_text if image_first else [TEXT] * n_text + [IMAGE] * n_image))

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.kinds, np.int8)

    @property
    def image_index(self) -> np.ndarray:
        return np.flatnonzero(self.array == IMAGE)

    @property
    def text_index(self) -> np.ndarray:
        return np.flatnonzero(self.array == TEXT)

    @property
    def n_image(self) -> int:
        return int((self.array == IMAGE).sum())

    @property
    def n_text(self) -> int:
        return len(self) - self.n_image

    def image_range(self) -> tuple[int, int]:
        """``(start, end)`` of the image block; raises when image tokens are not contiguous."""
        idx = self.image_index
        if len(idx) == 0:
            raise SpanError("the sequence has no image tokens")
        if idx[-1] - idx[0] + 1 != len(idx):
            raise SpanError("image tokens are not one contiguous block")
        return int(idx[0]), int(idx[-1]) + 1

    def check(self, seq_len: int, what: str = "attention map") -> None:
        if len(self) != seq_len:
            raise SpanError(
                f"modality spans cover {len(self)} positions but the {what} has {seq_len}: the spans "
                f"belong to another sequence (was input_ids truncated, padded or from another sample?)"
            )

    def to_json(self) -> dict:
        """Compact run-length form for the store index: ``{"runs": [[kind, length], ...]}``."""
        return {"runs": [[k, len(list(g))] for k, g in itertools.groupby(self.kinds)]}

    @classmethod
    def from_json(cls, d: dict) -> "Spans":
        return cls(tuple(k for k, n in d["runs"] for _ in range(n)))


def spans_from_input_ids(input_ids, image_token_id: int, expected_image_tokens: int | None = None) -> Spans:
    """Spans of one sequence from its token ids.

    Args:
        input_ids: ``[S]`` or ``[1, S]`` token ids.
        image_token_id: the model's image placeholder id (``model.config.image_token_id``).
        expected_image_tokens: when given, the number of image positions must match (e.g. 64 for
            the tiny LLaVA, 576 for LLaVA-1.5); a mismatch is an error, not a silent wrong split.
    """
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise SpanError(f"spans are per sample: got a batch of {ids.shape[0]} sequences; pass one row")
        ids = ids[0]
    sp = Spans(tuple((ids == image_token_id).to(torch.int8).tolist()))
    if expected_image_tokens is not None and sp.n_image != expected_image_tokens:
        raise SpanError(
            f"found {sp.n_image} image tokens (id {image_token_id}) but the model expects "
            f"{expected_image_tokens}: check the processor's patch_size / num_additional_image_tokens"
        )
    return sp
