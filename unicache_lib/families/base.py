"""What the workbench must know about one family of vision-language models, in one place.

Capture, eviction, the loaders and the broken-model diagnostics ask a :class:`VLMFamily` instead of
guessing from module names: which modules attend and in which part (``language`` self-attention,
``cross`` attention to the vision tokens, ``vision``), which positions are image tokens, which module
produces the image features, how to lay out a prompt, and how to continue positions after a cached
context. A model whose ``config.model_type`` no registered family claims gets
:class:`UnsupportedModelError`, from the loader and from ``AttentionCapture`` alike.

Adding a family = one file in this package (a subclass registered with ``@register``) plus its tiny
config in ``tests/test_families.py``; the parametrised suite there then checks spans, capture against
a ground-truth map, output equality and eviction for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..core.errors import InputError, PrefillPruningUnsupported, UnsupportedError, UnsupportedModelError
from ..core.modality import Spans, spans_from_input_ids
from ..core.models import unwrap
from ..core.registry import Registry, registrar
from ..zoo.tiny_llava import build_tokenizer

FAMILIES: dict[str, "VLMFamily"] = Registry("model family")
register = registrar(FAMILIES, "model family", instance=True)  # one instance of each VLMFamily subclass

HOW_TO_ADD = ("To add one: write unicache_lib/families/<name>.py with a VLMFamily subclass (model_types, model_class, "
              "language_model, projector, config) decorated with @register (every module of that package is imported, "
              "so the file registers itself), and add its tiny config to CASES in tests/test_families.py.")


@dataclass
class ImageKV:
    """Where the image's keys and values live in a prefilled cache: ``layers`` (cache layer index of
    each policy layer), ``positions [n_image]`` (cache positions of the image entries in those
    layers) and ``keep_always [m]`` (positions every policy keeps there, e.g. the text of the context)."""

    layers: list[int]
    positions: torch.Tensor
    keep_always: torch.Tensor
    length: int
    key_index: torch.Tensor | None = None  # columns of the prefill maps that the cache still holds
    grid: torch.Tensor | None = None  # indices into the image block that tile the picture row by row


def supported() -> str:
    """``"LLaVA-1.5 (llava), ..."``: the registered families and the model types they claim."""
    return ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES.values())


def family_for_type(model_type: str | None) -> "VLMFamily":
    if (fam := next((f for f in FAMILIES.values() if model_type in f.model_types), None)) is not None:
        return fam
    raise UnsupportedModelError(
        f"model_type {model_type!r} is not a supported vision-language family. Supported: {supported()}. {HOW_TO_ADD}"
    )


def family_of(model) -> "VLMFamily":
    """The family of a transformers model (wrappers such as DataParallel or ``torch.compile`` unwrapped)."""
    return family_for_type(getattr(getattr(unwrap(model), "config", None), "model_type", None))


@dataclass(frozen=True)
class Site:
    """One attention module to capture: qualified ``name``, ``layer`` index, ``part`` and the module."""

    name: str
    layer: int
    part: str
    module: torch.nn.Module = field(compare=False, repr=False)


_VISION_ATTN = re.compile(r"(?:^|\.)(?:layers|blocks|layer)\.(\d+)\.(?:self_attn|attn|self_attention|attention)$")


@dataclass(frozen=True)
class Shape:
    """Sizes for building a model of a family from code (tests: tiny; rehearsal stand-ins: a real
    model's token counts and depth with reduced width). ``extra`` holds family-specific settings."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    vision_layers: int = 2
    vision_heads: int = 2
    vision_head_dim: int = 8
    image_size: int = 32
    patch: int = 8
    sliding_window: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def vision_hidden(self) -> int:
        return self.vision_heads * self.vision_head_dim


def decoder_dims(tok, shape: Shape, **kw) -> dict:
    """A decoder text config's keyword arguments at ``shape`` (4x MLP) for the world tokenizer ``tok``; ``kw`` added."""
    return dict(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id) | kw


def vit_dims(shape: Shape, **kw) -> dict:
    """A ViT-style vision config's keyword arguments at ``shape`` (4x MLP); ``kw`` added."""
    return dict(hidden_size=shape.vision_hidden, intermediate_size=4 * shape.vision_hidden,
                num_hidden_layers=shape.vision_layers, num_attention_heads=shape.vision_heads,
                image_size=shape.image_size, patch_size=shape.patch) | kw


def patch_grid(vision_config) -> tuple[int, int]:
    """``(side, side)``: the square patch grid of a vision config's ``image_size`` / ``patch_size``."""
    side = vision_config.image_size // vision_config.patch_size
    return (side, side)


class PatchGridImages:
    """A family whose image tokens are one square patch grid of its vision config (``image_size / patch_size`` per
    side): LLaVA-1.5, PaliGemma, Janus, CLIP. List it before :class:`VLMFamily` among the bases."""

    def image_grid(self, config, inputs):
        return patch_grid(config.vision_config)


def module_names(model) -> dict[int, str]:
    """``{id(module): qualified name}`` of every module of ``model``."""
    return {id(m): n for n, m in model.named_modules()}


class VLMFamily:
    """Base class: the LLaVA-style answer to every question; families override what differs.

    Class attributes: ``name`` (shown to users), ``model_types`` (``config.model_type`` values
    claimed), ``model_class`` (the transformers class the loader uses), ``image_marker`` (what a
    prompt contains where the image goes), ``special_tokens`` (what a tokenizer needs for the
    family's prompts), ``token_fields`` (processor outputs with one entry per token, sliced with the
    ids), ``needs_video_processor`` (its processor class requires a video processor, i.e.
    torchvision), ``cross_attention`` (image reached through cross-attention layers, not tokens) and
    ``image_part`` (the capture part whose keys are the image).

    Hooks a family overrides only where it differs (each has the LLaVA-style default here; ``docs/FORKING.md``
    lists them): ``attention_interface`` (its attention runs through transformers' ``AttentionInterface``, so
    ``recompute`` capture works), ``weights_argument`` (``(position, keyword)`` of the argument that makes its
    attention modules return weights, None: they always do), :meth:`row_gates`, :meth:`cross_spans`,
    :meth:`image_kv`, :meth:`forward_text`, :meth:`image_features_at` and :meth:`first_layer_keys`.
    """

    name = ""
    model_types: tuple[str, ...] = ()
    model_class = ""
    image_marker = "<image>"
    special_tokens: tuple[str, ...] = ("<image>",)
    token_fields: tuple[str, ...] = ("token_type_ids", "mm_token_type_ids")
    needs_video_processor = False
    cross_attention = False
    image_part = "language"  # the captured part whose keys are the image (Mllama: "cross")
    attention_interface = True  # ViLT: False (its attention is not routed through transformers' interface)
    weights_argument: tuple[int, str] | None = None  # ViLT: (2, "output_attentions")
    grid_offset = 0  # image tokens before the grid cells in the image span (a class token: CLIP, Mllama, ViLT: 1)

    # ---- hooks for families whose attention or cache is laid out differently ---------------------------
    def row_gates(self, model) -> dict:
        """``{layer module name: (keyword, ...)}`` of inputs that gate whole query rows (Mllama's cross-attention
        row mask); capture reads them with a pre-hook. Most families: none."""
        return {}

    def cross_spans(self, n_keys: int) -> Spans:
        """Modality of ``n_keys`` cross-attention keys (only families with ``cross_attention``)."""
        raise UnsupportedModelError(f"{self.name} has no cross-attention: its image is reached through tokens")

    def image_kv(self, model, cache, split) -> "ImageKV | None":
        """Where the image KV of a fresh prefill lives, for a cache laid out unlike a decoder's (Mllama: its
        cross-attention layers). None: the image token positions of every layer (the default)."""
        return None

    def forward_text(self, model, ids, cache, positions):
        """One forward of text tokens on an evicted cache, for a family that needs more than ``input_ids``,
        ``position_ids`` and a full mask (Mllama: its cross-attention states). None: the default forward."""
        return None

    def image_features_at(self, model, pixel_values, rows: int, cols: int) -> torch.Tensor:
        """``[rows * cols, D]`` float32: the picture (``pixel_values [1, 3, H, W]``, as the processor made it)
        downsampled to a ``rows x cols`` patch grid and encoded by the family's own vision tower and projector, row
        by row: the downsampled-image control (:mod:`~unicache_lib.kv.policies.downsample`). Families whose tower
        takes one resolution only, or whose image tokens are not one grid of patches, cannot: the default refuses."""
        raise PrefillPruningUnsupported(f"{self.name}: its vision tower is not run here at another resolution (the image "
                                        f"tokens are not one patch grid of a resizable tower), so the downsampled-image "
                                        f"control is not measurable here; the pooling control is")

    def first_layer_keys(self, model, embeddings: torch.Tensor) -> torch.Tensor:
        """``[n, H_kv * D]`` float32: the keys the language model's first layer computes from ``embeddings [n, hidden]``
        (its input norm and key projection, and a key norm where the layer has one; before the rotary embedding), one
        matrix product and no attention: what :mod:`~unicache_lib.kv.policies.key_coverage_prefill` covers before the
        prefill. Refused, with the reason, for a first layer not laid out as transformers' decoder layers are."""
        layer = self.language_model(model).layers[0]
        attn = getattr(layer, "self_attn", None)
        norm = getattr(layer, "input_layernorm", None)
        if attn is None or norm is None or not hasattr(attn, "k_proj"):
            raise PrefillPruningUnsupported(f"{self.name}: its first language-model layer has no input_layernorm / "
                                            f"self_attn.k_proj, so its keys cannot be read before the prefill; the "
                                            f"feature-space cover (key_coverage_features) can run")
        w = next(attn.k_proj.parameters())
        with torch.no_grad():
            k = attn.k_proj(norm(embeddings.to(w.device, w.dtype)))
            if getattr(attn, "k_norm", None) is not None:  # Gemma 3, Qwen3: a norm per key head
                hd = getattr(attn, "head_dim", None) or model.config.get_text_config().head_dim
                k = attn.k_norm(k.view(*k.shape[:-1], -1, hd)).reshape(k.shape)
        return k.float()

    # ---- modules ----------------------------------------------------------------------------------
    def language_model(self, model) -> torch.nn.Module:
        """The text decoder (it has ``.layers``)."""
        return model.model.language_model

    def vision_model(self, model) -> torch.nn.Module:
        """The vision encoder, under either name transformers gives it: ``vision_tower`` (LLaVA and most) or
        ``vision_model`` (Mllama, Janus, Idefics3)."""
        inner = model.model
        return inner.vision_tower if hasattr(inner, "vision_tower") else inner.vision_model

    def projector(self, model) -> torch.nn.Module:
        """The module whose output is the image features that enter the language model."""
        return model.model.multi_modal_projector

    def sites(self, model, parts=("language",)) -> list[Site]:
        """Attention modules of the requested parts (``language``, ``cross``, ``vision``), in order:
        language-model layers by index (self and cross attention in one numbering), then vision."""
        names = module_names(model)
        out = []
        if {"language", "cross"} & set(parts):
            for i, layer in enumerate(self.language_model(model).layers):
                for attr, part in (("self_attn", "language"), ("cross_attn", "cross")):
                    mod = getattr(layer, attr, None)
                    if mod is not None and part in parts:
                        out.append(Site(names[id(mod)], i, part, mod))
        if "vision" in parts:
            vis = self.vision_model(model)
            prefix = names[id(vis)]
            out += [Site(f"{prefix}.{n}", int(hit.group(1)), "vision", m) for n, m in vis.named_modules()
                    if (hit := _VISION_ATTN.search(n))]
        return out

    def adapt_processor(self, processor, config):
        """The loaded processor, fixed where its class hard-codes what the checkpoint's config says (Janus: the
        image token count). Most families: unchanged."""
        return processor

    def canonical_inputs(self, model, inputs: dict) -> dict:
        """The processor's inputs as capture and the analyses run them (ViLT: image patches in grid order);
        the model's output is the same. Most families: unchanged."""
        return inputs

    def model_class_for(self, model_type: str) -> str:
        """The transformers class for a checkpoint of ``model_type`` (one of ``model_types``)."""
        return self.model_class

    # ---- tokens and spans -------------------------------------------------------------------------
    def image_token_id(self, config) -> int:
        tid = next((t for t in (getattr(config, "image_token_id", None), getattr(config, "image_token_index", None))
                    if t is not None), None)
        if tid is None:
            raise UnsupportedModelError(f"{self.name}: the config has no image_token_id / image_token_index")
        return int(tid)

    def expected_image_tokens(self, config, inputs: dict) -> int | None:
        """How many image tokens the processor should have placed for ``inputs`` (None = no check): by default
        :meth:`image_tokens_per_picture` where ``inputs`` carry pixel values."""
        n = self.image_tokens_per_picture(config)
        return n if n and inputs.get("pixel_values") is not None else None

    def image_tokens_per_picture(self, config) -> int | None:
        """The image tokens one picture always becomes (LLaVA-1.5: 576), what a budget of ``"64t"`` is a share of;
        None where the count varies with the picture (tiles, dynamic resolution), and token budgets are refused."""
        return None

    def spans(self, config, input_ids, inputs: dict | None = None) -> Spans:
        """Modality of every position of the language model's self-attention sequence."""
        return spans_from_input_ids(input_ids, self.image_token_id(config),
                                    self.expected_image_tokens(config, inputs or {}))

    def cross_keys(self, config, inputs: dict) -> int:
        """Number of cross-attention keys (vision tokens) for ``inputs``; 0 for a family without them."""
        return 0

    def image_grid(self, config, inputs: dict) -> tuple[int, int] | None:
        """``(rows, cols)`` of the first image's tokens as laid out over the picture, or None when the
        tokens are not one regular grid over the whole image (tiles, pooling with newlines)."""
        return None

    def grid_tokens(self, config, inputs: dict) -> torch.Tensor | None:
        """Indices, within the image span, of the tokens that form :meth:`image_grid` (row-major)."""
        g = self.image_grid(config, inputs)
        return None if g is None else torch.arange(self.grid_offset, self.grid_offset + g[0] * g[1])

    # ---- prompts and positions --------------------------------------------------------------------
    def prompt(self, processor, question: str) -> str:
        """One user turn with one image: the processor's chat template when it has one (real
        checkpoints), else the family's plain layout (the shipped tiny models)."""
        if getattr(processor, "chat_template", None):
            conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
            return processor.apply_chat_template(conv, add_generation_prompt=True)
        return self.layout.format(image=self.image_marker, question=question)

    def position_ids(self, model, input_ids, inputs: dict) -> torch.Tensor | None:
        """Rotary positions of a whole prompt when they are not ``0..S-1`` (M-RoPE), else None."""
        return None

    @staticmethod
    def text_positions(full_positions, start: int, n: int, device=None) -> torch.Tensor:
        """Positions of ``n`` text tokens at sequence index ``start``: ``[1, n]`` (``start..start+n-1``), or
        with M-RoPE positions of the prompt (``[3, 1, S]``) one past the largest position before ``start``
        in every stream, as Qwen2-VL numbers text after an image."""
        if full_positions is None:
            return torch.arange(start, start + n, device=device)[None]
        return ((full_positions[..., :start].amax() + 1 + torch.arange(n, device=full_positions.device))
                .expand(*full_positions.shape[:-1], n).to(device))

    def context_note(self) -> str:
        """What changes when the context (image) is cached before the question arrives (notebook 05)."""
        return ""

    # ---- building from code (tests: tiny shapes; rehearsal stand-ins: real shapes, reduced width) ---
    layout = "user : {image} {question} assistant :"
    named_tokens: dict = {}

    def tokenizer(self):
        """The world's word-level tokenizer with this family's special tokens."""
        return build_tokenizer(self.special_tokens, self.named_tokens)

    def config(self, tok, shape: Shape):
        """A config of this family at ``shape`` for the world tokenizer ``tok`` (what building a tiny model of the
        family from code needs; a family that only captures real checkpoints may leave it out)."""
        raise UnsupportedError(f"{self.name} declares no config, so no model of it can be built from code: add "
                               f"config(tok, shape) to its adapter (docs/FORKING.md, a model family)")

    def activate(self, model) -> None:
        """Make a randomly initialised model use every path (a no-op for most families); tests and
        stand-ins call it after building from a config."""

    def processor(self, tok, shape: Shape):
        """The family's own processor class for images of ``shape.image_size``, with a chat template in
        the family's layout; None where it cannot be built on this machine."""
        return None


def chat_template(layout: str, image: str) -> str:
    """A minimal chat template: ``layout`` with ``{image}`` (one marker per image item of the user
    turn) and ``{question}`` (the user turn's text). Real checkpoints bring their own template."""
    pre, rest = layout.split("{image}")
    mid, post = rest.split("{question}")
    return ("{% for m in messages if m.role == 'user' %}" + pre  # the user turns: the layout around images and text
            + "{% for c in m.content if c.type == 'image' %}" + image + "{% endfor %}" + mid
            + "{% for c in m.content if c.type == 'text' %}{{ c.text }}{% endfor %}{% endfor %}" + post)


def images_only(processor_cls):
    """``processor_cls`` accepting ``video_processor=None``: its image and text logic unchanged, video
    inputs refused. For machines without torchvision (required by every video processor)."""

    class ImagesOnly(processor_cls):
        @classmethod
        def get_attributes(cls):
            return [a for a in super().get_attributes() if "video" not in a]

        def __call__(self, *args, videos=None, **kwargs):
            if videos is not None:
                raise InputError("this processor was loaded without its video processor (torchvision is not "
                                 "installed): pass images only")
            return super().__call__(*args, **kwargs)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_cls.__name__
    return ImagesOnly
