"""Sana: *linear* self-attention over the image (``attn1``, ReLU kernel: no softmax map, so nothing to
capture) and softmax cross-attention from the image to the text (``attn2``, padding keys masked)."""
from __future__ import annotations

from .base import FamilyPeers, GenFamily, heads_view, normed, register, sdpa_mask, softmax_map


def sana_cross_probs(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, **_):
    """``SanaAttnProcessor2_0``'s map ``[B, H, S_img, S_txt]``: q/k norms act on the projections before
    the split into heads (unlike ``AttnProcessor2_0``)."""
    e = hidden_states if encoder_hidden_states is None else encoder_hidden_states
    q = heads_view(normed(attn.norm_q, attn.to_q(hidden_states)), attn.heads)
    k = heads_view(normed(attn.norm_k, attn.to_k(e)), attn.heads)
    return softmax_map(q, k, sdpa_mask(attn, attention_mask, k.shape[2], q.shape[0]))


@register
class Sana(GenFamily):
    name = "Sana"
    key = "sana"
    # linear self-attention attn1, softmax cross-attention attn2 (text mask)
    peers = FamilyPeers(
        attention=r"transformer_blocks\.\d+\.attn[12]",
        spatial=(r"^transformer_blocks\.\d+\.attn1$",), cross=(r"^transformer_blocks\.\d+\.attn2$",),
        cfg_kwargs=("hidden_states", "encoder_hidden_states", "encoder_attention_mask", "timestep"),
        blocks={"SanaTransformerBlock": (0, None)})
    transformer_classes = ("SanaTransformer2DModel",)
    pipeline_classes = ("SanaPipeline", "SanaSprintPipeline")
    sampled_pipelines = ("SanaPipeline",)
    objective = "flow"
    learned_sigma = True
    site_patterns = ((r"transformer_blocks\.(\d+)\.attn1", "self"), (r"transformer_blocks\.(\d+)\.attn2", "cross"))
    parts = ("cross",)
    uncaptured = {"self": "Sana's self-attention is linear attention (SanaLinearAttnProcessor2_0: ReLU(q) (ReLU(k)^T v), "
                          "normalised per query): it forms no softmax map, so there is no map to capture"}
    processors = {"SanaAttnProcessor2_0": sana_cross_probs}
    text_kv_processors = ("SanaAttnProcessor2_0",)
    default_processors = {"self": "diffusers.models.attention_processor:SanaLinearAttnProcessor2_0",
                          "cross": "diffusers.models.transformers.sana_transformer:SanaAttnProcessor2_0"}
    tiny = {"sana": ("SanaTransformer2DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=16,
        sample_size=8, patch_size=1))}

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        c, s = transformer.config, transformer.config.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s),
                    encoder_hidden_states=rn(batch, n_text + n_pad, c.caption_channels), encoder_attention_mask=mask,
                    timestep=t, return_dict=False)

    tiny_pipelines = {"sana": ("SanaPipeline", "sana", {}, "DPMSolverMultistepScheduler", dict(
        flow_shift=3.0, prediction_type="flow_prediction", use_flow_sigmas=True, solver_type="midpoint",
        final_sigmas_type="zero"))}
    tiny_vae_blocks = 3  # the pipeline wants sizes divisible by 32
    tiny_vae = ("dc_vae", {})

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """A Gemma 2 of ``caption_channels``; a DC-AE."""
        gemma = build.gemma_tokenizer()
        return dict(tokenizer=gemma,
                    text_encoder=build.gemma2_encoder(gemma, transformer.config.caption_channels, text_layers),
                    vae=build.vae(self.key, transformer.config.in_channels, vae_channels, vae_blocks))

    def token_names(self, pipe, prompts, max_sequence_length):
        """None: the pipeline prepends an instruction to every prompt and keeps its last tokens, so positions are not
        named rather than named wrongly (capture still separates padding by the pipeline's own mask)."""
        return None

    def flow_timestep(self, t, transformer):
        """DPM-Solver's integer timestep times the transformer's ``timestep_scale``."""
        return t * float(transformer.config.timestep_scale)
