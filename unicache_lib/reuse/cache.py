"""Cross-step reuse of attention outputs in a diffusers transformer, driven by a reuse policy.

    with ReuseCache(gen.transformer, REUSE_POLICIES["adaptive"](), n_steps=20) as rc:
        sample(gen, prompts, 20, callbacks=[rc])
    rc.computed_fraction        # share of attention work actually done

Each attention module's processor is wrapped. On ``compute`` the original processor runs and its
output (and input) are kept; on ``reuse`` the kept output is returned without running attention;
on ``reuse_text`` only the image side is computed (joint attention: image queries over all keys,
the text stream's output reused; cross-attention: the text keys/values, which never change, are
reused). Processors are restored on exit, also on error.
"""
from __future__ import annotations

import math
from contextlib import ExitStack

import torch
import torch.nn.functional as F

from ..capture.diffusion import _heads_view, find_diffusion_attention, wrap_processors
from ..similarity import cosine


class _ReuseProcessor:
    def __init__(self, rc: "ReuseCache", orig, name: str, part: str):
        self.rc, self.orig, self.name, self.part = rc, orig, name, part
        self.out = self.inp = self.kv = None

    def _image_side_joint(self, attn, h, e):
        b = h.shape[0]
        q = _heads_view(attn.to_q(h), attn.heads)
        k = torch.cat([_heads_view(attn.to_k(h), attn.heads), _heads_view(attn.add_k_proj(e), attn.heads)], 2)
        v = torch.cat([_heads_view(attn.to_v(h), attn.heads), _heads_view(attn.add_v_proj(e), attn.heads)], 2)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            n = h.shape[1]
            k = torch.cat([attn.norm_k(k[:, :, :n]), attn.norm_added_k(k[:, :, n:]) if attn.norm_added_k is not None else k[:, :, n:]], 2)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, attn.heads * q.shape[-1]).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](o))

    def _image_side_cross(self, attn, h, e, mask):
        b = h.shape[0]
        if self.kv is None:
            self.kv = (_heads_view(attn.to_k(e), attn.heads), _heads_view(attn.to_v(e), attn.heads))
        k, v = self.kv
        q = _heads_view(attn.to_q(h), attn.heads)
        if mask is not None:
            mask = attn.prepare_attention_mask(mask, e.shape[1], b).view(b, attn.heads, -1, mask.shape[-1])
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, -1, attn.heads * q.shape[-1])
        return attn.to_out[1](attn.to_out[0](o.to(q.dtype)))

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kw):
        rc = self.rc
        pol = rc.policy
        sim = float(cosine(hidden_states.flatten(), self.inp.flatten())) if self.inp is not None and pol.uses_similarity else math.nan
        d = pol.decide(rc.step, rc.n_steps, sim, key=self.name)
        if d == "reuse" and self.out is not None:
            rc.calls += 1
            return self.out
        if d == "reuse_text" and self.part == "joint" and isinstance(self.out, tuple):
            n_img, n_txt = hidden_states.shape[1], encoder_hidden_states.shape[1]
            rc.work += n_img / (n_img + n_txt)
            rc.calls += 1
            return self._image_side_joint(attn, hidden_states, encoder_hidden_states), self.out[1]
        if d == "reuse_text" and self.part == "cross":
            rc.work += 1.0  # the attention itself is computed; only the text K/V projections are saved
            rc.calls += 1
            return self._image_side_cross(attn, hidden_states, encoder_hidden_states, attention_mask)
        out = self.orig(attn, hidden_states, encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, **kw)
        self.out, self.inp = out, hidden_states.detach()
        rc.work += 1.0
        rc.calls += 1
        return out


class ReuseCache:
    """Context manager applying a :class:`~unicache_lib.reuse.policies.base.ReusePolicy` to every
    attention module of ``transformer`` over one sampling run of ``n_steps`` (library loop callback)."""

    def __init__(self, transformer, policy, n_steps: int):
        self.transformer, self.policy, self.n_steps = transformer, policy, n_steps
        self.targets = find_diffusion_attention(transformer)
        self.step = 0
        self.work = 0.0
        self.calls = 0
        self._stack: ExitStack | None = None

    def on_step_begin(self, step, timestep):
        self.step = int(step)

    @property
    def computed_fraction(self) -> float:
        """Attention work done / attention calls made (1.0 = nothing reused)."""
        return self.work / self.calls if self.calls else math.nan

    def __enter__(self):
        self._stack = wrap_processors(self.targets, lambda name, layer, part, orig: _ReuseProcessor(self, orig, name, part))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


class AttentionCallCounter:
    """Counts the attention work that actually ran under any caching scheme, e.g. a diffusers cache
    that skips modules or whole blocks: ``with AttentionCallCounter(tr) as c: ...``.

    ``calls``: processor calls; ``rows``: batch rows those calls processed (a call on half of the CFG
    batch, as FasterCache makes when it skips the unconditional branch, counts half a full call).
    Compare ``rows`` with the same count from a run without caching."""

    def __init__(self, transformer):
        self.targets = find_diffusion_attention(transformer)
        self.calls = 0
        self.rows = 0
        self._stack: ExitStack | None = None

    def __enter__(self):
        self._stack = wrap_processors(self.targets, lambda name, layer, part, orig: _Counting(self, orig))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


class _Counting:
    def __init__(self, counter, orig):
        self.counter, self.orig = counter, orig

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **kw):
        self.counter.calls += 1
        self.counter.rows += int(hidden_states.shape[0])
        return self.orig(attn, hidden_states, encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, **kw)
