"""Stable Diffusion 3 / 3.5 (MMDiT): every block attends over the joint sequence ``[image | text]``
(``attn``); SD3.5's dual-attention blocks add image-only self-attention (``attn2``), and SD3.5 normalises
queries and keys per head (RMS), the text stream's with ``norm_added_q`` / ``norm_added_k``."""
from __future__ import annotations

import torch

from ..core.errors import InputError
from .base import FamilyPeers, GenFamily, heads_view, normed, positions_named, register, softmax_map


def joint_probs(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **_):
    """``JointAttnProcessor2_0``'s map: ``[B, H, S_img + S_txt, S_img + S_txt]`` over ``[image | text]``,
    or ``[B, H, S_img, S_img]`` when called without text (SD3.5's ``attn2``). The processor ignores
    ``attention_mask`` (SD3 attends to padding), so does this."""
    h, e = hidden_states, encoder_hidden_states
    q = normed(attn.norm_q, heads_view(attn.to_q(h), attn.heads))
    k = normed(attn.norm_k, heads_view(attn.to_k(h), attn.heads))
    if e is not None:
        q = torch.cat([q, normed(attn.norm_added_q, heads_view(attn.add_q_proj(e), attn.heads))], 2)
        k = torch.cat([k, normed(attn.norm_added_k, heads_view(attn.add_k_proj(e), attn.heads))], 2)
    return softmax_map(q, k)


def joint_image_side(attn, h, e, rope=None, keys=None):
    """``JointAttnProcessor2_0``'s image output alone (cross-step reuse's ``reuse_text``): image queries over
    ``[image | text]`` keys."""
    q = normed(attn.norm_q, heads_view(attn.to_q(h), attn.heads))
    k = torch.cat([normed(attn.norm_k, heads_view(attn.to_k(h), attn.heads)),
                   normed(attn.norm_added_k, heads_view(attn.add_k_proj(e), attn.heads))], 2)
    v = torch.cat([heads_view(attn.to_v(h), attn.heads), heads_view(attn.add_v_proj(e), attn.heads)], 2)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    o = o.reshape(h.shape[0], -1, attn.heads * q.shape[-1]).to(q.dtype)
    return attn.to_out[1](attn.to_out[0](o))


@register
class SD3(GenFamily):
    name = "SD3"
    key = "sd3"
    # MMDiT: joint attention transformer_blocks.N.attn; SD3.5's dual-attention blocks add an image-only
    # self-attention transformer_blocks.N.attn2; the last block is context_pre_only
    peers = FamilyPeers(
        attention=r"transformer_blocks\.\d+\.attn2?",
        spatial=(r"^transformer_blocks\.\d+\.attn2?$",), cross=None,
        cfg_kwargs=("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"),
        tail_passes_encoder=True)
    transformer_classes = ("SD3Transformer2DModel",)
    pipeline_classes = ("StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline")
    sampled_pipelines = ("StableDiffusion3Pipeline",)
    objective = "flow"
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn", "joint"), (r"transformer_blocks\.(\d+)\.attn2", "self"))
    parts = ("joint", "self")  # joint sequences are [image | text], the base order
    processors = {"JointAttnProcessor2_0": joint_probs}
    image_sides = {"JointAttnProcessor2_0": joint_image_side}
    default_processors = {"joint": "diffusers.models.attention_processor:JointAttnProcessor2_0",
                          "self": "diffusers.models.attention_processor:JointAttnProcessor2_0"}
    tiny = {
        "sd3": ("SD3Transformer2DModel", dict(
            sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
            pos_embed_max_size=8)),
    }
    tiny["sd3.5"] = ("SD3Transformer2DModel", tiny["sd3"][1] | dict(  # dual attention and per-head RMS qk-norm
        num_layers=3, dual_attention_layers=(0, 1), qk_norm="rms_norm"))

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s),
                    encoder_hidden_states=rn(batch, n_text, c.joint_attention_dim),
                    pooled_projections=rn(batch, c.pooled_projection_dim), timestep=t, return_dict=False)

    tiny_pipelines = {k: ("StableDiffusion3Pipeline", k, {}, "FlowMatchEulerDiscreteScheduler", dict(shift=3.0))
                      for k in ("sd3", "sd3.5")}
    pixel_text_encoder = "clip"

    tiny_vae = ("kl_vae", dict(scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                               use_post_quant_conv=False))

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """Two CLIPs of ``pooled_projection_dim / 2`` and a T5 of ``joint_attention_dim``; the SD3 VAE's scaling."""
        c = transformer.config
        if c.pooled_projection_dim % 2 or c.pooled_projection_dim > c.joint_attention_dim:
            raise InputError("SD3 needs an even pooled_projection_dim (two CLIPs) no wider than joint_attention_dim")
        clip, t5 = build.clip_tokenizer(), build.t5_tokenizer()
        w = c.pooled_projection_dim // 2
        return dict(tokenizer=clip, text_encoder=build.clip_encoder(clip, w, text_layers),
                    tokenizer_2=clip, text_encoder_2=build.clip_encoder(clip, w, text_layers),
                    tokenizer_3=t5, text_encoder_3=build.t5_encoder(t5, c.joint_attention_dim, text_layers),
                    vae=build.vae(self.key, c.in_channels, vae_channels, vae_blocks))

    def pixel_transformer(self, size, patch, text_dim, layers, heads, head_dim):
        return dict(sample_size=size, patch_size=patch, in_channels=3, out_channels=3, num_layers=layers,
                    attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=text_dim,
                    caption_projection_dim=heads * head_dim, pooled_projection_dim=text_dim,
                    pos_embed_max_size=size // patch)

    def text_kwargs(self, hidden, pooled, mask):
        """Per-token states and the pooled vector (SD3 attends to padding: no mask)."""
        return dict(encoder_hidden_states=hidden, pooled_projections=pooled)

    def text_positions(self, pipe, max_sequence_length):
        """CLIP's ``tokenizer_max_length`` (77) positions, then T5's ``max_sequence_length``."""
        return pipe.tokenizer_max_length + int(max_sequence_length)

    def token_names(self, pipe, prompts, max_sequence_length):
        """CLIP's positions, then T5's named ``"t5:<word>"`` (zeros there, named None, in a pipeline without T5)."""
        clip = positions_named(pipe.tokenizer, prompts, pipe.tokenizer_max_length)
        if getattr(pipe, "tokenizer_3", None) is None:  # no T5: the pipeline feeds zeros there
            return [c + [None] * max_sequence_length for c in clip]
        return [c + t for c, t in zip(clip, positions_named(pipe.tokenizer_3, prompts, max_sequence_length, "t5:"))]
