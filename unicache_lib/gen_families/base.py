"""What the workbench must know about one family of diffusion transformers (generators), in one place.

Capture (and reuse, peers, pipeline loading) ask a :class:`GenFamily` instead of guessing from module
names: which diffusers transformer and pipeline classes it covers, which attention modules it has, in
which layer and part (``joint``, ``self``, ``cross``), the token order of its joint sequence, and how
each of its attention processors forms the softmax map (so capture recomputes exactly that map).

    fam = gen_family_of(pipe.transformer)          # or gen_family_for("FluxPipeline")
    fam.pipeline_classes                           # ("FluxPipeline", "FluxImg2ImgPipeline")
    fam.modules(pipe.transformer, "joint")         # {"transformer_blocks.0.attn": <FluxAttention>, ...}
    fam.sites(pipe.transformer)                    # [GenSite(name, layer, part, module, captured, meta), ...]

A transformer whose class no registered family claims gets :class:`UnsupportedModelError` (the VLM
families' error: one error for "the workbench does not know this model").

Adding a family = one file in this package (a :class:`GenFamily` subclass registered with ``@register``, carrying
its tiny transformer and tiny pipeline) plus its line in ``EXPECT`` of ``tests/test_gen_families.py``, whose
parametrised suite then checks outputs, maps, parts and spans for it.
"""
from __future__ import annotations

import contextvars
import importlib
import inspect
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..core.errors import CaptureError, UnsupportedError
from ..core.modality import IMAGE, TEXT
from ..core.models import unwrap
from ..core.registry import Registry, registrar
from ..families.base import UnsupportedModelError
from ..stats import LogitRows

GEN_FAMILIES: dict[str, "GenFamily"] = Registry("generator family")
register = registrar(GEN_FAMILIES, "generator family", instance=True)  # one instance of each GenFamily subclass

HOW_TO_ADD = ("To add a family: write unicache_lib/gen_families/<name>.py with a GenFamily subclass (name, "
              "transformer_classes, pipeline_classes, site_patterns, processors, default_processors, its tiny test "
              "model in tiny and tiny_inputs, for cross-step reuse image_sides / text_kv_processors: a processor "
              "not named there is computed in full, for sampling and pruning sampled_pipelines, objective and its tiny "
              "pipeline in tiny_pipelines / tiny_pipeline_parts) decorated with @register (every module of that package is "
              "imported, so the file registers itself), and add its line to EXPECT in tests/test_gen_families.py.")


def supported() -> str:
    """``"SD3 (SD3Transformer2DModel), ..."``: the registered families and the classes they claim."""
    return ", ".join(f"{f.name} ({'/'.join(f.transformer_classes)})" for f in GEN_FAMILIES.values())


def gen_family_for(class_name: str) -> "GenFamily":
    """The family claiming a diffusers transformer or pipeline class name (``"FluxPipeline"``,
    ``"SanaTransformer2DModel"``; e.g. a checkpoint's ``model_index.json`` ``_class_name``)."""
    if (fam := next((f for f in GEN_FAMILIES.values()
                     if class_name in f.transformer_classes or class_name in f.pipeline_classes), None)) is not None:
        return fam
    raise UnsupportedModelError(f"{class_name!r} is not a supported generator class. Supported generator families: "
                                f"{supported()}. {HOW_TO_ADD}")


def gen_family_of(transformer) -> "GenFamily":
    """The family of a diffusers transformer (wrappers unwrapped), by its exact class name: a subclass
    may change attention, so it is claimed explicitly (the error says how)."""
    tr = unwrap(transformer)
    cls = type(tr).__name__
    if (fam := next((f for f in GEN_FAMILIES.values() if cls in f.transformer_classes), None)) is not None:
        return fam
    hint = " This looks like a pipeline: pass pipe.transformer." if hasattr(tr, "transformer") and not isinstance(
        tr, torch.nn.Module) else ""
    # the nearest base class a family claims (the first in the method resolution order)
    if (claimed := next(((base, type(f)) for base in type(tr).__mro__[1:] for f in GEN_FAMILIES.values()
                         if base.__name__ in f.transformer_classes), None)) is not None:
        base, a = claimed
        hint = (f" {cls} subclasses {base.__name__} ({a.name}); if its attention is unchanged, claim it with "
                f"`@register class Mine({a.__module__}.{a.__name__}): name = 'mine'; transformer_classes = ({cls!r},)` "
                f"(register from unicache_lib.gen_families).")
    raise UnsupportedModelError(f"{cls} is not a supported generator transformer.{hint} Supported generator families: "
                                f"{supported()}. {HOW_TO_ADD}")


def restore_processors(transformer) -> None:
    """Give every attention module of ``transformer`` its family's stock diffusers processor (what a
    freshly loaded model has): the fix for a processor capture cannot recompute."""
    tr = unwrap(transformer)
    gen_family_of(tr).restore_processors(tr)


def processor_probs(processor_name: str) -> Callable:
    """The map recomputation of a processor class any registered family knows; CaptureError otherwise."""
    if (fn := next((f.processors[processor_name] for f in GEN_FAMILIES.values() if processor_name in f.processors),
                   None)) is not None:
        return fn
    raise CaptureError(f"no generator family knows the attention processor {processor_name}; capture recomputes "
                       f"the maps of {', '.join(sorted({p for f in GEN_FAMILIES.values() for p in f.processors}))}. "
                       f"Put the stock processors back with "
                       f"unicache_lib.gen_families.restore_processors(transformer).")


@dataclass(frozen=True)
class GenSite:
    """One attention module: qualified ``name``, ``layer`` (block index; Flux numbers single-stream
    blocks after the double-stream ones), ``part``, the module, whether it has a softmax map to capture
    (Sana's linear attention has none) and ``meta`` copied into every record (Flux: ``{"block": ...}``)."""

    name: str
    layer: int
    part: str
    module: torch.nn.Module = field(compare=False, repr=False)
    captured: bool = True
    meta: dict = field(default_factory=dict, compare=False)


# ---- map recomputation shared by families ------------------------------------------------------------
def heads_view(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, S, H*D] -> [B, H, S, D]``."""
    b, s, d = x.shape
    return x.view(b, s, heads, d // heads).transpose(1, 2)


def normed(norm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, or ``x`` where the attention module has no such norm (``None``)."""
    return x if norm is None else norm(x)


_STREAM = contextvars.ContextVar("unicache_stream_maps", default=False)


@contextmanager
def streamed_maps(on: bool = True):
    """Inside the block, :func:`softmax_map` (so every family's map recomputation) returns the maps as
    :class:`~unicache_lib.stats.LogitRows` per batch row instead of forming them (capture mode ``recompute``)."""
    token = _STREAM.set(bool(on))
    try:
        yield
    finally:
        _STREAM.reset(token)


def softmax_map(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None):
    """``softmax(q k^T / sqrt(D) + mask)`` in float32: ``q [B, H, Sq, D]``, ``k [B, H, Sk, D]``, ``mask``
    broadcastable to ``[B, H, Sq, Sk]`` (bool: True = attend; float: added) -> ``[B, H, Sq, Sk]``.
    The scale is scaled_dot_product_attention's default, which every processor here uses. Inside
    :func:`streamed_maps`: a list of ``B`` :class:`~unicache_lib.stats.LogitRows` (``[H, Sq, Sk]`` each, formed
    one row chunk at a time when read), so no map-sized tensor is allocated."""
    if _STREAM.get():
        B, H = q.shape[:2]
        if mask is not None:
            mask = mask.expand(B, H, mask.shape[-2], k.shape[2])
            if not bool((mask == mask[:, :1]).all()):
                raise CaptureError("a mask that differs across heads cannot be streamed: capture with mode='stats'")
        # per batch row, the mask of its first head: [Sq or 1, Sk]
        return [LogitRows(q[b], k[b], q.shape[-1] ** -0.5, None if mask is None else mask[b, 0]) for b in range(B)]
    logits = (q.float() @ k.float().transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    if mask is not None:
        logits = logits.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else logits.add_(mask.float())
    # softmax in place: one map-sized buffer (SD3 at 1,024 px: 1.9 GB per map), not two
    logits.sub_(logits.amax(-1, keepdim=True)).exp_()
    return logits.div_(logits.sum(-1, keepdim=True))


def sdpa_mask(attn, mask, n_keys: int, batch: int):
    """The mask as AttnProcessor2_0 and its kin hand it to sdpa: ``[B, H, Sq or 1, Sk]`` (None stays None)."""
    if mask is None:
        return None
    m = attn.prepare_attention_mask(mask, n_keys, batch)
    return m.view(batch, attn.heads, -1, m.shape[-1])


def standard_qk(attn, hidden_states, encoder_hidden_states=None, temb=None):
    """Queries and keys ``[B, H, S, D]`` as ``AttnProcessor2_0`` forms them (spatial / group norm,
    cross norm, per-head qk norm), the hidden states flattened to ``[B, S, C]`` as it does."""
    h = hidden_states
    if attn.spatial_norm is not None:
        h = attn.spatial_norm(h, temb)
    if h.dim() == 4:
        h = h.flatten(2).transpose(1, 2)
    if attn.group_norm is not None:
        h = attn.group_norm(h.transpose(1, 2)).transpose(1, 2)
    e = encoder_hidden_states
    if e is None:
        e = h
    elif attn.norm_cross:
        e = attn.norm_encoder_hidden_states(e)
    return (normed(attn.norm_q, heads_view(attn.to_q(h), attn.heads)),
            normed(attn.norm_k, heads_view(attn.to_k(e), attn.heads)))


def standard_probs(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **_):
    """``AttnProcessor2_0``'s map ``[B, H, Sq, Sk]`` (self-attention: keys = the image; cross: the text)."""
    q, k = standard_qk(attn, hidden_states, encoder_hidden_states, temb)
    return softmax_map(q, k, sdpa_mask(attn, attention_mask, k.shape[2], q.shape[0]))


@dataclass(frozen=True)
class FamilyPeers:
    """How diffusers' caches are set up on one generator family (module names as its transformer has them).

    ``attention``: regex (``re.fullmatch``) of every attention module's name; TaylorSeer caches these.
    ``spatial`` / ``cross``: regexes (``re.search``) of the self- or joint-attention modules (PAB spatial,
    FasterCache) and of the cross-attention modules (PAB cross; None: the family has none).
    ``cfg_kwargs``: the forward keyword arguments that carry the ``[uncond | cond]`` batch, which
    FasterCache halves when it skips the unconditional branch (every batched tensor argument must be here,
    and nothing else: an unbatched tensor halved, or a batched one left whole, breaks the call).
    ``guidance_distilled``: the model takes guidance as an input and is run without a CFG batch.
    ``blocks``: diffusers block class name -> ``(hidden_states index, encoder_hidden_states index)`` in
    its output, registered with diffusers' ``TransformerBlockRegistry`` for FirstBlockCache and MagCache
    while the cache is applied, where diffusers 0.42.1 has no entry (it raises "Model class ... not
    registered").
    ``tail_passes_encoder``: the last block returns ``None`` for the text stream (SD3's
    ``context_pre_only`` block); FirstBlockCache's tail hook subtracts from it and fails
    (``TypeError: unsupported operand type(s) for -: 'NoneType' and 'Tensor'``), so while FirstBlockCache
    is applied the last block hands its text input back in place of ``None`` (the model discards it).
    ``unsupported``: peer -> the reason it cannot run on this family at all (checked by a test that tries it).
    ``unsupported_when``: peer -> ``(transformer attribute, reason)``: it cannot run on a transformer of this
    family whose attribute is true (FasterCache: only where it would halve the batch).
    ``notes``: caveats that do not stop a peer from running.
    """

    attention: str
    spatial: tuple[str, ...]
    cross: tuple[str, ...] | None
    cfg_kwargs: tuple[str, ...]
    guidance_distilled: bool = False
    blocks: dict = field(default_factory=dict)
    tail_passes_encoder: bool = False
    unsupported: dict = field(default_factory=dict)
    unsupported_when: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)


def word_names(pieces: list[str], special=frozenset()) -> list[str]:
    """One name per piece: the whole word at a word's first piece, ``"##<piece>"`` at its other pieces; a special
    token, and a piece of punctuation only (``","``, ``"."``), names itself. Word boundaries from the tokenizer's own
    markers: an end-of-word suffix ``</w>`` (CLIP's BPE) when the pieces carry one, else a start-of-word prefix ``▁``
    (SentencePiece: T5, Gemma) or ``Ġ`` (byte-level BPE); pieces with no marker at all are each a word.
    ``["tri", "angle</w>"] -> ["triangle", "##angle"]``; ``["▁tri", "angle", ","] -> ["triangle", "##angle", ","]``."""
    def bare(p: str) -> str:  # the piece without its word-boundary marker
        return p.replace("</w>", "").lstrip("▁Ġ")

    plain = [p for p in pieces if p not in special]
    suffix = any(p.endswith("</w>") for p in plain)
    prefix = not suffix and any(p[:1] in ("▁", "Ġ") for p in plain)
    groups: list[list[str]] = []
    open_word = False
    for p in pieces:
        text = bare(p)
        if p in special or (text and not any(ch.isalnum() for ch in text)):  # a word of its own
            groups.append([p])
            open_word = suffix and not p.endswith("</w>") and p not in special
            continue
        if suffix:
            starts = not open_word
            open_word = not p.endswith("</w>")
        elif prefix:
            starts = not open_word or p[:1] in ("▁", "Ġ")
            open_word = True
        else:
            starts = True
        if starts:
            groups.append([p])
        else:
            groups[-1].append(p)
    out = []
    for g in groups:  # a special token is a group of its own, named as it is
        texts = [bare(p) for p in g]
        out += [g[0]] if g[0] in special else ["".join(texts)] + ["##" + t for t in texts[1:]]
    return out


def positions_named(tok, prompts, length: int, prefix: str = "") -> list[list[str | None]]:
    """Per prompt, the name of each of the ``length`` positions ``tok`` pads or truncates it to (:func:`word_names`,
    ``prefix`` before each name), ``None`` at padding wherever the tokenizer puts it."""
    enc = tok(list(prompts), padding="max_length", max_length=length, truncation=True, add_special_tokens=True)
    special = set(tok.all_special_tokens)
    out = []
    for ids, mask in zip(enc["input_ids"], enc["attention_mask"]):
        named = iter(word_names(tok.convert_ids_to_tokens([i for i, m in zip(ids, mask) if m]), special))
        out.append([prefix + next(named) if m else None for m in mask])
    return out


# ---- the adapter ------------------------------------------------------------------------------------
class GenFamily:
    """Base class: one family of diffusers transformers. Families set the class attributes and override
    what differs (:meth:`sites` for Flux's two block kinds, :meth:`forward_context` for HunyuanDiT's two
    text encoders).

    Class attributes: ``name`` (shown to users), ``key`` (short lower-case tag: ``"sd3"``, ``"flux"``...), ``transformer_classes`` / ``pipeline_classes``
    (diffusers class names claimed), ``site_patterns`` (``(regex, part)``: a module name matching the
    regex, block index in group 1, is an attention module of that part), ``parts`` (parts with a
    softmax map), ``uncaptured`` (part -> why it has no map), ``joint_order`` (token order of a joint
    sequence), ``processors`` (processor class name -> function recomputing its map, called as
    ``fn(attn, hidden_states, encoder_hidden_states, attention_mask, **processor_kwargs) -> [B, H, Sq, Sk]``)
    and ``default_processors`` (part -> ``"module:Class"`` of the stock diffusers processor).
    """

    name = ""
    key = ""  # short tag used by the generator object, the peers' table and the tiny configs ("sd3", "flux", ...)
    peers: FamilyPeers | None = None  # how diffusers' caches are set up on this family (read by reuse/peers.py)
    transformer_classes: tuple[str, ...] = ()
    pipeline_classes: tuple[str, ...] = ()
    site_patterns: tuple[tuple[str, str], ...] = ()
    parts: tuple[str, ...] = ()
    uncaptured: dict[str, str] = {}
    joint_order: tuple[str, str] = ("image", "text")
    processors: dict[str, Callable] = {}
    default_processors: dict[str, str] = {}
    #: cross-step reuse's ``reuse_text`` (``reuse/cache.py``), per processor name: ``fn(attn, h, e, rope, keys=None)
    #: -> [B, S_img, D]``, this processor's output for the image queries alone (joint attention: ``h`` the image tokens,
    #: ``e`` the text tokens; a single stream: ``h`` the image rows of ``keys``, the whole sequence), or None where it
    #: cannot (then the call is computed in full); a processor not named here is computed in full
    image_sides: dict[str, Callable] = {}
    #: cross-attention processors whose text keys and values reuse may project once per run (text does not change)
    text_kv_processors: tuple[str, ...] = ()
    #: the tiny random-weight transformers tests build from this family (``zoo.builders.tiny_random``): tag -> (diffusers class
    #: name, or a class, and constructor kwargs); a few tokens and 2 heads of 8, but every structural feature of the
    #: real models
    tiny: dict[str, tuple[str, dict]] = {}

    def tiny_inputs(self, tag: str, transformer, batch: int, n_text: int, n_pad: int, rn, t, mask) -> dict:
        """Keyword arguments for one forward call of a tiny transformer ``tag`` of :attr:`tiny`: ``n_text`` real text
        tokens (families with a text mask get ``n_pad`` masked padding tokens after them), ``batch`` rows. ``rn(*shape)``
        draws seeded noise in the model's dtype, ``t`` is ``[batch]`` timesteps (500), ``mask`` ``[batch, n_text +
        n_pad]`` the text mask (1 real, 0 padding)."""
        raise UnsupportedError(f"{self.name} declares no tiny inputs: add tiny_inputs to its adapter")

    # ---- modules ------------------------------------------------------------------------------------
    def sites(self, transformer) -> list[GenSite]:
        """Every attention module (captured or not), sorted by (layer, part)."""
        return sorted((GenSite(name, int(m.group(1)), part, mod, part not in self.uncaptured)
                       for name, mod in unwrap(transformer).named_modules() for pat, part in self.site_patterns
                       if (m := re.fullmatch(pat, name))), key=lambda s: (s.layer, s.part))

    def reuse_kind(self, site: GenSite) -> str:
        """How cross-step reuse treats the module: ``joint`` (image and text streams in one attention; the text
        side reusable), ``single`` (one joined ``[text | image]`` sequence), ``cross`` or ``self``."""
        return site.part

    def modules(self, transformer, part: str | None = None, captured_only: bool = True) -> dict[str, torch.nn.Module]:
        """``{module name: attention module}`` of one part (None = all), in layer order."""
        return {s.name: s.module for s in self.sites(transformer)
                if (part is None or s.part == part) and (s.captured or not captured_only)}

    def default_processor(self, part: str):
        """The stock diffusers processor class of ``part``."""
        mod, cls = self.default_processors[part].split(":")
        return getattr(importlib.import_module(mod), cls)

    def restore_processors(self, transformer) -> None:
        """Set every attention module's processor back to the family's stock one."""
        for s in self.sites(transformer):
            s.module.set_processor(self.default_processor(s.part)())

    # ---- maps ---------------------------------------------------------------------------------------
    def check_processor(self, site: GenSite, processor) -> None:
        """CaptureError (with a fix that works) unless this family can recompute ``processor``'s map."""
        pname = type(processor).__name__
        if pname in self.processors:
            return
        cls = self.default_processor(site.part)
        fused = (" (fused QKV projections: transformer.unfuse_qkv_projections() also restores the processors)"
                 if "Fused" in pname else "")
        raise CaptureError(
            f"{site.name} of this {self.name} transformer uses {pname}, whose attention map capture cannot "
            f"recompute (it knows {', '.join(self.processors)}). Put the stock processors back with "
            f"unicache_lib.gen_families.restore_processors(transformer){fused}, or for this module: "
            f"transformer.get_submodule({site.name!r}).set_processor({cls.__name__}()) with {cls.__name__} from "
            f"{cls.__module__}; then capture."
        )

    def probs(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *, processor,
              **kwargs) -> torch.Tensor:
        """``[B, H, Sq, Sk]`` float32 map of one call of ``attn`` whose processor is ``processor``,
        recomputed from the module's own projections exactly as that processor forms it; ``kwargs`` are
        the processor's other arguments (``image_rotary_emb``, ``temb``). Joint maps are in
        :attr:`joint_order`."""
        fn = self.processors.get(type(processor).__name__)
        if fn is None:
            raise CaptureError(f"{self.name} cannot recompute the map of {type(processor).__name__}; "
                               f"known: {', '.join(self.processors)}")
        return fn(attn, hidden_states, encoder_hidden_states, attention_mask, **kwargs)

    # ---- token layout -------------------------------------------------------------------------------
    def forward_context(self, kwargs: dict) -> dict:
        """What capture reads from the transformer's forward arguments: ``n_text`` (text tokens the blocks
        attend to; None = unknown) and ``text_real`` (``[B, n_text]`` bool, False for padding; None = unknown)."""
        e, m = kwargs.get("encoder_hidden_states"), kwargs.get("encoder_attention_mask")
        n = int(e.shape[1]) if torch.is_tensor(e) and e.dim() == 3 else None
        return {"n_text": n, "text_real": (m > 0.5) if torch.is_tensor(m) and m.dim() == 2 and m.shape[-1] == n
                else None}

    def kinds(self, part: str, n_query: int, n_key: int, n_text: int) -> tuple[np.ndarray, np.ndarray]:
        """Modality (IMAGE / TEXT) of every query ``[Sq]`` and key ``[Sk]`` of a map of ``part``; a joint
        map holds ``n_text`` text tokens, in :attr:`joint_order`."""
        if part == "self":
            return np.full(n_query, IMAGE), np.full(n_key, IMAGE)
        if part == "cross":
            return np.full(n_query, IMAGE), np.full(n_key, TEXT)
        span = {"image": np.full(n_key - n_text, IMAGE), "text": np.full(n_text, TEXT)}
        k = np.concatenate([span[x] for x in self.joint_order])
        return k, k

    def split_output(self, part: str, out, n_text: int):
        """``(image side [B, S_img, C], text side [B, S_text, C] or None)`` of a processor's output.
        Joint processors return ``(image, text)``; a joint sequence returned whole (Flux's single-stream
        blocks) is split by :attr:`joint_order`."""
        if isinstance(out, tuple):
            return out[0], out[1]
        return ((out, None) if part != "joint" or not n_text else (out[:, n_text:], out[:, :n_text])
                if self.joint_order[0] == "text" else (out[:, :-n_text], out[:, -n_text:]))

    # ---- sampling and training: what runtime.pipelines and pruning.evaluate ask of the family -------------------
    #: diffusers pipeline classes :func:`~unicache_lib.runtime.sampling.sample` drives (its step callbacks, guidance
    #: batching and decoding); () where the family is captured, reused and pruned on its transformer alone
    sampled_pipelines: tuple[str, ...] = ()
    #: the checkpoint's training objective: ``"flow"`` (flow matching, velocity ``eps - x0``), ``"epsilon"`` (DDPM
    #: noise prediction) or ``"v"`` (DDPM velocity ``sqrt(abar) eps - sqrt(1 - abar) x0``); None where the workbench knows
    #: none (head pruning's loss then refuses, never approximates)
    objective: str | None = None
    #: a transformer with twice the latent channels out predicts a learned variance in its second half (the pipeline
    #: drops it)
    learned_sigma: bool = False
    #: the pipeline batches classifier-free guidance as ``[cond | uncond]`` (DiT), not ``[uncond | cond]``
    cond_first: bool = False
    #: the tiny random pipelines of this family (``zoo.builders.tiny_pipelines``): kind -> ``(pipeline class, tag of
    #: :attr:`tiny`, transformer config overrides, scheduler class, scheduler kwargs as the real checkpoints have them)``
    tiny_pipelines: dict[str, tuple[str, str, dict, str, dict]] = {}
    #: their VAE: a builder of ``zoo.builders.tiny_pipelines`` (``kl_vae``: AutoencoderKL, ``dc_vae``: Sana's DC-AE) and
    #: the real checkpoints' settings (scaling, shift, quant convs)
    tiny_vae: tuple[str, dict] = ("kl_vae", {})
    #: VAE resolution levels of those pipelines (``2 ** (levels - 1)`` down-sampling of their 8 x 8 latents)
    tiny_vae_blocks: int = 2
    #: the shipped pixel-space generators' text encoder kind (``zoo.tiny_generators``: ``"clip"`` or ``"t5"``); None: none
    pixel_text_encoder: str | None = None

    def tiny_pipeline_parts(self, kind: str, transformer, build, text_layers: int, vae_channels: int,
                            vae_blocks: int) -> dict:
        """The tokenizers, text encoders and VAE of tiny pipeline ``kind`` around ``transformer``, sized to its config;
        ``build`` is :mod:`unicache_lib.zoo.builders.tiny_pipelines` (tokenizers, encoders, ``vae``), handed in because
        builders sit above the adapters."""
        raise UnsupportedError(f"{self.name} declares no tiny pipeline: add tiny_pipelines and tiny_pipeline_parts")

    def pixel_transformer(self, size: int, patch: int, text_dim: int, layers: int, heads: int, head_dim: int) -> dict:
        """Constructor arguments of this family's transformer class for a shipped pixel-space generator (RGB in and
        out, ``text_dim``-wide text states)."""
        raise UnsupportedError(f"{self.name} has no pixel-space layout (zoo.tiny_generators)")

    def text_kwargs(self, hidden: torch.Tensor, pooled: torch.Tensor, mask: torch.Tensor) -> dict:
        """The transformer's text arguments from per-token states ``[B, T, D]``, pooled states ``[B, D]`` and the
        mask ``[B, T]`` (the pixel-space layout's loop)."""
        return dict(encoder_hidden_states=hidden, encoder_attention_mask=mask)

    def max_sequence_length(self, pipe) -> int:
        """The prompt length the pipeline's ``__call__`` uses by default."""
        return int(inspect.signature(type(pipe).__call__).parameters["max_sequence_length"].default)

    def call_kwargs(self, pipe, prompts: list[str]) -> dict:
        """What the pipeline's ``__call__`` takes for ``prompts``."""
        return dict(prompt=list(prompts))

    def latent_patch(self, transformer) -> int:
        """Latent pixels per image token along a side (the patch size; Flux packs 2 x 2 latent patches)."""
        return int(transformer.config.patch_size)

    def text_positions(self, pipe, max_sequence_length: int) -> int:
        """Text positions per prompt the transformer sees (padding included)."""
        return int(max_sequence_length)

    def token_names(self, pipe, prompts: list[str], max_sequence_length: int) -> list[list[str | None]] | None:
        """Per prompt, the name of every text position the transformer sees, ``None`` at padding (the pipeline's
        tokenizer, :func:`positions_named`); None where positions cannot be named rightly."""
        return positions_named(pipe.tokenizer, prompts, max_sequence_length)

    def flow_timestep(self, t: torch.Tensor, transformer) -> torch.Tensor:
        """The timestep the pipeline hands the transformer for the scheduler's timestep ``t`` (flow matching)."""
        return t
