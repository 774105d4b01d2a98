"""Tiny random-weight diffusers transformers, one per supported generator family, and valid inputs
for one forward call: what the generator family test suite and the reuse / peer tests run on.

    tr = tiny_transformer("flux")
    out = tr(**forward_inputs("flux", tr, batch=2, n_text=5))

Shapes are small (a 4x4 or 8x8 latent, 2 heads of 8) but keep every structural feature of the real
model: SD3.5's dual attention and qk-norm, Flux's double- and single-stream blocks and rotary
embeddings, Sana's linear self-attention next to softmax cross-attention, HunyuanDiT's two text
encoders and rotary embeddings, PixArt's masked cross-attention, DiT's class conditioning.
"""
from __future__ import annotations

import torch

from ...core.compat import diffusers
from ...core.errors import UnknownNameError
from ...gen_families import GEN_FAMILIES


def tiny_configs() -> dict[str, tuple[str, dict]]:
    """tag -> (diffusers class, constructor kwargs) of every registered generator family's tiny transformers (each
    adapter's ``tiny``): a family registered from its own file brings its tiny configs."""
    return {tag: spec for fam in GEN_FAMILIES.values() for tag, spec in fam.tiny.items()}


def _owner(tag: str):
    for fam in GEN_FAMILIES.values():
        if tag in fam.tiny:
            return fam
    raise UnknownNameError(f"no tiny config for {tag!r}; tags: {', '.join(tiny_configs())}")


#: the tiny configs of the families registered at import (what the family suites are parametrised over)
TINY = tiny_configs()


def tiny_transformer(family: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random-weight transformer of the tiny config ``family`` (a tag of :func:`tiny_configs`), in eval mode."""
    cls, kw = _owner(family).tiny[family]
    torch.manual_seed(seed)
    # a fork's own class, or diffusers' by name
    return (cls if isinstance(cls, type) else getattr(diffusers, cls))(**kw).to(dtype).eval()


def forward_inputs(family: str, transformer, batch: int = 2, n_text: int = 5, seed: int = 0,
                   n_pad: int = 2) -> dict:
    """Keyword arguments for one forward call of ``transformer`` (built by :func:`tiny_transformer`), from the
    family adapter's ``tiny_inputs``.

    ``n_text`` real text tokens; families with a text mask (PixArt, Sana, HunyuanDiT) get ``n_pad``
    padding tokens after them, masked out, so masks are exercised. ``batch`` rows (pass an even batch to
    stand for ``[uncond | cond]``)."""
    fam = _owner(family)
    g = torch.Generator().manual_seed(seed)
    dt = next(transformer.parameters()).dtype
    rn = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    t = torch.full((batch,), 500.0).to(dt)
    mask = torch.cat([torch.ones(batch, n_text), torch.zeros(batch, n_pad)], 1).long()
    return fam.tiny_inputs(family, transformer, batch, n_text, n_pad, rn, t, mask)
