"""DiT (class-conditioned): image self-attention only (``attn1``); no text."""
from __future__ import annotations

import torch

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
    tiny = {"dit": ("DiTTransformer2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2, sample_size=8,
        patch_size=2, num_embeds_ada_norm=10, norm_num_groups=1))}

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), timestep=t.long(),
                    class_labels=torch.arange(batch) % c.num_embeds_ada_norm, return_dict=False)
