"""diffusers' own caches as peers, driven from the library's sampling loop, on every generator family.

    with DiffusersCache(gen, "taylorseer", n_steps=20) as pc:    # gen: a library Generator ...
        sample(gen, prompts, 20, callbacks=[pc])
    with DiffusersCache(transformer, "pab", n_steps=4) as pc:     # ... or a bare diffusers transformer
        for i, t in enumerate(timesteps):
            pc.on_step_begin(i, t); transformer(**inputs); pc.on_step_end(i, t, None)

Of the supported transformers only Flux has ``CacheMixin`` (``enable_cache``), so every cache is applied
with ``diffusers.hooks.apply_*`` and the per-call cache context a pipeline would set with
``transformer.cache_context(...)`` is set here, at every step, around the one (CFG-batched) call.

How each cache is configured on a family is that family's adapter's ``peers``
(:class:`~unicache_lib.gen_families.base.FamilyPeers`, read here as :data:`FAMILY_PEERS`): the module names the
caches' identifiers must match on that family (diffusers' defaults assume ``transformer_blocks.N.attn`` or
``attn1``-style names and miss e.g. HunyuanDiT's ``blocks.N.attn1``), which keyword arguments carry the
``[uncond | cond]`` batch (FasterCache splits only those), whether the model is guidance-distilled, the
diffusers block classes the block-level caches need metadata for, and, per peer, what the family needs
that diffusers 0.42.1 does not do (each such gap was checked by running the cache unmodified; the tests
in ``tests/test_gen_families.py`` re-check every stated failure). A peer that cannot run raises
:class:`PeerUnsupported` with the reason. :func:`peer_family_key` maps a transformer to its family's key through the
generator-family registry.

Settings are the authors' defaults unless the family needs otherwise:

- PAB: spatial broadcast range 2, cross-attention range 6 (the paper's pyramid: cross-attention is the
  most similar across steps and is broadcast longest), both within timesteps (100, 800), as in diffusers'
  example; on the modules the family table names (joint attention counts as spatial: it is not
  cross-attention).
- FasterCache: diffusers' defaults (attention every 2nd call within timesteps (-1, 681), the unconditional
  half of the batch every 5th call within (-1, 641), attention weight 0.3 as in diffusers' example),
  ``tensor_format="BCHW"``; guidance-distilled families (Flux) and runs without CFG skip no batch half
  (``is_guidance_distilled=True``, as diffusers' own Flux tests configure it).
- FirstBlockCache: threshold 0.2 (diffusers' example; its default 0.05 never skips on the tiny models).
- TaylorSeer: diffusers' defaults (full compute for 3 steps, then one computed step every 5, first
  order) on the family's attention modules, factors in the model's dtype.
- MagCache: diffusers' defaults (threshold 0.06, at most 3 skipped steps in a row, no skipping in the
  first 20% of steps) with magnitude ratios from a calibration run (:func:`magcache_ratios`).

``options`` overrides fields of the config above (``dataclasses.replace``), for sweeps at other budgets, e.g.
``DiffusersCache(gen, "taylorseer", 50, options={"cache_interval": 6, "max_order": 2, "use_lite_mode": True})``
(``benchmarks/reuse_steps.py``: TaylorSeer at the FLOPs of ``step_skip``); an unknown field is refused, naming
the config's fields.
"""
import ast
import contextlib
import dataclasses
import io
from collections.abc import Mapping

import torch

from ..core import compat
from ..core.compat import diffusers
from ..core.errors import InputError, PeerUnsupported
from ..core.models import quiet, unwrap
from ..gen_families import GEN_FAMILIES, gen_family_of
from ..runtime.sampling import sample

PEERS = ("pab", "fastercache", "first_block", "taylorseer", "magcache")


class _AdapterPeers(Mapping):
    """family key -> its :class:`FamilyPeers`, read from the generator adapters at each lookup (each adapter carries
    its own ``peers``, so a family registered from one file is configured here too)."""

    def _table(self) -> dict:
        return {f.key: f.peers for f in GEN_FAMILIES.values() if f.peers is not None}

    def __getitem__(self, key):
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self):
        return len(self._table())


FAMILY_PEERS = _AdapterPeers()
FAMILY_ALIASES = {"sd3.5": "sd3"}


def peer_family_key(transformer) -> str:
    """The :data:`FAMILY_PEERS` key of a diffusers transformer: its generator family's ``key``
    (:func:`unicache_lib.gen_families.gen_family_of`, which names the supported families otherwise)."""
    key = gen_family_of(transformer).key
    if key not in FAMILY_PEERS:
        raise PeerUnsupported(f"no peer configuration for family {key!r}; configured: {', '.join(FAMILY_PEERS)}")
    return key


def _resolve(target) -> tuple[object, str]:
    """(transformer, family) of a library Generator (``.transformer``, ``.family``) or a bare transformer."""
    tr = unwrap(target if getattr(target, "transformer", None) is None else target.transformer)
    fam = getattr(target, "family", None) if tr is not target else None
    fam = FAMILY_ALIASES.get(fam, fam)
    return tr, (fam if fam in FAMILY_PEERS else peer_family_key(tr))


def _pass_encoder_through():
    """diffusers hook for SD3's last block (see ``FamilyPeers.tail_passes_encoder``)."""
    class Hook(diffusers.hooks.ModelHook):
        def new_forward(self, module, *args, **kwargs):
            out = self.fn_ref.original_forward(*args, **kwargs)
            if isinstance(out, tuple) and out[0] is None:
                enc = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
                out = (enc, *out[1:])
            return out

    return Hook()


_REGISTERED: dict = {}  # block class -> number of DiffusersCache contexts that registered it


class DiffusersCache:
    """Sampling-loop callback and context manager for one diffusers cache.

    ``target``: a library ``Generator`` (``.transformer``, ``.family``) or a bare diffusers transformer
    (family from its class). ``guidance``: the run's CFG scale; 1.0 means the batch has no
    unconditional half (FasterCache then skips none). ``calibration``: MagCache's ratios
    (:func:`magcache_ratios`), or ``"calibrate"`` for the calibration run itself."""

    def __init__(self, target, kind: str, n_steps: int, guidance: float = 3.0, calibration: list | str | None = None,
                 options: dict | None = None):
        if kind not in PEERS:
            raise InputError(f"unknown peer {kind!r}; choose from {PEERS}")
        self.options = dict(options or {})
        self.transformer, self.family = _resolve(target)
        self.spec = FAMILY_PEERS[self.family]
        self.kind, self.n_steps, self.guidance, self.calibration = kind, n_steps, guidance, calibration
        self.t, self.step = 1000.0, 0
        self._added: list = []  # (module, hook name) this cache added
        self._registered: list = []  # block classes whose metadata it registered

    def config(self):
        """The diffusers config object for this peer on this family (raises :class:`PeerUnsupported`), with
        ``options`` applied."""
        cfg = self._default_config()
        if not self.options:
            return cfg
        fields = {f.name for f in dataclasses.fields(cfg)}
        bad = sorted(set(self.options) - fields)
        if bad:
            raise InputError(f"{type(cfg).__name__} has no field {bad[0]!r}; its fields: {', '.join(sorted(fields))}")
        if self.kind == "taylorseer" and self.options.get("use_lite_mode") and self.spec.tail_passes_encoder:
            raise PeerUnsupported(f"TaylorSeer's lite mode records the output of every block, and {self.family}'s last block "
                                  "returns None for the text stream (diffusers 0.42.1: AttributeError on None.dtype); "
                                  "use the default mode (attention modules)")
        return dataclasses.replace(cfg, **self.options)

    def _default_config(self):
        spec, tr = self.spec, self.transformer
        if self.kind in spec.unsupported:
            raise PeerUnsupported(spec.unsupported[self.kind])
        distilled = spec.guidance_distilled or self.guidance == 1.0  # no [uncond | cond] batch to halve
        if self.kind in spec.unsupported_when and not (self.kind == "fastercache" and distilled):
            attr, reason = spec.unsupported_when[self.kind]
            if getattr(tr, attr, False):
                raise PeerUnsupported(reason)
        if self.kind != "magcache":
            dh = diffusers.hooks
            return {"pab": lambda: dh.PyramidAttentionBroadcastConfig(
                        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800),
                        spatial_attention_block_identifiers=spec.spatial,
                        cross_attention_block_skip_range=6 if spec.cross else None,
                        cross_attention_timestep_skip_range=(100, 800), cross_attention_block_identifiers=spec.cross or (),
                        current_timestep_callback=lambda: self.t),
                    "fastercache": lambda: dh.FasterCacheConfig(
                        current_timestep_callback=lambda: self.t, attention_weight_callback=lambda _: 0.3,
                        spatial_attention_block_identifiers=spec.spatial, tensor_format="BCHW",
                        is_guidance_distilled=distilled, _unconditional_conditional_input_kwargs_identifiers=spec.cfg_kwargs),
                    "first_block": lambda: dh.FirstBlockCacheConfig(threshold=0.2),
                    "taylorseer": lambda: dh.TaylorSeerCacheConfig(taylor_factors_dtype=next(tr.parameters()).dtype,
                                                                   cache_identifiers=[spec.attention])}[self.kind]()
        if isinstance(self.calibration, str) and self.calibration == "calibrate":
            return diffusers.hooks.MagCacheConfig(calibrate=True, num_inference_steps=self.n_steps)
        if self.calibration is None or len(self.calibration) == 0:
            raise PeerUnsupported("MagCache needs mag_ratios from a calibration run: magcache_ratios(gen, ...)")
        return diffusers.hooks.MagCacheConfig(mag_ratios=list(self.calibration), num_inference_steps=self.n_steps)

    # ---- applying and removing ---------------------------------------------------------------------
    def _hooks(self) -> list:
        """(module, hook name) of every diffusers hook on the transformer, in registration order per module."""
        return [(m, name) for m in self.transformer.modules() for name in compat.hook_names(m)]

    def _register_blocks(self):
        for m in self.transformer.modules():
            cls = type(m)
            if cls.__name__ in self.spec.blocks and cls not in self._registered:
                if not compat.block_metadata_known(cls):  # diffusers' own entries first
                    compat.register_block_metadata(cls, *self.spec.blocks[cls.__name__])
                    _REGISTERED[cls] = 0
                if cls in _REGISTERED:
                    _REGISTERED[cls] += 1
                    self._registered.append(cls)

    def _unregister_blocks(self):
        for cls in self._registered:
            _REGISTERED[cls] -= 1
            if _REGISTERED[cls] == 0:
                del _REGISTERED[cls]
                compat.unregister_block_metadata(cls)
        self._registered = []

    def __enter__(self):
        dh = diffusers.hooks
        apply = {"pab": dh.apply_pyramid_attention_broadcast, "fastercache": dh.apply_faster_cache,
                 "first_block": dh.apply_first_block_cache, "taylorseer": dh.apply_taylorseer_cache,
                 "magcache": dh.apply_mag_cache}
        cfg = self.config()
        before = self._hooks()
        # FasterCache announces itself as experimental on every application and trips a torch.meshgrid
        # deprecation warning; both once per run would bury a notebook's output (silenced until __exit__)
        self._quiet = quiet(loggers=("diffusers.hooks.faster_cache",), warning_messages=("torch.meshgrid",))
        self._quiet.__enter__()
        try:
            try:
                if self.kind in ("first_block", "magcache"):
                    self._register_blocks()
                if self.kind == "first_block" and self.spec.tail_passes_encoder:
                    dh.HookRegistry.check_if_exists_or_initialize(_last_block(self.transformer)).register_hook(
                        _pass_encoder_through(), "unicache_tail_passes_encoder")
                apply[self.kind](self.transformer, cfg)
            finally:
                self._added = [h for h in self._hooks() if h not in before]
        except BaseException:
            self.__exit__()  # removes what was added, then the silencing
            raise
        # diffusers caches each registry's list of child registries on first use; after hooks are added or
        # removed that list is stale (a cache context would then miss the new hooks)
        compat.forget_child_registries(self.transformer.modules())
        return self

    def _remove(self):
        # newest first on each module: diffusers' remove_hook unlinks a hook that others were stacked on
        # from the registry but not from the newer hooks' saved forwards, which would keep it running
        for m, name in reversed(self._added):
            compat.hook_registry(m).remove_hook(name, recurse=False)
        self._added = []
        self._unregister_blocks()
        compat.forget_child_registries(self.transformer.modules())

    def on_step_begin(self, step, timestep):
        self.step, self.t = int(step), float(timestep)
        compat.set_cache_context(self.transformer, int(step), self.n_steps, float(timestep))

    def on_step_end(self, step, timestep, sample):
        compat.set_cache_context(self.transformer, None)

    def __exit__(self, *exc):
        try:
            self._remove()
        finally:
            self._quiet.__exit__(None, None, None)
        return False


def _last_block(transformer):
    """The last block of the transformer's block lists, as FirstBlockCache picks its tail block."""
    names = compat.transformer_block_list_names()
    return [b for name, sub in transformer.named_children() if name in names and isinstance(sub, torch.nn.ModuleList)
            for b in sub][-1]


def ratios_from_output(text: str) -> list[float]:
    """MagCache's calibration ratios from what its calibration run printed (the last list printed)."""
    lists = [ln for ln in text.splitlines() if ln.strip().startswith("[")]
    if not lists:
        raise PeerUnsupported("MagCache calibration printed no ratios (did the run reach num_inference_steps?)")
    return [float(x) for x in ast.literal_eval(lists[-1].strip())]


def calibrate_magcache(target, n_steps: int, run, guidance: float = 3.0) -> list[float]:
    """MagCache's magnitude ratios from one calibration run: ``run(callback)`` must make the ``n_steps``
    denoising calls with ``callback``'s ``on_step_begin`` / ``on_step_end`` around each (diffusers prints
    the ratios at the end of the run; they are read back from that output)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), DiffusersCache(target, "magcache", n_steps, guidance,
                                                         calibration="calibrate") as pc:
        run(pc)
    return ratios_from_output(buf.getvalue())


def magcache_ratios(gen, prompts: list[str], n_steps: int, guidance: float = 3.0, seed: int = 0) -> list[float]:
    """MagCache's magnitude ratios for this generator and schedule, from one calibration run of the
    library's loop on ``prompts`` (hold them out from the prompts the methods are scored on)."""
    return calibrate_magcache(gen, n_steps, lambda pc: sample(gen, prompts, n_steps, guidance, seed=seed, callbacks=[pc]),
                              guidance)
