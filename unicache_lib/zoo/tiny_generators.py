"""The tiny text-to-image generators: an MMDiT (SD3 class) and a cross-attention DiT (PixArt class).

Both are stock diffusers transformers in pixel space (32x32 RGB, patch 4 -> 64 image tokens),
conditioned by a small text encoder over the world's word-level tokenizer, as their real
counterparts are: a ``CLIPTextModelWithProjection`` for the MMDiT (per-token states plus the pooled
vector SD3 feeds to its adaLN) and a bidirectional ``T5EncoderModel`` for PixArt (which reads the
prompt only through cross-attention; with a *causal* CLIP encoder its image queries settled on the
first tokens, whose states never see the position words at the end of the prompt). Trained with
rectified flow (the objective of diffusers' ``FlowMatchEulerDiscreteScheduler``).

A checkpoint folder holds ``transformer/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/`` and
``model_card.json``, the same sub-folder layout as a diffusers pipeline repository.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.errors import InputError
from ..world.scenes import make_scene
from ..world.text import long_prompt, short_prompt

IMAGE_SIZE, PATCH, MAX_TEXT = 32, 4, 48


def build_text_encoder(tokenizer, hidden=128, layers=2, kind: str = "clip", max_positions: int = MAX_TEXT,
                       projection: bool = True):
    """A tiny text encoder: ``"clip"`` (causal, with a pooled projection; ``projection=False``: a plain
    ``CLIPTextModel``, as Flux uses) or ``"t5"`` (bidirectional). ``max_positions``: CLIP's position
    table (77 in real checkpoints)."""
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,  # local: heavy builder path
                              T5Config, T5EncoderModel)

    if kind == "t5":
        cfg = T5Config(vocab_size=len(tokenizer), d_model=hidden, d_kv=hidden // 4, d_ff=4 * hidden,
                       num_layers=layers, num_heads=4, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
        return T5EncoderModel(cfg)
    if kind != "clip":
        raise InputError(f"text encoder kind must be 'clip' or 't5', got {kind!r}")
    cfg = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=max_positions,
                         projection_dim=hidden, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return CLIPTextModelWithProjection(cfg) if projection else CLIPTextModel(cfg)


def build_transformer(adapter, text_dim=128, layers=4, heads=4, head_dim=32):
    """The pixel-space transformer of a generator family (its :class:`~unicache_lib.gen_families.base.GenFamily`
    adapter's ``pixel_transformer``): 32 x 32 RGB, patch 4, ``text_dim``-wide text states."""
    import diffusers  # local: heavy builder path (diffusers)

    kw = adapter.pixel_transformer(IMAGE_SIZE, PATCH, text_dim, layers, heads, head_dim)
    return getattr(diffusers, adapter.transformer_classes[0])(**kw)


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

    Sampled by the library's own pixel-space loop (:func:`unicache_lib.zoo.sampling.sample`); a diffusers
    pipeline folder loads into :class:`~unicache_lib.zoo.pipelines.PipelineGenerator` instead, which has
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
        out = Path(out)
        self.transformer.save_pretrained(out / "transformer")
        self.text_encoder.save_pretrained(out / "text_encoder")
        self.tokenizer.save_pretrained(out / "tokenizer")
        self.scheduler.save_pretrained(out / "scheduler")


RADIUS = (0.16, 0.20)


def training_example(rng: np.random.Generator):
    """One (scene, prompt) of the shipped generators' training distribution: one object (70%) or two, a short or a
    long prompt."""
    n = 1 if rng.random() < 0.7 else 2
    sc = make_scene(rng, "single", IMAGE_SIZE, n_objects=n, radius_range=RADIUS)
    objs = sc.describe()
    prompt = short_prompt(objs) if rng.random() < 0.5 else long_prompt(objs, rng)
    return sc, prompt
