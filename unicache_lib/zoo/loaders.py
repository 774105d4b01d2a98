"""One loader per side: the shipped default, a local path or a hub id of a supported family.

Understanding side (transformers): LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision / -interleave, Qwen2-VL.
Generation side (diffusers): SD3 (MMDiT), PixArt-alpha / -sigma, DiT.

Both go through the real ``from_pretrained`` code path, so ``load_understanding("tiny-llava")`` and
``load_understanding("llava-hf/llava-1.5-7b-hf")`` differ only in where the files come from.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.utils import logging as _hf_logging

_hf_logging.disable_progress_bar()  # weight-loading bars would flood notebooks and test logs

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
SHIPPED = {"tiny-llava": "understanding", "tiny-mmdit": "generation", "tiny-pixart": "generation"}

# config.json model_type -> transformers class name
UNDERSTANDING_FAMILIES = {
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "llava_onevision": "LlavaOnevisionForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
}
# transformer/config.json _class_name -> family tag used by the sampling loop and capture
GENERATION_FAMILIES = {"SD3Transformer2DModel": "sd3", "PixArtTransformer2DModel": "pixart",
                       "DiTTransformer2DModel": "dit"}


class UnsupportedModelError(ValueError):
    """The checkpoint is not of a family the workbench knows how to capture."""


def resolve(name_or_path: str | Path) -> Path | str:
    """A shipped model name -> its folder under ``data/models``; an existing path -> itself; anything
    else is returned unchanged (a hub id, resolved by ``from_pretrained``)."""
    name = str(name_or_path)
    if name in SHIPPED:
        p = MODELS_DIR / name
        if not (p / "config.json").exists() and not (p / "transformer").exists():
            raise FileNotFoundError(
                f"shipped model {name!r} is missing at {p}. It is committed with the repository; "
                f"re-clone, or rebuild it with `make models`."
            )
        return p
    p = Path(name).expanduser()
    return p if p.exists() else name


def _read_config(where, sub: str = "") -> dict:
    p = Path(where)
    if p.exists():
        f = p / sub / "config.json"
        if not f.exists():
            raise FileNotFoundError(f"no config.json in {p / sub}: is this a model folder?")
        return json.loads(f.read_text())
    from huggingface_hub import hf_hub_download  # a hub id: the real download path (offline here)

    return json.loads(Path(hf_hub_download(str(where), f"{sub + '/' if sub else ''}config.json")).read_text())


def model_card(name_or_path) -> dict:
    """The ``model_card.json`` of a local model folder (shipped models and rehearsal stand-ins have
    one); ``{}`` for folders without one and for hub ids."""
    p = Path(str(resolve(name_or_path)))
    f = p / "model_card.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def is_stand_in(name_or_path) -> bool:
    """True for a random-weight stand-in (its card says ``"stand_in": true``): it exercises code
    paths, memory and time at a real model's shapes, and its statistics mean nothing, so notebooks
    show "not meaningful (random weights)" instead of verdicts."""
    return bool(model_card(name_or_path).get("stand_in", False))


def understanding_family(name_or_path) -> str:
    cfg = _read_config(resolve(name_or_path))
    mt = cfg.get("model_type")
    if mt not in UNDERSTANDING_FAMILIES:
        raise UnsupportedModelError(
            f"model_type {mt!r} is not a supported understanding family; supported: "
            f"{', '.join(UNDERSTANDING_FAMILIES)} (LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision/-interleave, Qwen2-VL)"
        )
    return mt


def load_understanding(name_or_path="tiny-llava", attn_implementation: str = "eager",
                       dtype: torch.dtype = torch.float32, device_map=None):
    """Load a vision-language model and its processor.

    Args:
        attn_implementation: ``"eager"`` returns attention weights (capture modes ``full``/``stats``);
            ``"sdpa"`` keeps the fast kernel (use capture mode ``recompute``).
        device_map: passed to ``from_pretrained`` (e.g. ``"auto"`` to spread a 13B model over devices).
    Returns:
        ``(model, processor)``, model in eval mode.
    """
    import transformers
    from transformers import AutoProcessor

    where = resolve(name_or_path)
    fam = understanding_family(name_or_path)
    cls = getattr(transformers, UNDERSTANDING_FAMILIES[fam])
    model = cls.from_pretrained(where, dtype=dtype, attn_implementation=attn_implementation,
                                device_map=device_map)
    model.eval()
    processor = AutoProcessor.from_pretrained(where)
    return model, processor


def load_generator(name_or_path="tiny-mmdit", dtype: torch.dtype = torch.float32):
    """Load a text-to-image generator folder (``transformer/``, ``text_encoder/``, ``tokenizer/``,
    ``scheduler/``) into a :class:`~unicache_lib.zoo.tiny_generators.Generator`.

    A full diffusers pipeline repository (SD3 / PixArt, with a VAE) loads its transformer the same
    way; use :func:`load_transformer` for that and drive the pipeline with its own callbacks.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

    from .tiny_generators import Generator

    where = resolve(name_or_path)
    transformer, fam = load_transformer(where, dtype)
    te_cls = {"clip_text_model": CLIPTextModelWithProjection, "t5": T5EncoderModel}
    mt = _read_config(where, "text_encoder").get("model_type")
    if mt not in te_cls:
        raise UnsupportedModelError(f"text encoder model_type {mt!r} is not supported; supported: {', '.join(te_cls)}")
    te = te_cls[mt].from_pretrained(Path(where) / "text_encoder", dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(Path(where) / "tokenizer")
    sched = FlowMatchEulerDiscreteScheduler.from_pretrained(Path(where) / "scheduler")
    return Generator(fam, transformer, te, tok, sched, str(where))


def load_transformer(name_or_path, dtype: torch.dtype = torch.float32):
    """The denoising transformer of a generator: ``(module, family)``."""
    import diffusers

    where = resolve(name_or_path)
    cls_name = _read_config(where, "transformer").get("_class_name")
    if cls_name not in GENERATION_FAMILIES:
        raise UnsupportedModelError(
            f"transformer class {cls_name!r} is not a supported generation family; supported: "
            f"{', '.join(GENERATION_FAMILIES)} (SD3 / SD3.5, PixArt-alpha / -sigma, DiT)"
        )
    model = getattr(diffusers, cls_name).from_pretrained(where, subfolder="transformer", torch_dtype=dtype)
    return model.eval(), GENERATION_FAMILIES[cls_name]
