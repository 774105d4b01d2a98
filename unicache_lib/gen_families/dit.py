"""DiT (class-conditioned): image self-attention only (``attn1``); no text."""
from __future__ import annotations

from .base import GenFamily, register, standard_probs


@register
class DiT(GenFamily):
    name = "DiT"
    key = "dit"
    transformer_classes = ("DiTTransformer2DModel",)
    pipeline_classes = ("DiTPipeline",)
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"),)
    parts = ("self",)
    processors = {"AttnProcessor2_0": standard_probs}
    default_processors = {"self": "diffusers.models.attention_processor:AttnProcessor2_0"}
