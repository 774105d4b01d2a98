"""Cross-step reuse of attention outputs in a diffusers transformer, driven by a reuse policy.

    with ReuseCache(gen.transformer, REUSE_POLICIES["adaptive"](), n_steps=20) as rc:
        sample(gen, prompts, 20, callbacks=[rc])
    rc.computed_fraction        # share of attention work actually done

Each attention module's processor is wrapped; modules are keyed by name only (no block numbers: Flux's
single-stream blocks repeat the double-stream blocks' numbers). On ``compute`` the original processor
runs and its output (and input) are kept; on ``reuse`` the kept output is returned without running
attention; on ``reuse_text`` only the image side is computed, by module kind as the module's generator
family gives it (``reuse_kind``; the image side itself is the family's ``image_sides``, the cross-attention
processors that may keep their text keys and values its ``text_kv_processors``):

- joint attention (SD3 / SD3.5 ``attn``, Flux double-stream ``attn``): image queries over all keys (this
  step's text keys and values), the text stream's output reused; rotary embeddings (Flux) applied to the
  image queries with the image positions' part of the table and to all keys, as ``FluxAttnProcessor``
  does; counted as ``n_image / (n_image + n_text)`` of a call.
- Flux single-stream ``attn`` (one ``[text | image]`` sequence): the same, image query rows only, the text
  rows of the kept output reused; the text length is taken from the double-stream calls of the same
  forward (full compute when not known yet).
- cross-attention (PixArt, Sana, HunyuanDiT ``attn2``): the text keys and values, which do not change
  within a run, are projected once and reused; the original processor does everything else (masks, the
  rotary embedding HunyuanDiT applies to the queries, Sana's norms), so the output is the processor's
  own; counted as a full call (only the projections are saved).
- self-attention (PixArt / Sana / HunyuanDiT / DiT ``attn1``, SD3.5 ``attn2``) has no text side: computed in
  full, counted as a full call. Sana's linear self-attention is reused (``reuse``) as a whole output like
  any other.
- any other processor (fused projections, an attention mask on joint attention, a processor not named
  above): full compute, counted as a full call.

A step-level policy (``policy.level == "step"``, e.g. ``step_skip``) is asked once per transformer call
instead, by :class:`~unicache_lib.reuse.diffusers_hook.StepReuseHook` (the driver the diffusers hook
``step_skip`` uses too) registered in diffusers' ``HookRegistry`` for the run (removed on exit, also on
error), its steps counted by this cache's ``on_step_begin``. Work is counted in attention calls all the same:
a skipped transformer call skips every attention module once.

Processors are restored on exit, also on error.
"""
import math
import time
from contextlib import ExitStack

import torch

from ..core.errors import InputError
from ..core.hooks import ProcessorWrapper, model_hook, processors
from ..core.models import unwrap
from ..core.similarity import cosine
from ..families import UnsupportedModelError
from ..gen_families import gen_family_of
from .diffusers_hook import StepReuseHook


def module_kinds(transformer) -> dict[str, str]:
    """``{module name: kind}`` of the attention modules reuse wraps: ``joint`` / ``single`` (Flux single-stream) /
    ``cross`` / ``self``, as the module's generator family says (:meth:`~unicache_lib.gen_families.GenFamily.reuse_kind`)."""
    tr = unwrap(getattr(transformer, "transformer", transformer))
    fam = gen_family_of(tr)
    return {s.name: fam.reuse_kind(s) for s in fam.sites(tr) if s.captured}


class _Replay(torch.nn.Module):
    """Stands in for a projection: its output for this input shape, computed once."""

    def __init__(self, inner, store: dict, key: str):
        super().__init__()
        self.inner, self.store, self.key = inner, store, key

    def forward(self, x):
        v = self.store.get(self.key)
        if v is None or v.shape[:-1] != x.shape[:-1]:
            v = self.store[self.key] = self.inner(x)
        return v


class _ReuseProcessor(ProcessorWrapper):
    def __init__(self, rc: "ReuseCache", orig, name: str, kind: str, family):
        super().__init__(orig)
        self.rc, self.name, self.kind, self.family = rc, name, kind, family
        self.pname = type(orig).__name__
        self.out, self.inp, self.kv = None, None, {}  # the kept output and input; cross-attention's text K/V

    # ---- image side only ----------------------------------------------------------------------------
    def _image_side(self, attn, h, e, mask, rope, args, kwargs):
        """(output, share of a full call's work) or None where only a full compute is implemented."""
        out, side = self.out, self.family.image_sides.get(self.pname)
        if (side and self.kind == "joint" and isinstance(out, tuple) and out[1] is not None and e is not None
                and mask is None):
            img = side(attn, h, e, rope)
            if img is not None:
                return (img, out[1]), h.shape[1] / (h.shape[1] + e.shape[1])
        if (side and self.kind == "single" and torch.is_tensor(out) and mask is None and self.rc._n_text
                and out.shape[:2] == h.shape[:2]):
            n_txt = self.rc._n_text
            img = side(attn, h[:, n_txt:], None, rope, keys=h)
            if img is not None:
                return torch.cat([out[:, :n_txt], img], 1), (h.shape[1] - n_txt) / h.shape[1]
        if self.kind == "cross" and self.pname in self.family.text_kv_processors and e is not None:
            saved = attn.to_k, attn.to_v
            attn.to_k, attn.to_v = _Replay(saved[0], self.kv, "k"), _Replay(saved[1], self.kv, "v")
            try:
                return self.orig(attn, *args, **kwargs), 1.0
            finally:
                attn.to_k, attn.to_v = saved
        return None

    def __call__(self, attn, *args, **kwargs):
        rc, pol = self.rc, self.rc.policy
        a = self.arguments(args, kwargs)
        h, e = a.get("hidden_states"), a.get("encoder_hidden_states")
        rc._calls += 1
        if not torch.is_tensor(h):  # a call this wrapper cannot read: pass it through, as a full compute
            rc._work += 1.0
            return self.orig(attn, *args, **kwargs)
        if self.kind == "joint" and e is not None:
            rc._n_text = int(e.shape[1])
        fresh = self.inp is None or self.inp.shape != h.shape  # nothing kept for inputs of this shape
        sim = float(cosine(h.flatten(), self.inp.flatten())) if not fresh and pol.uses_similarity else math.nan
        d = pol.decide(rc.step, rc.n_steps, sim, key=self.name)
        if d == "reuse" and not fresh:
            return self.out
        if d == "reuse_text" and not fresh:
            got = self._image_side(attn, h, e, a.get("attention_mask"), a.get("image_rotary_emb"), args, kwargs)
            if got is not None:
                rc._work += got[1]
                return got[0]
        out = self.orig(attn, *args, **kwargs)
        self.out, self.inp = out, h.detach()
        rc._work += 1.0
        return out


class ReuseCache:
    """Context manager applying a :class:`~unicache_lib.reuse.policies.base.ReusePolicy` to every
    attention module of ``transformer`` (a diffusers transformer or a Generator) over one sampling run
    of ``n_steps`` (library loop callback: ``on_step_begin(step, timestep)``)."""

    def __init__(self, transformer, policy, n_steps: int):
        self.transformer = getattr(transformer, "transformer", transformer)
        self.policy, self.n_steps = policy, n_steps
        self.level = getattr(policy, "level", "attention")
        if self.level not in ("attention", "step"):
            raise InputError(f"policy {type(policy).__name__} has level {self.level!r}; expected 'attention' or 'step'")
        try:
            self.targets = gen_family_of(self.transformer).modules(self.transformer)
        except UnsupportedModelError:
            if self.level != "step":
                raise
            self.targets = {}  # step level: attention modules only size the work count; each call is one unit
        self.step, self._last_step, self.t = 0, -1, math.nan
        self._work, self._calls = 0.0, 0  # attention level: work done / calls made, counted by the processors
        self._n_text, self._hook = None, None  # step level: _hook, the StepReuseHook driving the run
        self._stack: ExitStack | None = None

    def on_step_begin(self, step, timestep):
        step = int(step)
        if step >= self.n_steps:
            raise InputError(f"ReuseCache was built for n_steps={self.n_steps} but the run reached step {step}: its "
                             f"schedule (which steps to compute, how far to reuse) is for another run. Build it with "
                             f"n_steps equal to the sampler's step count")
        self.step, self._last_step, self.t = step, max(self._last_step, step), float(timestep)

    @property
    def computed_fraction(self) -> float:
        """Attention work done / attention calls made (1.0 = nothing reused)."""
        return self.work / self.calls if self.calls else math.nan

    @property
    def calls(self) -> int:
        """Attention calls made (step level: a transformer call stands for every attention module once)."""
        return self._calls + self.forward_calls * max(1, len(self.targets))

    @property
    def work(self) -> float:
        """Attention work done, in full attention calls."""
        return self._work + self.forward_computed * max(1, len(self.targets))

    @property
    def processor_fraction(self) -> float:
        """Share of the attention calls that reached the processors which did their full work: what a
        count of processor calls (:class:`AttentionCallCounter`) must be scaled by to give the work done.
        Step level: 1.0 (a skipped transformer call never reaches the processors)."""
        return 1.0 if self.level == "step" else self.computed_fraction

    def __enter__(self):
        self._stack = ExitStack()
        if self.level == "step":  # in diffusers' HookRegistry, beside its own caches
            self._hook = StepReuseHook(self.policy, self.n_steps, clock=self._clock)
            self._stack.enter_context(model_hook(self.transformer, "unicache_reuse", self._hook))
        else:
            fam, kinds = gen_family_of(unwrap(self.transformer)), module_kinds(self.transformer)
            wrap = lambda name, orig: _ReuseProcessor(self, orig, name, kinds[name], fam)  # noqa: E731
            self._stack.enter_context(processors(self.targets, wrap))
        return self

    def _clock(self) -> tuple[int, float]:
        return self.step, (self.t if math.isfinite(self.t) else float(self.step))

    @property
    def forward_calls(self) -> int:
        """Step level: transformer calls made."""
        return self._hook.calls if self._hook else 0

    @property
    def forward_computed(self) -> int:
        """Step level: transformer calls actually run."""
        return self._hook.computed if self._hook else 0

    def __exit__(self, *exc):
        self._stack.close()
        if exc[0] is None and 0 <= self._last_step < self.n_steps - 1:
            raise InputError(f"ReuseCache was built for n_steps={self.n_steps} but the run had {self._last_step + 1} "
                             f"steps: its decisions were made on another schedule (a 20-step plan on 10 steps reuses "
                             f"nothing it meant to). Build it with n_steps={self._last_step + 1}")
        return False


class AttentionCallCounter(ExitStack):
    """Counts the attention work that actually ran under any caching scheme, e.g. a diffusers cache
    that skips modules or whole blocks: ``with AttentionCallCounter(tr) as c: ...``.

    ``calls``: processor calls; ``rows``: batch rows those calls processed (a call on half of the CFG
    batch, as FasterCache makes when it skips the unconditional branch, counts half a full call).
    Compare ``rows`` with the same count from a run without caching. ``seconds``: wall-clock spent inside
    the attention processors (CUDA synchronised around each call, so only meaningful for profiling)."""

    def __init__(self, transformer):
        tr = getattr(transformer, "transformer", transformer)
        self.targets = gen_family_of(tr).modules(tr)
        self.calls, self.rows, self.seconds = 0, 0, 0.0
        super().__init__()

    def __enter__(self):
        self.enter_context(processors(self.targets, lambda name, orig: _Counting(self, orig)))
        return self


class _Counting(ProcessorWrapper):
    def __init__(self, counter, orig):
        super().__init__(orig)
        self.counter = counter

    def __call__(self, attn, *args, **kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        self.counter.calls += 1
        self.counter.rows += int(h.shape[0])
        sync = torch.cuda.synchronize if h.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = self.orig(attn, *args, **kwargs)
        sync()
        self.counter.seconds += time.perf_counter() - t0
        return out
