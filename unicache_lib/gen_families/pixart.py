"""PixArt-α / PixArt-Σ: image self-attention (``attn1``) and cross-attention from the image to the T5
text (``attn2``), whose padding keys are masked (additive -10000 bias)."""
from __future__ import annotations

from .base import GenFamily, register, standard_probs


@register
class PixArt(GenFamily):
    name = "PixArt"
    key = "pixart"
    transformer_classes = ("PixArtTransformer2DModel",)
    pipeline_classes = ("PixArtAlphaPipeline", "PixArtSigmaPipeline")
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"), (r"transformer_blocks\.(\d+)\.attn2", "cross"))
    parts = ("self", "cross")
    processors = {"AttnProcessor2_0": standard_probs}
    default_processors = {"self": "diffusers.models.attention_processor:AttnProcessor2_0",
                          "cross": "diffusers.models.attention_processor:AttnProcessor2_0"}
