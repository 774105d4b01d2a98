"""PixArt-α / PixArt-Σ: image self-attention (``attn1``) and cross-attention from the image to the T5
text (``attn2``), whose padding keys are masked (additive -10000 bias)."""
from __future__ import annotations

from .base import FamilyPeers, GenFamily, register, standard_probs


@register
class PixArt(GenFamily):
    name = "PixArt"
    key = "pixart"
    # cross-attention DiT: self-attention attn1, cross-attention attn2 (text mask)
    peers = FamilyPeers(
        attention=r"transformer_blocks\.\d+\.attn[12]",
        spatial=(r"^transformer_blocks\.\d+\.attn1$",), cross=(r"^transformer_blocks\.\d+\.attn2$",),
        cfg_kwargs=("hidden_states", "encoder_hidden_states", "encoder_attention_mask", "timestep"),
        unsupported_when={"fastercache": (
            "use_additional_conditions",
            "FasterCache: this PixArt (use_additional_conditions, e.g. PixArt-alpha at 1024 px) gets its resolution "
            "and aspect-ratio conditions inside added_cond_kwargs, a dict FasterCache does not halve when it skips "
            "the unconditional branch, so that call mixes a half batch with full-batch conditions and fails")})
    transformer_classes = ("PixArtTransformer2DModel",)
    pipeline_classes = ("PixArtAlphaPipeline", "PixArtSigmaPipeline")
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"), (r"transformer_blocks\.(\d+)\.attn2", "cross"))
    parts = ("self", "cross")
    processors = {"AttnProcessor2_0": standard_probs}
    default_processors = {"self": "diffusers.models.attention_processor:AttnProcessor2_0",
                          "cross": "diffusers.models.attention_processor:AttnProcessor2_0"}
