"""A prompt cut after its last image token: the context (cached once) and the question (answered on the cache).

    split = split_prompt(processor, image, question, model=model)      # context_ids | question_ids
    splits = split_prompts(processor, images, questions, model)        # many, in one processor call

The split carries the model's family adapter, resolved once here: every later step (prefill, answer, the batch
path) reads ``split.family`` instead of looking it up again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..capture.runner import to_model
from ..core.errors import ContractError, InputError, PromptError, UnsupportedModelError
from ..core.models import placement
from ..families import FAMILIES, family_of, supported
from ..inputs import encode, encode_batch


@dataclass
class PromptSplit:
    """``context_ids [1, C]`` (ends with the last image token), ``question_ids [1, Q]``, the processor
    output of the whole prompt (``inputs``), which context positions are image tokens
    (``image_positions [n_image]``) and the family adapter, resolved once when the prompt is split
    (:func:`split_inputs`): every later step reads it here."""

    context_ids: torch.Tensor
    question_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_positions: torch.Tensor
    extra: dict
    inputs: dict = field(default_factory=dict)
    family: object = None

    def __post_init__(self):
        if self.family is None:
            raise ContractError("a PromptSplit needs its family adapter: build it with split_prompt(..., model=model), "
                                "split_prompts or split_inputs(family, ...)")

    @property
    def full_ids(self) -> torch.Tensor:
        return torch.cat([self.context_ids, self.question_ids], 1)


def _family_of_processor(processor):
    name = type(processor).__name__
    for fam in FAMILIES.values():
        if name == f"{fam.model_class.replace('ForConditionalGeneration', '')}Processor":
            return fam
    raise UnsupportedModelError(f"cannot tell the model family from a {name}: pass model= (supported: {supported()})")


def split_prompt(processor, image, question: str | None, image_token_id: int | None = None, model=None, *,
                 prompt: str | None = None) -> PromptSplit:
    """Encode one (image, question) prompt and cut it after the last image token.

    ``model`` (recommended) names the family; without it the family is inferred from the processor's
    class. Per-token processor outputs (``token_type_ids``, Mllama's ``cross_attention_mask``) are
    cut with the ids. The image and the prompt (``prompt``: a whole prompt of your own instead of the
    family's template around ``question``) are checked by :func:`unicache_lib.inputs.encode`.
    """
    fam = family_of(model) if model is not None else _family_of_processor(processor)
    return split_inputs(fam, dict(encode(processor, image, question, fam, prompt)),
                        _image_token_id(processor, fam) if image_token_id is None else image_token_id)


def _image_token_id(processor, fam) -> int:
    """The processor's image token id (its attribute, or its image token through the tokenizer)."""
    if fam.image_marker is None:  # ViLT, CLIP: a raw AttributeError on the processor's image_token
        raise InputError(f"{fam.name} puts no image token in its text and keeps no KV cache of the image: prompt "
                         "splitting and eviction are for vision-language decoders (LLaVA, Qwen2-VL, ...)")
    tid = getattr(processor, "image_token_id", None)
    return processor.tokenizer.convert_tokens_to_ids(processor.image_token) if tid is None else tid


def split_prompts(processor, images, questions, model) -> list[PromptSplit]:
    """:func:`split_prompt` for many (image, question) pairs, encoded in one processor call
    (:func:`~unicache_lib.inputs.encode_batch`); each split equals :func:`split_prompt`'s for its pair."""
    fam = family_of(model)
    tid = _image_token_id(processor, fam)
    return [split_inputs(fam, enc, tid) for enc in encode_batch(processor, images, questions, fam)]


def split_inputs(family, enc: dict, image_token_id: int) -> PromptSplit:
    """:func:`split_prompt` for inputs already encoded (e.g. built by hand when a processor is not
    available): ``enc`` holds ``input_ids [1, S]`` and the image inputs; ``image_token_id`` is the
    token after whose last occurrence the context ends (``model.config.image_token_id``)."""
    ids = enc["input_ids"]
    if ids.shape[0] != 1:
        raise InputError(f"one prompt at a time: got a batch of {ids.shape[0]}")
    tid = int(image_token_id)
    img = (ids[0] == tid).nonzero().flatten()
    if len(img) == 0:
        raise PromptError(f"the prompt has no image token (id {tid}): the processor did not insert the image; put the "
                          f"family's image marker {family.image_marker!r} in the prompt where the image goes, or build the "
                          f"inputs with split_prompt(processor, image, question, model=model)")
    cut = int(img[-1]) + 1
    S = ids.shape[1]
    extra = {k: v[:, :cut] if k in family.token_fields and torch.is_tensor(v) and v.dim() >= 2 and v.shape[1] == S else v
             for k, v in enc.items() if k not in ("input_ids", "attention_mask", "pixel_values", "labels")}
    image_positions = torch.empty(0, dtype=torch.long) if family.cross_attention else img
    return PromptSplit(ids[:, :cut], ids[:, cut:], enc.get("pixel_values"), image_positions, extra, dict(enc), family)


def full_positions(fam, model, split: PromptSplit):
    """The family's own position ids of the whole prompt (M-RoPE), or None where positions are 0..S-1."""
    dev, dtype = placement(model)
    return fam.position_ids(model, split.full_ids.to(dev), to_model(split.inputs, dev, dtype))
