"""How a model in the shipped tiny layouts is fed: any checkpoint saved in them, not only the shipped ones.

- The plain LLaVA prompt (:data:`PROMPT`, no chat template, one image token per patch): :func:`encode` and
  :func:`pixel_values` build exactly what the processor produces, in padded batches; :func:`answer_logits` reads
  the first answer token's logits (:func:`unicache_lib.capture.runner.answer_logits` takes this path for a model
  in the layout).
- The tiny generator folder (``transformer/``, one ``text_encoder/``, ``tokenizer/``, ``scheduler/``: the same
  sub-folder layout as a diffusers pipeline repository): :class:`Generator`, which
  :func:`unicache_lib.runtime.loaders.load_generator` returns and :func:`unicache_lib.runtime.sampling.sample` drives
  with the library's pixel-space loop; its prompts are word-level (:func:`tokenize_prompts`, :func:`encode_prompts`).

The shipped models' architectures and how they are built are in :mod:`unicache_lib.zoo.tiny_llava` and
:mod:`unicache_lib.zoo.tiny_generators`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.errors import InputError
from ..core.models import first_token_logits

PROMPT = "user : <image> {question} assistant :"
MAX_TEXT = 48  # the tiny generators' text positions per prompt


def pixel_values(images_uint8: np.ndarray) -> torch.Tensor:
    """``[B, H, W, 3]`` uint8 -> ``[B, 3, H, W]`` float32 normalised like the image processor."""
    x = torch.from_numpy(np.ascontiguousarray(images_uint8)).float().div_(255.0)
    return x.permute(0, 3, 1, 2).sub_(0.5).div_(0.5).contiguous()


def encode(tokenizer, questions: list[str], answers: list[str] | None, n_image_tokens: int):
    """Token ids for a batch, identical to what the processor produces (tested).

    Returns ``input_ids [B, S]``, ``attention_mask [B, S]`` and, when answers are given,
    ``labels [B, S]`` (-100 everywhere except the answer tokens and the closing ``</s>``).
    Prompts without answers are left-padded (ready for generation); training batches are
    right-padded.
    """
    vocab = tokenizer.get_vocab()
    img = vocab["<image>"]
    rows, labs = [], []
    for i, q in enumerate(questions):
        prompt = ([vocab["<s>"], vocab["user"], vocab[":"]] + [img] * n_image_tokens
                  + [vocab.get(w, vocab["<unk>"]) for w in q.split()] + [vocab["assistant"], vocab[":"]])
        ans = [] if answers is None else [vocab[w] for w in answers[i].split()] + [vocab["</s>"]]
        rows.append(prompt + ans)
        labs.append([-100] * len(prompt) + ans)
    S = max(len(r) for r in rows)
    ids = torch.full((len(rows), S), vocab["<pad>"], dtype=torch.long)
    mask = torch.zeros((len(rows), S), dtype=torch.long)
    labels = torch.full((len(rows), S), -100, dtype=torch.long) if answers is not None else None
    for i, r in enumerate(rows):
        at = slice(S - len(r), None) if answers is None else slice(None, len(r))  # prompts alone: left pad
        ids[i, at] = torch.tensor(r)
        mask[i, at] = 1
        if labels is not None:
            labels[i, at] = torch.tensor(labs[i])
    return ids, mask, labels


def answer_logits(model, tokenizer, questions, images_uint8, batch=100) -> torch.Tensor:
    """``[N, vocab]`` float32 logits of the first answer token (gradients flow when enabled); the number of image
    tokens is the model's own (``config.image_seq_length``: 64 for tiny-llava, 576 for tiny-llava-576)."""
    vc = model.config.vision_config
    n_img = int(getattr(model.config, "image_seq_length", None) or (vc.image_size // vc.patch_size) ** 2)
    model.eval()

    def inputs_of(qs, imgs):
        ids, mask, _ = encode(tokenizer, qs, None, n_img)
        return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    pixel_values=pixel_values(imgs))
    return first_token_logits(model, inputs_of, questions, images_uint8, batch)


def tokenize_prompts(tokenizer, prompts: list[str], max_len: int = MAX_TEXT):
    """``input_ids [B, max_len]`` and ``attention_mask [B, max_len]``: ``<s> words </s>`` then padding.

    Unknown words map to ``<unk>``; prompts longer than ``max_len`` raise (no silent truncation).
    """
    vocab = tokenizer.get_vocab()
    ids = torch.full((len(prompts), max_len), vocab["<pad>"], dtype=torch.long)
    mask = torch.zeros((len(prompts), max_len), dtype=torch.long)
    for i, p in enumerate(prompts):
        row = [vocab["<s>"]] + [vocab.get(w, vocab["<unk>"]) for w in p.split()] + [vocab["</s>"]]
        if len(row) > max_len:
            raise InputError(f"prompt has {len(row)} tokens, more than the text encoder's {max_len}: {p[:60]!r}...")
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


@dataclass
class TextConditioning:
    """What the transformer needs from the prompt.

    ``hidden``: ``[B, T, D]`` per-token states; ``pooled``: ``[B, D]``; ``mask``: ``[B, T]`` (1 = real
    token). ``n_tokens``: real tokens per prompt (``<s>`` and ``</s>`` included).
    """

    hidden: torch.Tensor
    pooled: torch.Tensor
    mask: torch.Tensor

    @property
    def n_tokens(self) -> list[int]:
        return self.mask.sum(-1).tolist()


def encode_prompts(text_encoder, tokenizer, prompts: list[str]) -> TextConditioning:
    ids, mask = (t.to(text_encoder.device) for t in tokenize_prompts(tokenizer, prompts))
    out = text_encoder(input_ids=ids, attention_mask=mask)
    pooled = getattr(out, "text_embeds", None)
    if pooled is None:  # T5: mean of the real tokens' states (PixArt does not use it)
        m = mask[..., None].to(out.last_hidden_state.dtype)
        pooled = (out.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1)
    return TextConditioning(out.last_hidden_state, pooled, mask)


def transformer_forward(transformer, adapter, x, t, cond: TextConditioning):
    """One velocity prediction. ``x [B, 3, H, W]``; ``t [B]`` on the 0-1000 scale; the text arguments as the family
    adapter names them (``text_kwargs``)."""
    return transformer(hidden_states=x, timestep=t, **adapter.text_kwargs(cond.hidden, cond.pooled, cond.mask),
                       return_dict=False)[0]


@dataclass
class Generator:
    """A loaded tiny-layout text-to-image generator: the pieces plus its family's
    :class:`~unicache_lib.gen_families.base.GenFamily` adapter (SD3 or PixArt).

    Sampled by the library's own pixel-space loop (:func:`unicache_lib.runtime.sampling.sample`); a diffusers
    pipeline folder loads into :class:`~unicache_lib.runtime.pipelines.PipelineGenerator` instead, which has
    the same ``family`` / ``transformer`` / ``path`` / ``image_tokens`` / ``image_size`` / ``text_tokens``
    / ``pipe`` fields (``pipe`` is None here).
    """

    adapter: object  # the family's GenFamily (layer 2: not imported here)
    transformer: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    scheduler: object
    path: str = ""
    pipe: object = None  # no diffusers pipeline: the library's loop samples this generator

    @property
    def family(self) -> str:
        """The family's short tag (``"sd3"``, ``"pixart"``)."""
        return self.adapter.key

    @property
    def image_tokens(self) -> int:
        c = self.transformer.config
        return (c.sample_size // c.patch_size) ** 2

    @property
    def image_size(self) -> int:
        """Side of the generated (square, pixel-space) image in pixels."""
        return int(self.transformer.config.sample_size)

    @property
    def text_tokens(self) -> int:
        """Text positions per prompt the transformer sees (real tokens then padding)."""
        return MAX_TEXT

    def save_pretrained(self, out: str | Path) -> None:
        for part in ("transformer", "text_encoder", "tokenizer", "scheduler"):
            getattr(self, part).save_pretrained(Path(out) / part)
