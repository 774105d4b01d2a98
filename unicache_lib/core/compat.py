"""Every use of a framework's private internals, in one place, with the versions it was checked against.

The workbench hooks into transformers, diffusers and torch through their public APIs wherever one exists. The few
things it needs that have no public API are here, each a small function with the private name it touches, so a
framework upgrade that moves one breaks one function (and ``tests/test_layers.py`` keeps private framework names out
of every other module). Checked against:
"""
import importlib
import types
from typing import TYPE_CHECKING

import torch

#: the framework versions these functions were checked against (``environment.yml`` / ``pyproject.toml`` pin them)
CHECKED = {"torch": "2.13", "transformers": ">=5.0,<5.3 (kvpress needs <5.3)", "diffusers": "0.42"}

__doc__ += "".join(f"\n- {k} {v}" for k, v in CHECKED.items()) + "\n"


class LazyModule:
    """A framework named at the top of the module that uses it and imported on first attribute access:
    ``transformers = LazyModule("transformers")`` then ``transformers.LlavaConfig(...)``. Importing transformers
    takes seconds, and ``import unicache_lib.kv`` (or any module that only builds, reads or measures) must not pay
    that; every attribute is looked up on the real module at use, so a test's ``monkeypatch`` of the framework is
    seen. Submodules resolve too (``transformers.masking_utils.X``)."""

    def __init__(self, name: str):
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        try:
            value = getattr(module, attr)
        except AttributeError:
            if attr.startswith("__"):
                raise
            value = importlib.import_module(f"{self._name}.{attr}")
        return LazyModule(f"{self._name}.{attr}") if isinstance(value, types.ModuleType) else value

    def __repr__(self) -> str:
        return f"<lazily imported module {self._name!r}>"


if TYPE_CHECKING:  # type checkers and IDEs see the real modules (go-to-definition, signatures)
    import diffusers
    import transformers
else:  # every module imports these two from here: ``from ..core.compat import transformers``
    transformers = LazyModule("transformers")
    diffusers = LazyModule("diffusers")


# ---- torch -------------------------------------------------------------------------------------------
def compiled_original(model):
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), or None for a module that is not compiled."""
    return getattr(model, "_orig_mod", None)


def cpu_sdpa_op():
    """The fused CPU attention kernel ``F.scaled_dot_product_attention`` dispatches to (None where torch has none)."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


# ---- transformers ------------------------------------------------------------------------------------
def config_attn_implementation(config) -> str | None:
    """The attention implementation a (sub-)config is set to (``PretrainedConfig._attn_implementation``; None for a
    config without one)."""
    return getattr(config, "_attn_implementation", None)


def attention_functions(name: str) -> list:
    """``[(registry, function or None)]``: what transformers' global attention and attention-mask registries hold
    under ``name`` (``AttentionInterface`` / ``AttentionMaskInterface``), to put back with
    :func:`restore_attention_functions`."""
    return [(iface, iface._global_mapping.get(name))
            for iface in (transformers.AttentionInterface, transformers.masking_utils.AttentionMaskInterface)]


def restore_attention_functions(saved: list, name: str) -> None:
    """Put back what :func:`attention_functions` saved: a name that was absent is removed again."""
    for iface, fn in saved:
        if fn is None:
            iface._global_mapping.pop(name, None)
        else:
            iface._global_mapping[name] = fn


# ---- diffusers ---------------------------------------------------------------------------------------
def hook_registry(module):
    """The diffusers ``HookRegistry`` attached to ``module`` (``module._diffusers_hook``), or None."""
    reg = getattr(module, "_diffusers_hook", None)
    return reg if isinstance(reg, diffusers.hooks.HookRegistry) else None


def hook_names(module) -> list[str]:
    """Names of the diffusers hooks on ``module``, in registration order (``HookRegistry._hook_order``)."""
    return list(getattr(hook_registry(module), "_hook_order", []))


def forget_child_registries(modules) -> None:
    """Drop each registry's cached list of child registries (``HookRegistry._child_registries_cache``): diffusers
    fills it on first use and does not refresh it when hooks are added or removed below."""
    for m in modules:
        reg = getattr(m, "_diffusers_hook", None)
        if reg is not None and hasattr(reg, "_child_registries_cache"):
            reg._child_registries_cache = None


def block_metadata_known(cls) -> bool:
    """Whether diffusers' ``TransformerBlockRegistry`` knows block class ``cls`` (its own entries loaded first)."""
    diffusers.hooks._helpers.TransformerBlockRegistry._register()
    return cls in diffusers.hooks._helpers.TransformerBlockRegistry._registry


def register_block_metadata(cls, hidden_index: int, encoder_index: int | None) -> None:
    """Tell diffusers' block-level caches which outputs of block class ``cls`` are the image and text streams."""
    helpers = diffusers.hooks._helpers
    helpers.TransformerBlockRegistry.register(cls, helpers.TransformerBlockMetadata(
        return_hidden_states_index=hidden_index, return_encoder_hidden_states_index=encoder_index))


def unregister_block_metadata(cls) -> None:
    """Remove what :func:`register_block_metadata` added (``TransformerBlockRegistry._registry``)."""
    diffusers.hooks._helpers.TransformerBlockRegistry._registry.pop(cls, None)


def set_cache_context(transformer, step: int | None = None, n_steps: int | None = None, timestep: float | None = None):
    """The per-call cache context a diffusers pipeline sets with ``transformer.cache_context(...)``, for transformers
    without ``CacheMixin`` (``hooks._set_cache_context``); ``step=None`` clears it."""
    diffusers.hooks.hooks._set_cache_context(transformer, None if step is None else diffusers.hooks.hooks.CacheContext(
        "cfg", step_index=int(step), num_inference_steps=n_steps, timestep=float(timestep)))


def transformer_block_list_names() -> tuple:
    """The attribute names diffusers' caches look for block lists under (``hooks._common``)."""
    return tuple(diffusers.hooks._common._ALL_TRANSFORMER_BLOCK_IDENTIFIERS)


def flux_qkv_projections(attn, hidden_states, encoder_hidden_states):
    """Flux's projection helper, fused or not (``transformer_flux._get_qkv_projections``):
    ``(q, k, v, encoder_q, encoder_k, encoder_v)``."""
    return diffusers.models.transformers.transformer_flux._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
