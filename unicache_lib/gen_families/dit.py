"""DiT (class-conditioned): image self-attention only (``attn1``); no text."""
from __future__ import annotations

import re

import torch

from ..core.errors import InputError
from ..world.scenes import SHAPES
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

    sampled_pipelines = ("DiTPipeline",)
    objective, learned_sigma, cond_first = "epsilon", True, True
    # the pipeline's null class is 1000 (ImageNet's classes then the null one); DDIM with linear betas, as DiT's checkpoints
    tiny_pipelines = {"dit": ("DiTPipeline", "dit", dict(num_embeds_ada_norm=1000, out_channels=8), "DDIMScheduler",
                              dict(clip_sample=False))}
    tiny_vae = ("kl_vae", dict(scaling_factor=0.18215))

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """The SD VAE and one class per world shape (``id2label``: ``"circle, circles"``...)."""
        return dict(vae=build.vae(self.key, transformer.config.in_channels, vae_channels, vae_blocks),
                    id2label={i: f"{s}, {s}s" for i, s in enumerate(SHAPES)})

    def call_kwargs(self, pipe, prompts):
        """Class-conditioned: for each prompt the class whose label (``pipe.labels``, the checkpoint's ``id2label``) it
        names, the longest such label; InputError naming the labels where it names none."""
        ids = []
        for p in prompts:
            named = [label for label in pipe.labels if re.search(rf"\b{re.escape(label)}\b", p)]
            if not named:
                raise InputError(f"DiT is class-conditioned: the prompt {p!r} names none of its class labels "
                                 f"({', '.join(pipe.labels) or 'the pipeline has none'})")
            ids.append(pipe.labels[max(named, key=len)])
        return dict(class_labels=ids)

    def max_sequence_length(self, pipe):
        return 0  # no text

    def text_positions(self, pipe, max_sequence_length):
        return 0

    def token_names(self, pipe, prompts, max_sequence_length):
        return [[] for _ in prompts]

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), timestep=t.long(),
                    class_labels=torch.arange(batch) % c.num_embeds_ada_norm, return_dict=False)
