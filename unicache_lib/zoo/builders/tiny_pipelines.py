"""Random-weight diffusers pipeline folders built in code: what the pipeline tests load, and the parts the
real-shape generator stand-ins (:mod:`unicache_lib.zoo.builders.gen_standins`) are assembled from.

    pipe = build_pipeline("flux-dev", tiny_transformer("flux-dev"))   # any transformer of the kind
    save_pipeline(pipe, out, {"image_size": 16})                      # model_index.json + model_card.json

Every component is the class the real pipeline ships, so ``DiffusionPipeline.from_pretrained`` takes the
real code path: tokenizers (``CLIPTokenizer``, ``T5TokenizerFast``, ``GemmaTokenizerFast``) trained here
on the world's vocabulary (every world word is one token; the pipelines pad to their real lengths: CLIP 77,
T5 / Gemma ``max_sequence_length``), tiny random text encoders whose widths are read off the transformer's
config, a tiny random VAE with the real latent channels and down-sampling structure (``AutoencoderKL``,
Sana's ``AutoencoderDC``), and the real scheduler class and settings of each checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

import diffusers
import torch
from transformers import CLIPTokenizer, Gemma2Config, Gemma2Model, GemmaTokenizerFast, T5TokenizerFast
from tokenizers import trainers
from diffusers import AutoencoderDC, AutoencoderKL, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

from ...core.errors import InputError, UnknownNameError
from ...world.text import vocabulary
from ..checksums import write_card
from ..tiny_generators import build_text_encoder
from .tiny_random import TINY

# kind -> (pipeline class, family tag); the family tag is what load_generator reports
KINDS = {
    "sd3": ("StableDiffusion3Pipeline", "sd3"),
    "sd3.5": ("StableDiffusion3Pipeline", "sd3"),
    "pixart-alpha": ("PixArtAlphaPipeline", "pixart"),
    "pixart-sigma": ("PixArtSigmaPipeline", "pixart"),
    "flux-schnell": ("FluxPipeline", "flux"),
    "flux-dev": ("FluxPipeline", "flux"),
    "sana": ("SanaPipeline", "sana"),
}
# the tiny transformer of each kind: a tiny_random.TINY config plus what makes the kind
TINY_TRANSFORMERS = {
    "sd3": ("sd3", {}), "sd3.5": ("sd3.5", {}),
    # PixArt predicts noise and variance: out_channels = 2 x latent channels, as the real checkpoints
    "pixart-alpha": ("pixart", {"out_channels": 8}), "pixart-sigma": ("pixart", {"out_channels": 8}),
    "flux-schnell": ("flux", {}), "flux-dev": ("flux", {"guidance_embeds": True}),
    "sana": ("sana", {}),
}
# the real checkpoints' VAE scaling (SD3 and Flux: 16 latent channels, no quant convs; PixArt: the SD VAE)
VAE_SETTINGS = {
    "sd3": dict(scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False),
    "flux": dict(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False),
    "pixart": dict(scaling_factor=0.18215),
}
CLIP_LENGTH = 77


def _family(kind: str) -> str:
    if kind not in KINDS:
        raise UnknownNameError(f"unknown pipeline kind {kind!r}; kinds: {', '.join(KINDS)}")
    return KINDS[kind][1]


# ---- tokenizers -------------------------------------------------------------------------------------

def _train_bpe(tokenizer_cls, words: list[str], special: list[str], **trainer_kw) -> tuple[dict, list]:
    """Train the BPE backend of ``tokenizer_cls`` (its own normalizer and pre-tokenizer) on ``words``:
    ``(vocab, merges)`` under which each word is one token."""
    backend = tokenizer_cls().backend_tokenizer
    backend.train_from_iterator(words, trainers.BpeTrainer(vocab_size=1 << 20, special_tokens=special,
                                                           show_progress=False, **trainer_kw))
    model = json.loads(backend.to_str())["model"]
    return model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def clip_tokenizer(max_length: int = CLIP_LENGTH):
    """A ``CLIPTokenizer`` (byte-level BPE, ``<|startoftext|> ... <|endoftext|>``, padded with
    ``<|endoftext|>``) over the world's vocabulary; ``model_max_length`` is what SD3 / Flux pad CLIP to."""
    special = ["<|startoftext|>", "<|endoftext|>"]
    vocab, merges = _train_bpe(CLIPTokenizer, vocabulary(), special, end_of_word_suffix="</w>")
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def t5_tokenizer():
    """A ``T5TokenizerFast`` (Unigram, ``▁word`` pieces, ``</s>`` appended, ``<pad>`` = 0) over the world's
    vocabulary."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("▁" + w, -1.0) for w in vocabulary()]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def gemma_tokenizer():
    """A ``GemmaTokenizerFast`` (BPE on ``▁``-joined text, as Gemma 2's) over the world's vocabulary."""
    words = vocabulary()
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    vocab, merges = _train_bpe(GemmaTokenizerFast, words + ["▁" + w for w in words], special)
    return GemmaTokenizerFast(vocab=vocab, merges=merges)


# ---- text encoders, VAE, scheduler ------------------------------------------------------------------

def clip_encoder(tokenizer, width: int, layers: int = 1, projection: bool = True):
    """A random ``CLIPTextModelWithProjection`` (SD3; ``projection=False``: ``CLIPTextModel``, Flux) with
    77 positions; pooled / hidden width ``width``."""
    return build_text_encoder(tokenizer, width, layers, "clip", max_positions=CLIP_LENGTH, projection=projection)


def t5_encoder(tokenizer, width: int, layers: int = 1):
    """A random ``T5EncoderModel`` of ``d_model = width`` (relative positions: any prompt length)."""
    return build_text_encoder(tokenizer, width, layers, "t5")


def gemma2_encoder(tokenizer, width: int, layers: int = 1):
    """A random ``Gemma2Model`` (Sana's text encoder) of hidden size ``width``."""
    cfg = Gemma2Config(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                       num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=width // 2,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    return Gemma2Model(cfg)


def vae(family: str, latent_channels: int, channels: int = 8, blocks: int = 4):
    """A random VAE of ``family``: ``AutoencoderKL`` with ``blocks`` resolution levels (4: the real 8x
    down-sampling) of ``channels`` channels (real: 128-512), the real latent channels and scaling; Sana:
    ``AutoencoderDC`` (``blocks`` levels: 2^(blocks-1) down-sampling; real DC-AE: 6 levels, 32x)."""
    if family == "sana":
        n = blocks
        return AutoencoderDC(
            in_channels=3, latent_channels=latent_channels, attention_head_dim=channels // 2,
            encoder_block_types=("ResBlock",) * (n - 1) + ("EfficientViTBlock",),
            decoder_block_types=("ResBlock",) * (n - 1) + ("EfficientViTBlock",),
            encoder_block_out_channels=(channels,) * n, decoder_block_out_channels=(channels,) * n,
            encoder_layers_per_block=(1,) * n, decoder_layers_per_block=(1,) * n,
            encoder_qkv_multiscales=((),) * (n - 1) + ((5,),), decoder_qkv_multiscales=((),) * (n - 1) + ((5,),),
            downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
            decoder_act_fns="silu", scaling_factor=0.41407)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks, block_out_channels=(channels,) * blocks, layers_per_block=1,
        latent_channels=latent_channels, norm_num_groups=min(channels, 32), **VAE_SETTINGS[family])


def scheduler(kind: str):
    """The scheduler class and settings of the real checkpoints of ``kind``."""
    fam = _family(kind)
    if fam == "sd3":
        return FlowMatchEulerDiscreteScheduler(shift=3.0)
    if fam == "pixart":  # linear betas 1e-4..0.02, DPM-Solver++ order 2, epsilon prediction
        return DPMSolverMultistepScheduler()
    if kind == "flux-dev":  # resolution-dependent shift
        return FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                               base_image_seq_len=256, max_image_seq_len=4096)
    if kind == "flux-schnell":
        return FlowMatchEulerDiscreteScheduler(shift=1.0)
    return DPMSolverMultistepScheduler(flow_shift=3.0, prediction_type="flow_prediction", use_flow_sigmas=True,
                                       solver_type="midpoint", final_sigmas_type="zero")  # Sana


# ---- pipelines --------------------------------------------------------------------------------------

def tiny_transformer(kind: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """The tiny random transformer of ``kind`` (2-3 blocks, 2 heads of 8; :mod:`~unicache_lib.zoo.builders.tiny_random`)."""
    _family(kind)  # a known kind
    base, extra = TINY_TRANSFORMERS[kind]
    cls, kw = TINY[base]
    torch.manual_seed(seed)
    model = getattr(diffusers, cls)(**(kw | extra)).eval()
    return model if dtype == torch.float32 else model.to(dtype)


def build_pipeline(kind: str, transformer, text_layers: int = 1, vae_channels: int = 8, vae_blocks: int = 4,
                   seed: int = 0):
    """The pipeline of ``kind`` around ``transformer``, with random tiny text encoders sized to its config
    (SD3: two CLIPs of ``pooled_projection_dim / 2`` and a T5 of ``joint_attention_dim``; Flux: a CLIP of
    ``pooled_projection_dim`` and a T5 of ``joint_attention_dim``; PixArt: a T5, Sana: a Gemma 2 of
    ``caption_channels``), a random VAE with the transformer's latent channels, and the real scheduler."""
    fam = _family(kind)
    c = transformer.config
    torch.manual_seed(seed)
    parts = {"transformer": transformer, "scheduler": scheduler(kind)}
    if fam == "sd3":
        if c.pooled_projection_dim % 2 or c.pooled_projection_dim > c.joint_attention_dim:
            raise InputError("SD3 needs an even pooled_projection_dim (two CLIPs) no wider than joint_attention_dim")
        clip, t5 = clip_tokenizer(), t5_tokenizer()
        w = c.pooled_projection_dim // 2
        parts |= dict(tokenizer=clip, text_encoder=clip_encoder(clip, w, text_layers),
                      tokenizer_2=clip, text_encoder_2=clip_encoder(clip, w, text_layers),
                      tokenizer_3=t5, text_encoder_3=t5_encoder(t5, c.joint_attention_dim, text_layers),
                      vae=vae("sd3", c.in_channels, vae_channels, vae_blocks))
    elif fam == "flux":
        clip, t5 = clip_tokenizer(), t5_tokenizer()
        parts |= dict(tokenizer=clip,
                      text_encoder=clip_encoder(clip, c.pooled_projection_dim, text_layers, projection=False),
                      tokenizer_2=t5, text_encoder_2=t5_encoder(t5, c.joint_attention_dim, text_layers),
                      vae=vae("flux", c.in_channels // 4, vae_channels, vae_blocks))  # 2x2 latent patches packed
    elif fam == "pixart":
        t5 = t5_tokenizer()
        parts |= dict(tokenizer=t5, text_encoder=t5_encoder(t5, c.caption_channels, text_layers),
                      vae=vae("pixart", c.in_channels, vae_channels, vae_blocks))
    else:  # sana
        gemma = gemma_tokenizer()
        parts |= dict(tokenizer=gemma, text_encoder=gemma2_encoder(gemma, c.caption_channels, text_layers),
                      vae=vae("sana", c.in_channels, vae_channels, vae_blocks))
    for name, m in parts.items():
        if isinstance(m, torch.nn.Module):
            parts[name] = m.eval()
    return getattr(diffusers, KINDS[kind][0])(**parts)


def save_pipeline(pipe, out: str | Path, card: dict) -> Path:
    """``pipe.save_pretrained(out)`` and a ``model_card.json`` with ``card`` and the weights' checksums."""
    out = Path(out)
    pipe.save_pretrained(out)
    write_card(out, card)
    return out


def build_tiny(kind: str, out: str | Path, seed: int = 0) -> Path:
    """A tiny random pipeline folder of ``kind`` (tests): 16 x 16-pixel images from an 8 x 8 latent and a
    2x VAE (2 levels of 8 channels; Sana, which wants sizes divisible by 32: 32 pixels and a 4x VAE),
    one-layer text encoders at the real prompt lengths."""
    blocks = 3 if kind == "sana" else 2
    pipe = build_pipeline(kind, tiny_transformer(kind, seed), vae_blocks=blocks, seed=seed)
    size = 8 * 2 ** (blocks - 1)
    card = {"model": f"tiny-{kind}", "stand_in": True, "kind": kind, "family": KINDS[kind][1], "seed": seed,
            "image_size": size, "what_it_is_for": "tests of the pipeline code path; random weights"}
    return save_pipeline(pipe, out, card)
