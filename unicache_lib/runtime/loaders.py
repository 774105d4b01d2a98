"""One loader per side: the shipped default, a local path or a hub id of a supported family.

Understanding side (transformers): every family registered in :mod:`unicache_lib.families` (LLaVA-1.5,
LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Gemma 3, Idefics3/SmolVLM, InternVL, PaliGemma,
Mllama). Generation side (diffusers): the tiny layout (SD3 MMDiT, PixArt, DiT transformers with one text
encoder, sampled by the library's loop) and diffusers pipeline folders of SD3 / SD3.5, PixArt-alpha /
-sigma, Flux.1 dev / schnell, Sana, HunyuanDiT and DiT (:data:`PIPELINE_FAMILIES`, sampled through the pipeline).

Both go through the real ``from_pretrained`` code path, so ``load_understanding("tiny-llava")`` and
``load_understanding("llava-hf/llava-1.5-7b-hf")`` differ only in where the files come from. Where is
decided by :func:`resolve` without the network (a typo fails at once, naming the shipped models), and
a local folder's weights are checked against the sha256 checksums of its ``model_card.json`` first
(:mod:`unicache_lib.runtime.checksums`; ``verify=False`` skips the check).
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shlex
import socket
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch

from ..core.compat import diffusers, transformers
from ..core.errors import ContractError, InputError, MissingFileError, ModelNotFoundError
from ..core.models import quiet
from ..families import UnsupportedModelError, family_for_type, supported
from ..families.base import images_only
from ..gen_families import GEN_FAMILIES, gen_family_of
from ..gen_families import supported as gen_supported
from .checksums import ChecksumError, read_json, verify_checksums  # noqa: F401 - ChecksumError is re-exported
from .pipelines import PipelineGenerator, default_image_size
from .tiny_layouts import Generator

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
SHIPPED = {"tiny-llava": "understanding", "tiny-llava-576": "understanding", "tiny-mmdit": "generation",
           "tiny-pixart": "generation", "tiny-mllama": "understanding", "tiny-vilt": "understanding",
           "tiny-clip": "understanding", "tiny-janus": "understanding"}

# transformer/config.json _class_name -> family key (capture, reuse and peers know every registered family)
GENERATION_FAMILIES = {cls: fam.key for fam in GEN_FAMILIES.values() for cls in fam.transformer_classes}
# model_index.json _class_name -> family key: the pipelines :func:`~unicache_lib.runtime.sampling.sample` drives
PIPELINE_FAMILIES = {cls: fam.key for fam in GEN_FAMILIES.values() for cls in fam.sampled_pipelines}

DEVICES = ("cpu", "cuda", "auto")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"cpu"``, ``"cuda"`` (or ``"cuda:1"``), ``"auto"`` (CUDA when present, else the CPU)."""
    if isinstance(device, torch.device):
        return device
    device = "auto" if device is None else str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"DEVICE={device!r} but torch sees no CUDA device (torch {torch.__version__} built "
                         f"{'with' if torch.version.cuda else 'without'} CUDA): use DEVICE='cpu' or 'auto'")
    if device != "cpu" and not device.startswith("cuda"):
        raise InputError(f"DEVICE must be one of {DEVICES} (or 'cuda:N'), got {device!r}")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None = "auto", device: torch.device | str = "cpu") -> torch.dtype:
    """Weight dtype: a ``torch.dtype``, a name (``"float16"``, ``"bf16"``, ...), or ``"auto"`` (bfloat16 on
    a GPU that supports it, float16 on other GPUs, float32 on the CPU). Statistics are fp32 whatever
    the weights are."""
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = "auto" if dtype is None else str(dtype).replace("torch.", "")
    if dtype == "auto":
        return ((torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16)
                if torch.device(device).type == "cuda" else torch.float32)
    if dtype not in DTYPES:
        raise InputError(f"DTYPE must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name


def _offline() -> bool:
    from huggingface_hub import constants  # local: only the hub paths need huggingface_hub

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import snapshot_download  # local: only the hub paths need huggingface_hub

    try:
        snapshot_download(repo_id, local_files_only=True)  # reads the local cache only, never the network
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError, or an unreadable cache: not usable offline
        return False
    return True


def _hub_host() -> str:
    from huggingface_hub import constants  # local: only the hub paths need huggingface_hub

    return urlparse(constants.ENDPOINT).hostname or "huggingface.co"


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host resolves and accepts a connection (seconds at most, instead of ~23 s of retries)."""
    try:
        socket.create_connection((_hub_host(), 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def closest_shipped(name: str, cutoff: float = 0.8) -> list[str]:
    """Shipped model names near ``name``, the same length first (a typo in place: tiny-llama -> tiny-llava before
    tiny-mllama)."""
    return sorted(difflib.get_close_matches(str(name), SHIPPED, n=3, cutoff=cutoff),
                  key=lambda m: abs(len(m) - len(str(name))))


def _unknown_name_message(name: str) -> str:
    hint = f" Did you mean {' or '.join(map(repr, close[:2]))}?" if (close := closest_shipped(name)) else ""
    return (f"{name!r} is not a shipped model, an existing folder or a Hugging Face hub id (org/name).{hint} Shipped "
            f"models: {', '.join(f'{n} ({side})' for n, side in SHIPPED.items())}. Supported understanding families: "
            f"{supported()}. Supported generation families: "
            f"{', '.join(f'{tag} ({cls})' for cls, tag in (GENERATION_FAMILIES | PIPELINE_FAMILIES).items())}.")


def resolve(name_or_path: str | Path, reach: bool = True) -> Path | str:
    """Where a model comes from, decided without touching the network.

    A shipped model name -> its folder under ``data/models``; an existing path -> itself; a hub id (``org/name``) ->
    unchanged, for ``from_pretrained`` to fetch (offline, it must already be in the local Hugging Face cache;
    ``reach=False`` skips the probe of the hub for an uncached id online). Anything else raises
    :class:`ModelNotFoundError` at once: a path-like string ("no such folder"), a hub id missing from the cache in
    offline mode, or a name (with the shipped models, the supported families and the closest shipped name).
    """
    name = str(name_or_path)
    if name in SHIPPED:
        p = MODELS_DIR / name
        if not (p / "config.json").exists() and not (p / "transformer").exists():
            raise MissingFileError(f"shipped model {name!r} is missing at {p}. It is committed with the repository; "
                                   f"re-clone, or rebuild it with `make models`.")
        return p
    p = Path(os.path.expanduser(name))
    if p.exists():
        return p
    if HUB_ID.fullmatch(name) and not isinstance(name_or_path, Path):
        offline = _offline()
        if offline and not _in_hub_cache(name):
            raise ModelNotFoundError(
                f"{name!r} is not a folder, and as a hub id it is not in the local Hugging Face cache while offline "
                f"mode is on (HF_HUB_OFFLINE=1): download it once with network access "
                f"(`HF_HUB_OFFLINE=0 hf download {name}`), or pass the folder of a local copy.")
        if reach and not offline and not _in_hub_cache(name) and not _hub_reachable():
            raise ModelNotFoundError(
                f"{name!r} is not a folder, not in the local Hugging Face cache, and the hub ({_hub_host()}) cannot be "
                f"reached from this machine: download it where there is network (`hf download {name} --local-dir DIR`) "
                f"and pass DIR (or copy that Hugging Face cache here)")
        return name
    if isinstance(name_or_path, Path) or any(sep and sep in name for sep in (os.sep, os.altsep)) or name[:1] in ".~/":
        raise ModelNotFoundError(f"no such folder: {p.absolute()} (from {name!r})")
    raise ModelNotFoundError(_unknown_name_message(name))


def _verified(where, verify: bool):
    """``where`` after checking its weights against its card (local folders; a shipped model must have checksums,
    and its error says how to restore it)."""
    if verify and isinstance(where, Path):
        shipped = where.resolve().parent == MODELS_DIR.resolve() and where.name in SHIPPED
        remedy = None if not shipped else (f"restore the shipped copy with `git -C {shlex.quote(str(MODELS_DIR.parents[1]))} checkout -- "
                      f"data/models/{where.name}` (or re-clone the repository; `make models` retrains it), or pass "
                      f"verify=False to load it as it is")
        verify_checksums(where, remedy, required=remedy is not None)
    return where


def _read_config(where, sub: str = "", name: str = "config.json") -> dict:
    p = Path(where)
    if p.exists():
        f = p / sub / name
        if not f.exists():
            raise MissingFileError(f"no {name} in {p / sub}: is this a model folder?")
        return read_json(f)
    from huggingface_hub import hf_hub_download  # local: a hub id only, the real download path

    return json.loads(Path(hf_hub_download(str(where), f"{sub + '/' if sub else ''}{name}")).read_text())


def _model_index(where) -> dict | None:
    """The ``model_index.json`` of a diffusers pipeline folder (or cached hub repository); None without one."""
    try:
        return _read_config(where, name="model_index.json")
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a hub id without one (EntryNotFound, or not cached offline)
        if Path(str(where)).exists():
            raise
        return None


def model_label(name_or_path) -> str:
    """A short name for a model, safe as a folder name and a table label: a shipped name as it is, a folder by its
    own name, a hub id ``org/name`` as ``org--name`` (a full path joined to an output folder would point back at the
    model's own folder)."""
    name = str(name_or_path)
    if name in SHIPPED:
        return name
    p = Path(os.path.expanduser(name))
    return p.resolve().name if p.exists() else name.strip("/").replace("/", "--")


def model_card(name_or_path) -> dict:
    """The ``model_card.json`` of a local model folder; ``{}`` for folders without one and for hub ids."""
    f = Path(str(resolve(name_or_path))) / "model_card.json"
    return read_json(f) if f.is_file() else {}


def is_stand_in(name_or_path) -> bool:
    """True for a random-weight stand-in (its card says ``"stand_in": true``): its statistics mean nothing, so
    notebooks show "not meaningful (random weights)" instead of verdicts."""
    return bool(model_card(name_or_path).get("stand_in", False))


def understanding_family(name_or_path) -> str:
    """The ``model_type`` of a checkpoint; an unregistered one raises :class:`UnsupportedModelError`."""
    mt = _read_config(resolve(name_or_path)).get("model_type")
    family_for_type(mt)
    return mt


@quiet(loading_bars=True)  # weight-loading bars would flood notebooks and test logs
def load_understanding(name_or_path="tiny-llava", attn_implementation: str = "eager",
                       dtype: torch.dtype | str = torch.float32, device_map=None, device: str | None = None,
                       vision_attn_implementation: str = "sdpa", verify: bool = True):
    """Load a vision-language model of a supported family and its processor.

    Args:
        attn_implementation: of the language model: ``"eager"`` returns attention weights (capture
            modes ``full``/``stats``); ``"sdpa"`` keeps the fast kernel (use capture mode ``recompute``).
        vision_attn_implementation: of the vision tower; ``"sdpa"`` by default (fast, no weights kept;
            capture ``part="vision"`` needs ``"eager"`` or mode ``recompute``).
        dtype: weight dtype (``torch.float16``, ``"bfloat16"``, ``"auto"``, ...: :func:`resolve_dtype`); statistics
            are computed in float32 regardless.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``; the model is moved there (inputs follow the model).
        device_map: passed to ``from_pretrained`` instead (e.g. ``"auto"`` to spread a big model over GPUs).
        verify: check the weight files against the sha256 checksums of the folder's ``model_card.json``
            (shipped models always have them); ``False`` loads a model whose weights you changed on purpose.
    Raises:
        ModelNotFoundError: an unknown name, a missing folder, or a hub id not cached while offline.
        ChecksumError: a weight file that differs from its recorded checksum (named in the message).
    Returns:
        ``(model, processor)``, model in eval mode.
    """
    where = _verified(resolve(name_or_path), verify)
    _check_kind(where, "understanding")
    mt = understanding_family(where)
    fam = family_for_type(mt)
    _check_tokenizers(where, "understanding")
    dev = resolve_device(device) if device is not None else None
    dt = resolve_dtype(dtype, dev or ("cuda" if device_map is not None and torch.cuda.is_available() else "cpu"))
    model = getattr(transformers, fam.model_class_for(mt)).from_pretrained(
        where, dtype=dt, device_map=device_map,
        attn_implementation={"text_config": attn_implementation, "vision_config": vision_attn_implementation})
    if dev is not None and device_map is None:
        model.to(dev)
    model.eval()
    return model, fam.adapt_processor(load_processor(where, fam), model.config)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")


def _check_kind(where, want: str) -> None:
    """A local folder of the other kind (a generator given to the understanding loader, or the reverse) is refused,
    naming the right loader."""
    p = Path(str(where))
    if not p.is_dir():
        return
    generator = (p / "model_index.json").is_file() or (p / "transformer").is_dir()
    if want == "understanding" and generator:
        raise InputError(f"{p} is a text-to-image generator (a diffusers pipeline or the tiny generator layout), not a "
                         f"vision-language model: load it with load_generator (notebooks 03, 04, 06: GENERATORS)")
    if want == "generation" and not generator and (p / "config.json").is_file():
        mt = read_json(p / "config.json").get("model_type")
        raise InputError(f"{p} is a vision-language model (model_type {mt!r}), not a generator: load it with "
                         f"load_understanding (notebooks: MODEL)")


def _check_tokenizers(where, want: str) -> None:
    """A local folder whose tokenizer files are missing is refused naming the folder and the fix (instead of a
    tokenizer library's unrelated complaint, such as "requires the protobuf library")."""
    p = Path(str(where))
    if not p.is_dir():
        return
    if want == "understanding":
        folders = [p]
    elif (p / "model_index.json").is_file():  # a pipeline: the tokenizers its index names
        index = read_json(p / "model_index.json")
        folders = [p / k for k in ("tokenizer", "tokenizer_2", "tokenizer_3")
                   if index.get(k) not in (None, [None, None])]
    else:
        folders = [p / "tokenizer"]
    for f in folders:
        if not f.is_dir() or not any((f / n).is_file() for n in TOKENIZER_FILES):
            raise InputError(f"no tokenizer files in {f} (one of {', '.join(TOKENIZER_FILES)}): the folder is an "
                             f"incomplete copy; copy the tokenizer files from the original checkpoint")


@quiet(loading_bars=True)  # weight-loading bars would flood notebooks and test logs
def load_processor(where, family):
    """The checkpoint's processor. Where its class requires a video processor and torchvision is not
    installed, the same class is loaded without its video part (images only), with a warning."""
    try:
        return transformers.AutoProcessor.from_pretrained(where)
    except (ImportError, OSError, TypeError, ValueError) as e:
        chain = f"{e!r} {e.__cause__!r}".lower()
        if importlib.util.find_spec("torchvision") is not None:
            raise
        if not family.needs_video_processor:
            if "torchvision" not in chain:
                raise
            raise ContractError(
                f"the processor of {where} needs torchvision, which is not installed (on this machine it cannot be "
                f"installed beside torch 2.13.0). Install torchvision where you can, or encode the prompt yourself "
                f"and pass it to the model (kv.split_inputs takes an encoded prompt)") from e
        first = e
    p = Path(str(where))
    cfg = json.loads((p / "processor_config.json").read_text()) if (p / "processor_config.json").is_file() else {}
    name = cfg.get("processor_class") or family.model_class.replace("ForConditionalGeneration", "Processor")
    try:
        proc = images_only(getattr(transformers, name)).from_pretrained(where)
    except Exception as e:  # noqa: BLE001 - report both failures
        raise ContractError(f"could not load the processor of {where}: {first!r}; images-only fallback: {e!r}") from e
    warnings.warn(f"torchvision is not installed: {name} loaded without its video processor (images only)",
                  stacklevel=2)
    return proc


@quiet(loading_bars=True)  # weight-loading bars would flood notebooks and test logs
def load_generator(name_or_path="tiny-mmdit", dtype: torch.dtype | str = torch.float32, device: str | None = None,
                   verify: bool = True, image_size: int | None = None, max_sequence_length: int | None = None):
    """Load a text-to-image generator for :func:`unicache_lib.runtime.sampling.sample` and the capture code.

    Two layouts:

    * a diffusers pipeline folder (``model_index.json``) of SD3 / SD3.5 (``StableDiffusion3Pipeline``),
      PixArt-alpha / -sigma, Flux.1 dev / schnell (``FluxPipeline``), Sana, HunyuanDiT or DiT, loaded with
      ``DiffusionPipeline.from_pretrained`` into a :class:`~unicache_lib.runtime.pipelines.PipelineGenerator`
      (sampled through the pipeline: its scheduler, guidance and VAE decode);
    * the tiny layout (``transformer/``, one ``text_encoder/``, ``tokenizer/``, ``scheduler/``: the shipped
      ``tiny-mmdit`` / ``tiny-pixart``) into a :class:`~unicache_lib.runtime.tiny_layouts.Generator`
      (sampled by the library's pixel-space loop).

    Both have ``adapter`` (the family's :class:`~unicache_lib.gen_families.base.GenFamily`), ``family`` (its key:
    ``"sd3"``, ``"pixart"``, ``"flux"``...), ``transformer``, ``path``, ``pipe`` (None for the tiny layout),
    ``image_size`` (pixels), ``image_tokens`` and ``text_tokens`` (per prompt).

    Args:
        dtype: weight dtype (``torch.float16``, ``"bfloat16"``, ``"auto"``: as :func:`resolve_dtype`).
        device: ``"cpu"``, ``"cuda"``, ``"auto"`` (:func:`resolve_device`); None leaves the weights on the CPU.
        verify: check the weights against the sha256 checksums of the folder's ``model_card.json``.
        image_size: pipelines: side of the square images to generate, in pixels; None: the card's
            ``"image_size"`` (stand-ins), else the pipeline's default (``default_sample_size * 8``).
        max_sequence_length: pipelines: T5 / Gemma prompt length; None: the card's, else the pipeline's
            default (SD3 256, PixArt-alpha 120, PixArt-sigma 300, Flux.1-dev 512, Flux.1-schnell 256, Sana 300).
    Raises:
        ModelNotFoundError: an unknown name, a missing folder, or a hub id not cached while offline.
        UnsupportedModelError: a pipeline class or transformer / text-encoder class not supported (named).
        ChecksumError: a weight file that differs from its recorded checksum.
    """
    where = _verified(resolve(name_or_path), verify)
    _check_kind(where, "generation")
    dev = resolve_device(device) if device is not None else None
    dt = resolve_dtype(dtype, dev or "cpu")
    index = _model_index(where)
    gen = (_load_tiny_layout(where, dt) if index is None
           else _load_pipeline(where, index, dt, image_size, max_sequence_length))
    if dev is not None and gen.pipe is not None:
        gen.pipe.to(dev)
    elif dev is not None:
        gen.transformer.to(dev)
        gen.text_encoder.to(dev)
    return gen


def _load_pipeline(where, index: dict, dtype: torch.dtype, image_size: int | None, max_sequence_length: int | None):
    """A diffusers pipeline folder -> :class:`~unicache_lib.runtime.pipelines.PipelineGenerator`."""
    cls_name = index.get("_class_name")
    sampled = {cls: fam for fam in GEN_FAMILIES.values() for cls in fam.sampled_pipelines}  # + added since import
    if cls_name not in sampled:
        raise UnsupportedModelError(
            f"diffusers pipeline {cls_name!r} ({where}) is not supported; supported pipelines: "
            f"{', '.join(f'{c} ({f.key})' for c, f in sampled.items())}")
    _check_tokenizers(where, "generation")
    pipe = diffusers.DiffusionPipeline.from_pretrained(where, dtype=dtype)  # every model in eval mode
    card = model_card(where) if Path(str(where)).exists() else {}
    size = image_size or card.get("image_size") or default_image_size(pipe)
    return PipelineGenerator(sampled[cls_name], pipe, str(where), int(size),
                             int(max_sequence_length or card.get("max_sequence_length")
                                 or sampled[cls_name].max_sequence_length(pipe)))


def _load_tiny_layout(where, dtype: torch.dtype):
    """``transformer/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/`` -> :class:`Generator`."""
    transformer, _ = load_transformer(where, dtype, verify=False)  # verified by the caller
    _check_tokenizers(where, "generation")
    te_cls = {"clip_text_model": transformers.CLIPTextModelWithProjection, "t5": transformers.T5EncoderModel}
    mt = _read_config(where, "text_encoder").get("model_type")
    if mt not in te_cls:
        raise UnsupportedModelError(f"text encoder model_type {mt!r} is not supported; supported: {', '.join(te_cls)}")
    te = te_cls[mt].from_pretrained(Path(where) / "text_encoder", dtype=dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(Path(where) / "tokenizer")
    return Generator(gen_family_of(transformer), transformer, te, tok,
                     diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(Path(where) / "scheduler"), str(where))


@quiet(loading_bars=True)  # weight-loading bars would flood notebooks and test logs
def load_transformer(name_or_path, dtype: torch.dtype = torch.float32, verify: bool = True):
    """The denoising transformer of a generator: ``(module, family)``. ``verify``: check the folder's
    weights against its card's checksums first."""
    where = _verified(resolve(name_or_path), verify)
    cls_name = _read_config(where, "transformer").get("_class_name")
    if cls_name not in GENERATION_FAMILIES:
        raise UnsupportedModelError(f"transformer class {cls_name!r} is not a supported generation family; "
                                    f"supported: {gen_supported()}")
    return (getattr(diffusers, cls_name).from_pretrained(where, subfolder="transformer", dtype=dtype).eval(),
            GENERATION_FAMILIES[cls_name])
