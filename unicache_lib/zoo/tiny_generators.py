"""The tiny text-to-image generators: an MMDiT (SD3 class) and a cross-attention DiT (PixArt class).

Both are stock diffusers transformers in pixel space (32x32 RGB, patch 4 -> 64 image tokens),
conditioned by a small text encoder over the world's word-level tokenizer, as their real
counterparts are: a ``CLIPTextModelWithProjection`` for the MMDiT (per-token states plus the pooled
vector SD3 feeds to its adaLN) and a bidirectional ``T5EncoderModel`` for PixArt (which reads the
prompt only through cross-attention; with a *causal* CLIP encoder its image queries settled on the
first tokens, whose states never see the position words at the end of the prompt). Trained with
rectified flow (the objective of diffusers' ``FlowMatchEulerDiscreteScheduler``).

A checkpoint folder holds ``transformer/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/`` and
``model_card.json``, the same sub-folder layout as a diffusers pipeline repository; how a generator in it is loaded
and fed (:class:`~unicache_lib.runtime.tiny_layouts.Generator`) is in :mod:`unicache_lib.runtime.tiny_layouts`, its
training distribution is :func:`unicache_lib.world.text.generation_example`.
"""
from __future__ import annotations

from ..core.compat import diffusers, transformers
from ..core.errors import InputError
from ..runtime.tiny_layouts import MAX_TEXT
from ..world.text import GENERATED_SIZE as IMAGE_SIZE

PATCH = 4


def build_text_encoder(tokenizer, hidden=128, layers=2, kind: str = "clip", max_positions: int = MAX_TEXT,
                       projection: bool = True):
    """A tiny text encoder: ``"clip"`` (causal, with a pooled projection; ``projection=False``: a plain
    ``CLIPTextModel``, as Flux uses) or ``"t5"`` (bidirectional). ``max_positions``: CLIP's position
    table (77 in real checkpoints)."""

    if kind == "t5":
        cfg = transformers.T5Config(vocab_size=len(tokenizer), d_model=hidden, d_kv=hidden // 4, d_ff=4 * hidden,
                                    num_layers=layers, num_heads=4, pad_token_id=tokenizer.pad_token_id,
                                    eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
        return transformers.T5EncoderModel(cfg)
    if kind != "clip":
        raise InputError(f"text encoder kind must be 'clip' or 't5', got {kind!r}")
    cfg = transformers.CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      max_position_embeddings=max_positions, projection_dim=hidden,
                                      bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return transformers.CLIPTextModelWithProjection(cfg) if projection else transformers.CLIPTextModel(cfg)


def build_transformer(adapter, text_dim=128, layers=4, heads=4, head_dim=32):
    """The pixel-space transformer of a generator family (its :class:`~unicache_lib.gen_families.base.GenFamily`
    adapter's ``pixel_transformer``): 32 x 32 RGB, patch 4, ``text_dim``-wide text states."""

    kw = adapter.pixel_transformer(IMAGE_SIZE, PATCH, text_dim, layers, heads, head_dim)
    return getattr(diffusers, adapter.transformer_classes[0])(**kw)
