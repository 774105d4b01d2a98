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
import sys
from pathlib import Path

import torch
from tokenizers import trainers

from ...core.compat import diffusers, transformers
from ...core.errors import UnknownNameError
from ...gen_families import GEN_FAMILIES
from ...runtime.checksums import write_card
from ...world.text import vocabulary
from ..tiny_generators import build_text_encoder

CLIP_LENGTH = 77


def kinds() -> dict:
    """kind -> ``(pipeline class, family adapter)``: every registered family's :attr:`~unicache_lib.gen_families.base.
    GenFamily.tiny_pipelines`."""
    return {kind: (spec[0], fam) for fam in GEN_FAMILIES.values() for kind, spec in fam.tiny_pipelines.items()}


def _spec(kind: str):
    """``(family adapter, its tiny_pipelines entry)`` of ``kind``."""
    if kind not in kinds():
        raise UnknownNameError(f"unknown pipeline kind {kind!r}; kinds: {', '.join(kinds())}")
    fam = kinds()[kind][1]
    return fam, fam.tiny_pipelines[kind]


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
    vocab, merges = _train_bpe(transformers.CLIPTokenizer, vocabulary(), ["<|startoftext|>", "<|endoftext|>"],
                               end_of_word_suffix="</w>")
    return transformers.CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def t5_tokenizer():
    """A ``T5TokenizerFast`` (Unigram, ``▁word`` pieces, ``</s>`` appended, ``<pad>`` = 0) over the world's
    vocabulary."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("▁" + w, -1.0) for w in vocabulary()]
    return transformers.T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def bert_tokenizer():
    """A ``BertTokenizer`` (WordPiece, ``[CLS] ... [SEP]``, ``[PAD]`` = 0) over the world's vocabulary (HunyuanDiT)."""
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + vocabulary())}
    return transformers.BertTokenizer(vocab=vocab, model_max_length=CLIP_LENGTH)


def gemma_tokenizer():
    """A ``GemmaTokenizerFast`` (BPE on ``▁``-joined text, as Gemma 2's) over the world's vocabulary."""
    words = vocabulary()
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    vocab, merges = _train_bpe(transformers.GemmaTokenizerFast, words + ["▁" + w for w in words], special)
    return transformers.GemmaTokenizerFast(vocab=vocab, merges=merges)


# ---- text encoders, VAE, scheduler ------------------------------------------------------------------

def clip_encoder(tokenizer, width: int, layers: int = 1, projection: bool = True):
    """A random ``CLIPTextModelWithProjection`` (SD3; ``projection=False``: ``CLIPTextModel``, Flux) with
    77 positions; pooled / hidden width ``width``."""
    return build_text_encoder(tokenizer, width, layers, "clip", max_positions=CLIP_LENGTH, projection=projection)


def t5_encoder(tokenizer, width: int, layers: int = 1):
    """A random ``T5EncoderModel`` of ``d_model = width`` (relative positions: any prompt length)."""
    return build_text_encoder(tokenizer, width, layers, "t5")


def bert_encoder(tokenizer, width: int, layers: int = 1):
    """A random ``BertModel`` of hidden size ``width`` (HunyuanDiT's first text encoder)."""
    cfg = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=width, num_hidden_layers=layers,
                                  num_attention_heads=2, intermediate_size=2 * width,
                                  max_position_embeddings=CLIP_LENGTH, pad_token_id=0)
    return transformers.BertModel(cfg)


def gemma2_encoder(tokenizer, width: int, layers: int = 1):
    """A random ``Gemma2Model`` (Sana's text encoder) of hidden size ``width``."""
    cfg = transformers.Gemma2Config(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                                    num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                    head_dim=width // 2, pad_token_id=tokenizer.pad_token_id,
                                    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return transformers.Gemma2Model(cfg)


def vae(family: str, latent_channels: int, channels: int = 8, blocks: int = 4):
    """The random VAE of the family keyed ``family`` (``"sd3"``...): its adapter's ``tiny_vae`` builder here and the real
    checkpoints' settings, with ``blocks`` resolution levels of ``channels`` channels and the real latent channels."""
    fam = next((f for f in GEN_FAMILIES.values() if f.key == family), None)
    if fam is None:
        raise UnknownNameError(f"no generator family has the key {family!r}")
    builder, settings = fam.tiny_vae
    return globals()[builder](latent_channels, channels, blocks, **settings)


def kl_vae(latent_channels: int, channels: int = 8, blocks: int = 4, **settings):
    """A random ``AutoencoderKL`` with ``blocks`` resolution levels (4: the real 8x down-sampling) of ``channels``
    channels (real: 128-512) and ``settings`` (the checkpoint's scaling)."""
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks, block_out_channels=(channels,) * blocks, layers_per_block=1,
        latent_channels=latent_channels, norm_num_groups=min(channels, 32), **settings)


def dc_vae(latent_channels: int, channels: int = 8, blocks: int = 4):
    """Sana's ``AutoencoderDC`` (``blocks`` levels: 2^(blocks-1) down-sampling; real DC-AE: 6 levels, 32x)."""
    return diffusers.AutoencoderDC(
        in_channels=3, latent_channels=latent_channels, attention_head_dim=channels // 2,
        encoder_block_types=("ResBlock",) * (blocks - 1) + ("EfficientViTBlock",),
        decoder_block_types=("ResBlock",) * (blocks - 1) + ("EfficientViTBlock",),
        encoder_block_out_channels=(channels,) * blocks, decoder_block_out_channels=(channels,) * blocks,
        encoder_layers_per_block=(1,) * blocks, decoder_layers_per_block=(1,) * blocks,
        encoder_qkv_multiscales=((),) * (blocks - 1) + ((5,),), decoder_qkv_multiscales=((),) * (blocks - 1) + ((5,),),
        downsample_block_type="conv", upsample_block_type="interpolate", decoder_norm_types="rms_norm",
        decoder_act_fns="silu", scaling_factor=0.41407)


def scheduler(kind: str):
    """The scheduler class and settings of the real checkpoints of ``kind`` (its family's ``tiny_pipelines``)."""
    _, (_, _, _, cls, kw) = _spec(kind)
    return getattr(diffusers, cls)(**kw)


# ---- pipelines --------------------------------------------------------------------------------------

def tiny_transformer(kind: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """The tiny random transformer of ``kind`` (2-3 blocks, 2 heads of 8; :mod:`~unicache_lib.zoo.builders.tiny_random`)."""
    fam, (_, tag, extra, _, _) = _spec(kind)
    cls, kw = fam.tiny[tag]
    torch.manual_seed(seed)
    model = (getattr(diffusers, cls) if isinstance(cls, str) else cls)(**(kw | extra)).eval()
    return model if dtype == torch.float32 else model.to(dtype)


def build_pipeline(kind: str, transformer, text_layers: int = 1, vae_channels: int = 8, vae_blocks: int = 4,
                   seed: int = 0):
    """The pipeline of ``kind`` around ``transformer``: the family's tokenizers, random tiny text encoders sized to its
    config and VAE with the transformer's latent channels (:meth:`~unicache_lib.gen_families.base.GenFamily.
    tiny_pipeline_parts`), and the real scheduler."""
    fam, (pipeline, *_) = _spec(kind)
    torch.manual_seed(seed)
    parts = {"transformer": transformer, "scheduler": scheduler(kind)}
    parts |= fam.tiny_pipeline_parts(kind, transformer, sys.modules[__name__], text_layers, vae_channels, vae_blocks)
    parts = {name: m.eval() if isinstance(m, torch.nn.Module) else m for name, m in parts.items()}
    pipe = getattr(diffusers, pipeline)(**parts)
    unsaved = {k: v for k, v in parts.items() if k not in pipe.components and k not in pipe.config}
    if unsaved:  # settings the pipeline does not record itself (DiT's id2label), so save_pretrained keeps them
        pipe.register_to_config(**unsaved)
    return pipe


def save_pipeline(pipe, out: str | Path, card: dict) -> Path:
    """``pipe.save_pretrained(out)`` and a ``model_card.json`` with ``card`` and the weights' checksums."""
    out = Path(out)
    pipe.save_pretrained(out)
    write_card(out, card)
    return out


def build_tiny(kind: str, out: str | Path, seed: int = 0) -> Path:
    """A tiny random pipeline folder of ``kind`` (tests): images from an 8 x 8 latent and a VAE of the family's
    ``tiny_vae_blocks`` levels of 8 channels (2: 16 x 16 pixels; Sana, which wants sizes divisible by 32: 3, 32 pixels),
    one-layer text encoders at the real prompt lengths."""
    fam, (pipeline, *_) = _spec(kind)
    blocks = fam.tiny_vae_blocks
    pipe = build_pipeline(kind, tiny_transformer(kind, seed), vae_blocks=blocks, seed=seed)
    return save_pipeline(pipe, out, {"model": f"tiny-{kind}", "stand_in": True, "kind": kind, "family": fam.key,
                                     "seed": seed, "image_size": 8 * 2 ** (blocks - 1),
                                     "what_it_is_for": "tests of the pipeline code path; random weights"})
