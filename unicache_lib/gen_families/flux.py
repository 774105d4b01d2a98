"""Flux.1: double-stream blocks (``transformer_blocks.N.attn``: separate image and text projections,
one attention over ``[text | image]``) then single-stream blocks (``single_transformer_blocks.N.attn``:
the processor gets the already joined ``[text | image]`` sequence and no text argument). Both are part
``joint``; single blocks are numbered after the double ones (layer = n_double + N) and records carry
``meta["block"]`` = ``"double"`` / ``"single"``. Rotary embeddings act on queries and keys of both."""
from __future__ import annotations

import torch

from ..core.compat import diffusers, flux_qkv_projections
from .base import FamilyPeers, GenFamily, GenSite, positions_named, register, softmax_map


def flux_probs(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None, **_):
    """``FluxAttnProcessor``'s map ``[B, H, S, S]`` over ``[text | image]``: diffusers' own projection
    helper (fused or not) and ``apply_rotary_emb``, in the processor's ``[B, S, H, D]`` layout."""
    q, k, _, eq, ek, _ = flux_qkv_projections(attn, hidden_states, encoder_hidden_states)
    q = attn.norm_q(q.unflatten(-1, (-1, attn.head_dim)))
    k = attn.norm_k(k.unflatten(-1, (-1, attn.head_dim)))
    if attn.added_kv_proj_dim is not None:
        eq = attn.norm_added_q(eq.unflatten(-1, (-1, attn.head_dim)))
        ek = attn.norm_added_k(ek.unflatten(-1, (-1, attn.head_dim)))
        q, k = torch.cat([eq, q], 1), torch.cat([ek, k], 1)
    if image_rotary_emb is not None:
        q = diffusers.models.embeddings.apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
        k = diffusers.models.embeddings.apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
    mask = attention_mask  # [B, Sk] is reshaped as diffusers' native backend does
    return softmax_map(q.transpose(1, 2), k.transpose(1, 2),
                       mask[:, None, None] if mask is not None and mask.dim() == 2 else mask)


def flux_image_side(attn, h, e, rope, keys=None):
    """``FluxAttnProcessor``'s image rows alone. Double stream: ``h`` image tokens, ``e`` text tokens, keys
    ``[text | image]``; single stream: ``h`` the image part of the sequence ``keys`` (``[text | image]``)
    and no output projection (``pre_only``). Rotary embeddings as the processor applies them. None with fused
    projections (computed in full)."""
    if getattr(attn, "fused_projections", False):
        return None
    heads = lambda x: x.unflatten(-1, (-1, attn.head_dim))  # noqa: E731  [B, S, H, D]
    q = attn.norm_q(heads(attn.to_q(h)))
    if keys is None:
        k = torch.cat([attn.norm_added_k(heads(attn.add_k_proj(e))), attn.norm_k(heads(attn.to_k(h)))], 1)
        v = torch.cat([heads(attn.add_v_proj(e)), heads(attn.to_v(h))], 1)
    else:
        k, v = attn.norm_k(heads(attn.to_k(keys))), heads(attn.to_v(keys))
    if rope is not None:
        n = k.shape[1] - q.shape[1]  # text positions come first in the table
        q = diffusers.models.embeddings.apply_rotary_emb(q, tuple(r[n:] for r in rope), sequence_dim=1)
        k = diffusers.models.embeddings.apply_rotary_emb(k, rope, sequence_dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    o = o.flatten(2, 3).to(q.dtype)
    return o if keys is not None else attn.to_out[1](attn.to_out[0](o))


@register
class Flux(GenFamily):
    name = "Flux"
    key = "flux"
    # double-stream transformer_blocks.N.attn (joint, rotary) and single-stream single_transformer_blocks.N.attn
    # (one [text | image] sequence); FLUX.1 is guidance-distilled (guidance is an input, no CFG batch)
    peers = FamilyPeers(
        attention=r"(single_)?transformer_blocks\.\d+\.attn",
        spatial=(r"^(single_)?transformer_blocks\.\d+\.attn$",), cross=None,
        cfg_kwargs=("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"),
        guidance_distilled=True,
        notes={"fastercache": "no unconditional-branch skipping (guidance-distilled, as diffusers configures Flux); "
                              "its frequency split also assumes BCHW/BCFHW outputs, not Flux's packed [B, S, C] tokens",
               "magcache": "diffusers ships FLUX_MAG_RATIOS for FLUX.1-dev at 28 steps; calibrate for other checkpoints"})
    transformer_classes = ("FluxTransformer2DModel",)
    pipeline_classes = ("FluxPipeline", "FluxImg2ImgPipeline")
    sampled_pipelines = ("FluxPipeline",)
    objective = "flow"
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn", "joint"), (r"single_transformer_blocks\.(\d+)\.attn", "joint"))
    parts = ("joint",)
    joint_order = ("text", "image")
    processors = {"FluxAttnProcessor": flux_probs}
    image_sides = {"FluxAttnProcessor": flux_image_side}
    default_processors = {"joint": "diffusers.models.transformers.transformer_flux:FluxAttnProcessor"}

    def sites(self, transformer):
        sites = super().sites(transformer)
        n_double = sum(s.name.startswith("transformer_blocks.") for s in sites)
        return sorted((GenSite(s.name, s.layer + n_double * s.name.startswith("single_"), s.part, s.module, s.captured,
                               {"block": "single" if s.name.startswith("single_") else "double"}) for s in sites),
                      key=lambda s: s.layer)

    def reuse_kind(self, site):
        return "single" if site.meta.get("block") == "single" else site.part

    tiny = {"flux": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4)))}

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        """A 4 x 4 grid of packed latent tokens with their (0, row, column) ids; the timestep in [0, 1], as Flux's
        pipeline hands it."""
        c, h, w = transformer.config, 4, 4
        img_ids = torch.cat([torch.zeros(h * w, 1), torch.cartesian_prod(torch.arange(h), torch.arange(w)).float()], 1)
        return dict(hidden_states=rn(batch, h * w, c.in_channels), encoder_hidden_states=rn(batch, n_text, c.joint_attention_dim),
                    pooled_projections=rn(batch, c.pooled_projection_dim), timestep=t / 1000, img_ids=img_ids,
                    txt_ids=torch.zeros(n_text, 3), guidance=None, return_dict=False)

    tiny_pipelines = {
        "flux-schnell": ("FluxPipeline", "flux", {}, "FlowMatchEulerDiscreteScheduler", dict(shift=1.0)),
        "flux-dev": ("FluxPipeline", "flux", {"guidance_embeds": True}, "FlowMatchEulerDiscreteScheduler", dict(  # resolution-dependent shift
            shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096))}

    tiny_vae = ("kl_vae", dict(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False))

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """A CLIP of ``pooled_projection_dim`` and a T5 of ``joint_attention_dim``; a VAE of a quarter of the transformer's
        channels (2 x 2 latent patches packed) with Flux's scaling."""
        c = transformer.config
        clip, t5 = build.clip_tokenizer(), build.t5_tokenizer()
        return dict(tokenizer=clip, text_encoder=build.clip_encoder(clip, c.pooled_projection_dim, text_layers, projection=False),
                    tokenizer_2=t5, text_encoder_2=build.t5_encoder(t5, c.joint_attention_dim, text_layers),
                    vae=build.vae(self.key, c.in_channels // 4, vae_channels, vae_blocks))

    def max_sequence_length(self, pipe):
        """FLUX.1-schnell (no guidance embedding): 256, what its T5 was trained with, not the pipeline's 512."""
        return super().max_sequence_length(pipe) if pipe.transformer.config.guidance_embeds else 256

    def latent_patch(self, transformer):
        """The pipeline packs 2 x 2 latent patches into one token (the transformer's own patch size is 1)."""
        return 2

    def token_names(self, pipe, prompts, max_sequence_length):
        """The T5 positions (``tokenizer_2``; CLIP feeds only the pooled projection)."""
        return positions_named(pipe.tokenizer_2, prompts, max_sequence_length)

    def flow_timestep(self, t, transformer):
        """The pipeline divides by 1000 (the transformer multiplies back)."""
        return t / 1000
