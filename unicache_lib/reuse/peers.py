"""diffusers' own caches as peers, driven from the library's sampling loop.

Neither ``SD3Transformer2DModel`` nor ``PixArtTransformer2DModel`` has ``CacheMixin`` (no
``enable_cache``), so the hooks are applied with ``diffusers.hooks.apply_*`` and the per-call cache
context a pipeline would set is set here, at every step, around the one CFG-batched call.
Known limits on these models (diffusers 0.42.1) are raised as :class:`PeerUnsupported` with the
reason, not hidden.
"""
from __future__ import annotations

PEERS = ("pab", "fastercache", "first_block", "taylorseer", "magcache")


class PeerUnsupported(RuntimeError):
    """This diffusers cache cannot run on this model (the message says why)."""


class DiffusersCache:
    """Sampling-loop callback and context manager for one diffusers cache on ``gen.transformer``."""

    def __init__(self, gen, kind: str, n_steps: int, guidance: float = 3.0, calibration: list | None = None):
        if kind not in PEERS:
            raise ValueError(f"unknown peer {kind!r}; choose from {PEERS}")
        self.gen, self.kind, self.n_steps, self.guidance = gen, kind, n_steps, guidance
        self.calibration = calibration
        self.t = 1000.0
        self.step = 0

    def _config(self):
        from diffusers.hooks import (FasterCacheConfig, FirstBlockCacheConfig, MagCacheConfig,
                                     PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig)

        fam = self.gen.family
        if self.kind == "pab":
            ids = ("transformer_blocks",)
            return PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800),
                spatial_attention_block_identifiers=ids, cross_attention_block_skip_range=None if fam == "sd3" else 3,
                cross_attention_timestep_skip_range=(100, 800), current_timestep_callback=lambda: self.t)
        if self.kind == "fastercache":
            return FasterCacheConfig(
                spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 681),
                current_timestep_callback=lambda: self.t, attention_weight_callback=lambda _: 0.3,
                unconditional_batch_skip_range=5, unconditional_batch_timestep_skip_range=(-1, 781),
                spatial_attention_block_identifiers=("transformer_blocks",), tensor_format="BCHW",
                is_guidance_distilled=False,
                _unconditional_conditional_input_kwargs_identifiers=("hidden_states", "encoder_hidden_states", "timestep",
                                                                      "pooled_projections", "encoder_attention_mask"))
        if self.kind == "first_block":
            if fam == "sd3":
                raise PeerUnsupported("FirstBlockCache: SD3's last block (context_pre_only=True) returns no encoder "
                                      "states, which the cache's tail hook expects")
            return FirstBlockCacheConfig(threshold=0.2)  # 0.05 never skipped on the tiny PixArt
        if self.kind == "taylorseer":
            if fam == "sd3":
                raise PeerUnsupported("TaylorSeer: SD3's last block (context_pre_only=True) returns no encoder states")
            return TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=3, max_order=1,
                                         taylor_factors_dtype=self.gen.transformer.dtype,
                                         cache_identifiers=[r"transformer_blocks\.\d+\.attn1", r"transformer_blocks\.\d+\.attn2"])
        if self.kind == "magcache":
            if self.calibration == "calibrate":
                return MagCacheConfig(calibrate=True, num_inference_steps=self.n_steps)
            if not self.calibration:
                raise PeerUnsupported("MagCache needs mag_ratios from a calibration run: magcache_ratios(gen, ...)")
            return MagCacheConfig(mag_ratios=self.calibration, num_inference_steps=self.n_steps, threshold=0.06, max_skip_steps=3)

    def __enter__(self):
        import logging
        import warnings

        # FasterCache announces itself as experimental on every application and trips a torch.meshgrid
        # deprecation warning; both once per run would bury a notebook's output
        logging.getLogger("diffusers.hooks.faster_cache").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="torch.meshgrid", category=UserWarning)
        from diffusers.hooks import (apply_faster_cache, apply_first_block_cache, apply_mag_cache,
                                     apply_pyramid_attention_broadcast, apply_taylorseer_cache)

        apply = {"pab": apply_pyramid_attention_broadcast, "fastercache": apply_faster_cache,
                 "first_block": apply_first_block_cache, "taylorseer": apply_taylorseer_cache, "magcache": apply_mag_cache}
        cfg = self._config()
        apply[self.kind](self.gen.transformer, cfg)
        self._forget_child_registries()
        return self

    def _forget_child_registries(self):
        """diffusers caches each registry's list of child registries on first use; after hooks are
        added or removed that list is stale (a cache context would then miss the new hooks)."""
        for m in self.gen.transformer.modules():
            reg = getattr(m, "_diffusers_hook", None)
            if reg is not None and hasattr(reg, "_child_registries_cache"):
                reg._child_registries_cache = None

    def on_step_begin(self, step, timestep):
        from diffusers.hooks.hooks import CacheContext, _set_cache_context

        self.step, self.t = int(step), float(timestep)
        _set_cache_context(self.gen.transformer, CacheContext("cfg", step_index=int(step), num_inference_steps=self.n_steps,
                                                              timestep=float(timestep)))

    def on_step_end(self, step, timestep, sample):
        from diffusers.hooks.hooks import _set_cache_context

        _set_cache_context(self.gen.transformer, None)

    def __exit__(self, *exc):
        from diffusers.hooks import HookRegistry

        tr = self.gen.transformer
        for m in tr.modules():
            reg = getattr(m, "_diffusers_hook", None)
            if isinstance(reg, HookRegistry):
                for name in list(reg.hooks):
                    reg.remove_hook(name, recurse=False)
        self._forget_child_registries()
        return False


def magcache_ratios(gen, prompts: list[str], n_steps: int, guidance: float = 3.0, seed: int = 0) -> list[float]:
    """MagCache's magnitude ratios for this model and schedule, from one calibration run (diffusers
    prints them at the end of the run; they are read back from that output)."""
    import ast
    import contextlib
    import io

    from ..zoo.sampling import sample

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), DiffusersCache(gen, "magcache", n_steps, guidance, calibration="calibrate") as pc:
        sample(gen, prompts, n_steps, guidance, seed=seed, callbacks=[pc])
    lists = [ln for ln in buf.getvalue().splitlines() if ln.strip().startswith("[")]
    if not lists:
        raise PeerUnsupported("MagCache calibration printed no ratios")
    return [float(x) for x in ast.literal_eval(lists[-1].strip())]
