"""HunyuanDiT: image self-attention (``attn1``) and cross-attention (``attn2``) to the text of two
encoders, CLIP/BERT then T5, concatenated by the transformer. Rotary embeddings act on the image queries
(and on the keys of self-attention). Padding text is not masked: the transformer replaces it with a
learned padding embedding, which the image still attends to; capture marks it not real."""
from __future__ import annotations

import torch

from ..core.compat import diffusers
from .base import FamilyPeers, GenFamily, positions_named, register, sdpa_mask, softmax_map, standard_qk


def hunyuan_probs(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                  image_rotary_emb=None, **_):
    """``HunyuanAttnProcessor2_0``'s map ``[B, H, Sq, Sk]``: ``AttnProcessor2_0`` plus rotary embeddings
    applied with diffusers' own ``apply_rotary_emb``, as the processor does."""
    q, k = standard_qk(attn, hidden_states, encoder_hidden_states, temb)
    if image_rotary_emb is not None:
        q = diffusers.models.embeddings.apply_rotary_emb(q, image_rotary_emb)
        if not attn.is_cross_attention:
            k = diffusers.models.embeddings.apply_rotary_emb(k, image_rotary_emb)
    return softmax_map(q, k, sdpa_mask(attn, attention_mask, k.shape[2], q.shape[0]))


@register
class HunyuanDiT(GenFamily):
    name = "HunyuanDiT"
    key = "hunyuan"
    # blocks.N.attn1 (self, rotary) and blocks.N.attn2 (cross; rotary on the queries); two text encoders
    peers = FamilyPeers(
        attention=r"blocks\.\d+\.attn[12]",
        spatial=(r"^blocks\.\d+\.attn1$",), cross=(r"^blocks\.\d+\.attn2$",),
        cfg_kwargs=("hidden_states", "timestep", "encoder_hidden_states", "text_embedding_mask",
                    "encoder_hidden_states_t5", "text_embedding_mask_t5", "image_meta_size", "style"),
        blocks={"HunyuanDiTBlock": (0, None)})
    transformer_classes = ("HunyuanDiT2DModel",)
    pipeline_classes = ("HunyuanDiTPipeline",)
    site_patterns = ((r"blocks\.(\d+)\.attn1", "self"), (r"blocks\.(\d+)\.attn2", "cross"))
    parts = ("self", "cross")
    processors = {"HunyuanAttnProcessor2_0": hunyuan_probs}
    text_kv_processors = ("HunyuanAttnProcessor2_0",)
    default_processors = {"self": "diffusers.models.attention_processor:HunyuanAttnProcessor2_0",
                          "cross": "diffusers.models.attention_processor:HunyuanAttnProcessor2_0"}

    def forward_context(self, kwargs):
        """Cross-attention keys = CLIP/BERT tokens then T5 tokens; real = the two text masks joined."""
        e, e5 = kwargs.get("encoder_hidden_states"), kwargs.get("encoder_hidden_states_t5")
        if not (torch.is_tensor(e) and torch.is_tensor(e5)):
            return super().forward_context(kwargs)
        m, m5 = kwargs.get("text_embedding_mask"), kwargs.get("text_embedding_mask_t5")
        return {"n_text": int(e.shape[1] + e5.shape[1]),
                "text_real": torch.cat([m, m5], -1) > 0 if torch.is_tensor(m) and torch.is_tensor(m5) else None}

    sampled_pipelines = ("HunyuanDiTPipeline",)
    objective = "v"
    learned_sigma = True
    # the pipeline pads the prompt to 77 BERT and 256 T5 tokens and sizes its rotary grid for an 8x VAE (SDXL's);
    # DDPM with v prediction and scaled-linear betas, as HunyuanDiT was trained
    tiny_pipelines = {"hunyuan": ("HunyuanDiTPipeline", "hunyuan", dict(text_len=77, text_len_t5=256), "DDPMScheduler", dict(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.03, prediction_type="v_prediction", clip_sample=False,
        steps_offset=1))}
    tiny_vae, tiny_vae_blocks = ("kl_vae", dict(scaling_factor=0.13025)), 4

    def tiny_pipeline_parts(self, kind, transformer, build, text_layers, vae_channels, vae_blocks):
        """A BERT of ``cross_attention_dim`` and a T5 of ``cross_attention_dim_t5``; no safety checker."""
        c = transformer.config
        bert, t5 = build.bert_tokenizer(), build.t5_tokenizer()
        return dict(tokenizer=bert, text_encoder=build.bert_encoder(bert, c.cross_attention_dim, text_layers),
                    tokenizer_2=t5, text_encoder_2=build.t5_encoder(t5, c.cross_attention_dim_t5, text_layers),
                    vae=build.vae(self.key, c.in_channels, vae_channels, vae_blocks), safety_checker=None,
                    feature_extractor=None, requires_safety_checker=False)

    def max_sequence_length(self, pipe):
        """T5's prompt length, fixed by the pipeline (it takes no ``max_sequence_length``)."""
        return int(pipe.transformer.config.text_len_t5)

    def text_positions(self, pipe, max_sequence_length):
        """BERT's ``text_len`` (77) positions, then T5's ``text_len_t5`` (256), as the transformer joins them."""
        return int(pipe.transformer.config.text_len + pipe.transformer.config.text_len_t5)

    def token_names(self, pipe, prompts, max_sequence_length):
        """BERT's positions, then T5's named ``"t5:<word>"``."""
        c = pipe.transformer.config
        return [b + t for b, t in zip(positions_named(pipe.tokenizer, prompts, c.text_len),
                                      positions_named(pipe.tokenizer_2, prompts, c.text_len_t5, "t5:"))]

    tiny = {"hunyuan": ("HunyuanDiT2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8, hidden_size=16,
        num_layers=2, cross_attention_dim=16, cross_attention_dim_t5=16, pooled_projection_dim=16, text_len=4,
        text_len_t5=6))}

    def tiny_inputs(self, tag, transformer, batch, n_text, n_pad, rn, t, mask):
        """Its own text lengths (``text_len`` CLIP tokens, the last one padding; ``text_len_t5`` T5 tokens, the last
        ``n_pad`` padding) and the 2-D rotary embedding of the patch grid."""
        c, s = transformer.config, transformer.config.sample_size
        grid = s // c.patch_size
        rope = diffusers.models.embeddings.get_2d_rotary_pos_embed(c.attention_head_dim, ((0, 0), (grid, grid)), (grid, grid), use_real=True)
        m5 = torch.cat([torch.ones(batch, c.text_len_t5 - n_pad), torch.zeros(batch, n_pad)], 1).long()
        m1 = torch.cat([torch.ones(batch, c.text_len - 1), torch.zeros(batch, 1)], 1).long()
        return dict(hidden_states=rn(batch, c.in_channels, s, s), timestep=t,
                    encoder_hidden_states=rn(batch, c.text_len, c.cross_attention_dim), text_embedding_mask=m1,
                    encoder_hidden_states_t5=rn(batch, c.text_len_t5, c.cross_attention_dim_t5), text_embedding_mask_t5=m5,
                    image_meta_size=torch.tensor([[s * 8, s * 8, s * 8, s * 8, 0, 0]] * batch).to(t.dtype),
                    style=torch.zeros(batch, dtype=torch.long), image_rotary_emb=rope, return_dict=False)
