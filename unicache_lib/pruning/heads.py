"""Which heads a model has, exact head masking, and physical removal of heads.

A *unit* is one attention module; its heads are numbered 0..H-1. Masking multiplies each head's
slice of the attention output by 0 or 1 right before the output projection (a forward pre-hook on
``o_proj`` / ``to_out[0]``, and ``to_add_out`` for an MMDiT's text stream), so a masked head adds
nothing, whatever attention kernel runs. Flux's single-stream attention has no output projection of
its own (``pre_only``: the block's ``proj_out`` mixes it with the MLP branch), so there the module's
own output ``[B, S, heads * head_dim]`` is multiplied (a forward hook): the same product, one step
earlier. Sana's linear self-attention keeps heads apart up to ``to_out[0]`` (``ReLU(q) (ReLU(k)^T v)``
per head, flattened head-major), so its heads are masked like any other. Hooks are removed on exit,
also on error.
"""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import torch

from ..capture.vlm import attention_sites
from ..core.errors import ContractError, InputError, UnsupportedError
from ..core.hooks import forward_hooks
from ..core.models import unwrap
from ..gen_families import gen_family_of
from ..inputs import check_fraction


@dataclass(frozen=True)
class Unit:
    """One attention module: ``name`` in the model, its ``layer`` index, ``part`` (``"language"``,
    ``"joint"``, ``"self"``, ``"cross"``), ``heads`` and ``head_dim``. ``mapped``: the module forms a
    softmax map that capture records (False for Sana's linear self-attention: maskable, but the
    attention-statistics scorers have nothing to score it by)."""

    name: str
    layer: int
    part: str
    heads: int
    head_dim: int
    mapped: bool = True


def _out_projections(module) -> list[torch.nn.Linear]:
    """The linear layers whose *input* is the heads' concatenated output (empty for Flux's
    single-stream attention, which has none: see :func:`_output_weight`)."""
    if hasattr(module, "o_proj"):
        return [module.o_proj]
    to_out = getattr(module, "to_out", None)
    return [] if to_out is None else [to_out[0]] + ([module.to_add_out] if getattr(module, "to_add_out", None)
                                                    is not None else [])


def _output_weight(model, name: str, module) -> torch.Tensor:
    """``[out, heads * head_dim]``: the weight the heads' output is multiplied by (the image stream's
    where there are two). Flux single-stream attention: the first ``heads * head_dim`` input columns of
    the block's ``proj_out`` (which reads ``[attention | MLP]``)."""
    outs = _out_projections(module)
    if outs:
        return outs[0].weight
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    inner = module.to_q.out_features
    proj = getattr(parent, "proj_out", None)
    if isinstance(proj, torch.nn.Linear) and proj.in_features > inner:
        return proj.weight[:, :inner]
    raise UnsupportedError(f"{name} ({type(module).__name__}) has no output projection and its block no "
                           f"proj_out reading [attention | MLP]: the heads' output weight is unknown")


def _heads(module) -> int:
    """A transformers attention module's head count: its config's, else its query width over the head width."""
    return int(getattr(getattr(module, "config", None), "num_attention_heads", None)
               or module.q_proj.out_features // module.head_dim)


class HeadSpace:
    """The prunable heads of a model, as an ordered list of :class:`Unit`."""

    def __init__(self, model, units: list[Unit]):
        self.model = unwrap(model)
        self.units = units
        mods = dict(self.model.named_modules())
        self.modules = [mods[u.name] for u in units]

    @classmethod
    def of(cls, model, part: str = "language", mapless: bool = True) -> "HeadSpace":
        """Discover units: a transformers VLM's language layers, or every attention module of a
        diffusers transformer as its generator family lays them out (``part`` is then ignored): SD3's
        joint blocks and SD3.5's image-only ``attn2``, Flux's double- then single-stream blocks, PixArt's,
        Sana's and HunyuanDiT's self- and cross-attention.

        ``mapless`` (diffusers): include the attention modules that form no softmax map (Sana's linear
        self-attention; :attr:`Unit.mapped` False). They mask exactly, and the gradient, weight-norm and
        random scorers score them, but the attention-statistics scorers cannot (they raise): pass
        ``mapless=False`` to prune the softmax attention only."""
        model = unwrap(model)
        if any(hasattr(m, "to_q") and hasattr(m, "processor") for m in model.modules()):
            units = [Unit(s.name, s.layer, s.part, s.module.heads, s.module.to_q.out_features // s.module.heads, s.captured)
                     for s in gen_family_of(model).sites(model) if s.captured or mapless]
        else:  # a cross-attention VLM's cross layers are part "cross"
            units = [Unit(s.name, s.layer, s.part, _heads(s.module), int(s.module.head_dim))
                     for s in attention_sites(model, part)]
        return cls(model, units)

    @property
    def shape(self) -> tuple[int, int]:
        """``(units, max heads)``; score arrays have this shape (NaN beyond a unit's heads)."""
        return len(self.units), max(u.heads for u in self.units)

    @property
    def n_heads(self) -> int:
        return sum(u.heads for u in self.units)

    def ones(self) -> torch.Tensor:
        return torch.ones(self.shape)

    def keep_mask(self, scores, fraction: float, eligible=None) -> torch.Tensor:
        """``[units, heads]`` 0/1 mask that prunes ``round(fraction * n_heads)`` heads with the lowest
        ``scores`` (ties: lower unit, then lower head first). ``eligible`` (bool, same shape) limits
        which heads may be pruned. At least one head per unit is always kept."""
        fraction = check_fraction(fraction, "fraction", upper_inclusive=False, meaning="of the heads pruned")
        s = np.asarray(scores, dtype=float)
        if s.shape != self.shape:
            raise InputError(f"scores have shape {s.shape}, the head space is {self.shape}")
        elig = np.ones(self.shape, bool) if eligible is None else np.asarray(eligible, bool)
        for i, u in enumerate(self.units):
            elig[i, u.heads:] = False
        if np.isnan(s[elig]).any():
            raise InputError("scores contain NaN for prunable heads")
        n = int(round(fraction * self.n_heads))
        keep = np.ones(self.shape)
        left = np.array([u.heads for u in self.units])
        flat = [(s[i, h], i, h) for i in range(len(self.units)) for h in range(self.units[i].heads) if elig[i, h]]
        for _, i, h in sorted(flat):
            if n == 0:
                break
            if left[i] > 1:
                keep[i, h] = 0
                left[i] -= 1
                n -= 1
        return torch.tensor(keep, dtype=torch.float32)


class HeadMask(ExitStack):
    """Context manager: multiply each head's output by ``mask[unit, head]`` (0 = pruned); its hooks are removed on
    exit (an :class:`~contextlib.ExitStack` of them), also on error.

    ``mask`` may require grad (the gradient scorer differentiates through it).
    """

    def __init__(self, space: HeadSpace, mask: torch.Tensor):
        if tuple(mask.shape) != space.shape:
            raise InputError(f"mask has shape {tuple(mask.shape)}, the head space is {space.shape}")
        super().__init__()
        self.space, self.mask = space, mask

    def _apply(self, i: int, unit: Unit, x: torch.Tensor) -> torch.Tensor:
        m = self.mask[i, : unit.heads].to(x.dtype).to(x.device)
        return (x.unflatten(-1, (unit.heads, unit.head_dim)) * m[:, None]).flatten(-2)

    def _hook(self, i: int, unit: Unit):
        def pre(module, args, kwargs):
            return (self._apply(i, unit, args[0]), *args[1:]), kwargs
        return pre

    def _output_hook(self, i: int, unit: Unit):
        def post(module, args, kwargs, output):
            if not torch.is_tensor(output):
                raise ContractError(f"{unit.name}: expected the attention output [B, S, heads * head_dim], got "
                                    f"{type(output).__name__}")
            return self._apply(i, unit, output)
        return post

    def __enter__(self) -> "HeadMask":
        hooks = []
        for i, (u, mod) in enumerate(zip(self.space.units, self.space.modules)):
            outs = _out_projections(mod)
            hooks += [(lin, "forward_pre", self._hook(i, u)) for lin in outs]
            if not outs:  # Flux single-stream (pre_only): mask the module's own output
                _output_weight(self.space.model, u.name, mod)  # a known layout, or a clear error
                hooks.append((mod, "forward", self._output_hook(i, u)))
        self.enter_context(forward_hooks(hooks))
        return self


def physical_pruning_unsupported(space: HeadSpace) -> str | None:
    """Why :func:`prune_physically` cannot slice this model's heads out, or None when it can."""
    for u, mod in zip(space.units, space.modules):
        if not hasattr(mod, "o_proj"):
            return (f"{u.name} ({type(mod).__name__}): physical pruning supports transformers q/k/v/o attention "
                    f"(Llama-style q_proj/k_proj/v_proj/o_proj); use HeadMask for diffusers modules")
        if mod.k_proj.out_features != mod.q_proj.out_features:
            return f"{u.name}: grouped-query attention (fewer KV heads than query heads) is not supported; use HeadMask"
    return None


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Linear:
    """A new ``Linear`` holding copies of ``weight [out, in]`` and ``bias``."""
    new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                          device=weight.device)
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias)
    return new


@torch.no_grad()
def prune_physically(space: HeadSpace, keep: torch.Tensor) -> dict[str, int]:
    """Remove pruned heads from the weights (in place): rows of the q/k/v projections, columns of
    the output projection. Supported for transformers attention with as many key/value heads as
    query heads (Llama-style ``q_proj``/``k_proj``/``v_proj``/``o_proj``); the model then runs
    fewer FLOPs. Returns ``{unit name: heads kept}``. Equivalent to :class:`HeadMask` (tested)."""
    why = physical_pruning_unsupported(space)
    if why:  # checked for every unit first: nothing is half-pruned
        raise UnsupportedError(why)
    out = {}
    for i, (u, mod) in enumerate(zip(space.units, space.modules)):
        kept = [h for h in range(u.heads) if keep[i, h] > 0]
        idx = torch.cat([torch.arange(h * u.head_dim, (h + 1) * u.head_dim) for h in kept])
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(mod, name)
            setattr(mod, name, _linear(lin.weight[idx], None if lin.bias is None else lin.bias[idx]))
        mod.o_proj = _linear(mod.o_proj.weight[:, idx], mod.o_proj.bias)
        out[u.name] = len(kept)
    return out
