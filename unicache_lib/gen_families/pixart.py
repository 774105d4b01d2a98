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
    sampled_pipelines = ("PixArtAlphaPipeline", "PixArtSigmaPipeline")
    objective = "epsilon"
    learned_sigma = True
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"), (r"transformer_blocks\.(\d+)\.attn2", "cross"))
    parts = ("self", "cross")
    processors = {"AttnProcessor2_0": standard_probs}
    text_kv_processors = ("AttnProcessor2_0",)
    default_processors = {"self": "diffusers.models.attention_processor:AttnProcessor2_0",
                          "cross": "diffusers.models.attention_processor:AttnProcessor2_0"}
    tiny = {"pixart": ("PixArtTransformer2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2, cross_attention_dim=16,
        caption_channels=16, sample_size=8, patch_size=2, norm_num_groups=1, use_additional_conditions=False))}

    # PixArt predicts noise and variance: out_channels = 2 x latent channels, as the real checkpoints; linear betas
    # 1e-4..0.02, DPM-Solver++ order 2, epsilon prediction
    tiny_pipelines = {f"pixart-{v}": (f"PixArt{v.title()}Pipeline", "pixart", {"out_channels": 8},
                                      "DPMSolverMultistepScheduler", {}) for v in ("alpha", "sigma")}
    pixel_text_encoder = "t5"

    tiny_vae = ("kl_vae", dict(scaling_factor=0.18215))

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """A T5 of ``caption_channels``; the SD VAE's scaling."""
        t5 = build.t5_tokenizer()
        return dict(tokenizer=t5, text_encoder=build.t5_encoder(t5, transformer.config.caption_channels, text_layers),
                    vae=build.vae(self.key, transformer.config.in_channels, vae_channels, vae_blocks))

    def pixel_transformer(self, size, patch, text_dim, layers, heads, head_dim):
        return dict(sample_size=size, patch_size=patch, in_channels=3, out_channels=3, num_layers=layers,
                    attention_head_dim=head_dim, num_attention_heads=heads, cross_attention_dim=heads * head_dim,
                    caption_channels=text_dim, norm_type="ada_norm_single", use_additional_conditions=False,
                    norm_num_groups=1)

    def text_kwargs(self, hidden, pooled, mask):
        return dict(encoder_hidden_states=hidden, encoder_attention_mask=mask,
                    added_cond_kwargs={"resolution": None, "aspect_ratio": None})

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), encoder_hidden_states=rn(batch, n_text + n_pad, c.caption_channels),
                    encoder_attention_mask=mask, timestep=t, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                    return_dict=False)
