"""Tiny random-weight diffusers transformers, one per supported generator family, and valid inputs
for one forward call: what the generator family test suite and the reuse / peer tests run on.

    tr = tiny_transformer("flux")
    out = tr(**forward_inputs("flux", tr, batch=2, n_text=5))

Shapes are small (a 4x4 or 8x8 latent, 2 heads of 8) but keep every structural feature of the real
model: SD3.5's dual attention and qk-norm, Flux's double- and single-stream blocks and rotary
embeddings, Sana's linear self-attention next to softmax cross-attention, HunyuanDiT's two text
encoders and rotary embeddings, PixArt's masked cross-attention, DiT's class conditioning.
"""
from __future__ import annotations

import torch

from ..core.errors import UnknownNameError

# family -> (diffusers class, constructor kwargs)
TINY = {
    "sd3": ("SD3Transformer2DModel", dict(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
        pos_embed_max_size=8)),
    "sd3.5": ("SD3Transformer2DModel", dict(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
        pos_embed_max_size=8, dual_attention_layers=(0, 1), qk_norm="rms_norm")),
    "pixart": ("PixArtTransformer2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2,
        cross_attention_dim=16, caption_channels=16, sample_size=8, patch_size=2, norm_num_groups=1,
        use_additional_conditions=False)),
    "flux": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4))),
    "sana": ("SanaTransformer2DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=16,
        sample_size=8, patch_size=1)),
    "hunyuan": ("HunyuanDiT2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8, hidden_size=16,
        num_layers=2, cross_attention_dim=16, cross_attention_dim_t5=16, pooled_projection_dim=16, text_len=4,
        text_len_t5=6)),
    "dit": ("DiTTransformer2DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2, sample_size=8,
        patch_size=2, num_embeds_ada_norm=10, norm_num_groups=1)),
}


def tiny_transformer(family: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random-weight transformer of ``family`` (a key of :data:`TINY`), in eval mode."""
    import diffusers

    if family not in TINY:
        raise UnknownNameError(f"no tiny config for {family!r}; families: {', '.join(TINY)}")
    cls, kw = TINY[family]
    torch.manual_seed(seed)
    return getattr(diffusers, cls)(**kw).to(dtype).eval()


def forward_inputs(family: str, transformer, batch: int = 2, n_text: int = 5, seed: int = 0,
                   n_pad: int = 2) -> dict:
    """Keyword arguments for one forward call of ``transformer`` (built by :func:`tiny_transformer`).

    ``n_text`` real text tokens; families with a text mask (PixArt, Sana, HunyuanDiT) get ``n_pad``
    padding tokens after them, masked out, so masks are exercised. ``batch`` rows (pass an even batch to
    stand for ``[uncond | cond]``)."""
    g = torch.Generator().manual_seed(seed)
    c = transformer.config
    dt = next(transformer.parameters()).dtype
    rn = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    t = torch.full((batch,), 500.0).to(dt)
    mask = torch.cat([torch.ones(batch, n_text), torch.zeros(batch, n_pad)], 1).long()
    if family in ("sd3", "sd3.5"):
        s = c.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), encoder_hidden_states=rn(batch, n_text, c.joint_attention_dim),
                    pooled_projections=rn(batch, c.pooled_projection_dim), timestep=t, return_dict=False)
    if family == "pixart":
        s = c.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), encoder_hidden_states=rn(batch, n_text + n_pad, c.caption_channels),
                    encoder_attention_mask=mask, timestep=t, added_cond_kwargs={"resolution": None, "aspect_ratio": None},
                    return_dict=False)
    if family == "flux":
        h = w = 4
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1] = torch.arange(h)[:, None]
        img_ids[..., 2] = torch.arange(w)[None, :]
        return dict(hidden_states=rn(batch, h * w, c.in_channels), encoder_hidden_states=rn(batch, n_text, c.joint_attention_dim),
                    pooled_projections=rn(batch, c.pooled_projection_dim), timestep=t / 1000, img_ids=img_ids.reshape(-1, 3),
                    txt_ids=torch.zeros(n_text, 3), guidance=None, return_dict=False)
    if family == "sana":
        s = c.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), encoder_hidden_states=rn(batch, n_text + n_pad, c.caption_channels),
                    encoder_attention_mask=mask, timestep=t, return_dict=False)
    if family == "hunyuan":
        from diffusers.models.embeddings import get_2d_rotary_pos_embed

        s = c.sample_size
        grid = s // c.patch_size
        rope = get_2d_rotary_pos_embed(c.attention_head_dim, ((0, 0), (grid, grid)), (grid, grid), use_real=True)
        m5 = torch.cat([torch.ones(batch, c.text_len_t5 - n_pad), torch.zeros(batch, n_pad)], 1).long()
        m1 = torch.cat([torch.ones(batch, c.text_len - 1), torch.zeros(batch, 1)], 1).long()
        return dict(hidden_states=rn(batch, c.in_channels, s, s), timestep=t,
                    encoder_hidden_states=rn(batch, c.text_len, c.cross_attention_dim), text_embedding_mask=m1,
                    encoder_hidden_states_t5=rn(batch, c.text_len_t5, c.cross_attention_dim_t5), text_embedding_mask_t5=m5,
                    image_meta_size=torch.tensor([[s * 8, s * 8, s * 8, s * 8, 0, 0]] * batch).to(dt),
                    style=torch.zeros(batch, dtype=torch.long), image_rotary_emb=rope, return_dict=False)
    if family == "dit":
        s = c.sample_size
        return dict(hidden_states=rn(batch, c.in_channels, s, s), timestep=t.long(),
                    class_labels=torch.arange(batch) % c.num_embeds_ada_norm, return_dict=False)
    raise UnknownNameError(f"no tiny config for {family!r}; families: {', '.join(TINY)}")
