"""DiT (class-conditioned): image self-attention only (``attn1``); no text."""
from __future__ import annotations

from .base import FamilyPeers, GenFamily, register, standard_probs


@register
class DiT(GenFamily):
    name = "DiT"
    key = "dit"
    # class-conditioned DiT: self-attention attn1 only
    peers = FamilyPeers(
        attention=r"transformer_blocks\.\d+\.attn1",
        spatial=(r"^transformer_blocks\.\d+\.attn1$",), cross=None,
        cfg_kwargs=("hidden_states", "timestep", "class_labels"),
        notes={"fastercache": "assumes the batch is [uncond | cond] (the library's loop); diffusers' DiTPipeline "
                              "batches [cond | uncond], where it would approximate the conditional half"})
    transformer_classes = ("DiTTransformer2DModel",)
    pipeline_classes = ("DiTPipeline",)
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"),)
    parts = ("self",)
    processors = {"AttnProcessor2_0": standard_probs}
    default_processors = {"self": "diffusers.models.attention_processor:AttnProcessor2_0"}
