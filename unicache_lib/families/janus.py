"""Janus (DeepSeek): one Llama language model that *understands* images through a SigLIP-style encoder
and an aligner (image tokens spliced into the prompt, as LLaVA does) and *generates* images as discrete
VQ tokens (``generation_embeddings`` + ``generation_aligner`` in, ``generation_head`` out, decoded by the
VQ-VAE). Understanding mode is captured like LLaVA: part ``language``, the ``<image_placeholder>``
positions are the image span. Generation mode (the generated VQ tokens as their own span) is captured by
:func:`unicache_lib.capture.unified.capture_image_generation`.
"""
from __future__ import annotations

from ..core.compat import transformers
from .base import PatchGridImages, Shape, VLMFamily, chat_template, decoder_dims, register


@register
class Janus(PatchGridImages, VLMFamily):
    """Janus-1.3B / Janus-Pro: 576 image tokens (384 px, patch 16) for understanding, 576 VQ tokens
    (16x downsampling) for generation, Llama language model, plain causal mask."""

    name = "Janus"
    model_types = ("janus",)
    model_class = "JanusForConditionalGeneration"
    image_marker = "<image_placeholder>"
    special_tokens = ("<image_placeholder>", "<begin_of_image>", "<end_of_image>")
    named_tokens = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}

    def projector(self, model):
        return model.model.aligner

    def image_tokens_per_picture(self, config):
        return int(config.vision_config.num_image_tokens)

    def adapt_processor(self, processor, config):
        """``JanusProcessor`` always expands ``<image_placeholder>`` to 576 tokens (its ``__init__`` sets it);
        a checkpoint of another size needs its own count, from the vision config."""
        processor.num_image_tokens = int(config.vision_config.num_image_tokens)
        return processor

    def config(self, tok, shape: Shape):
        side = shape.image_size // shape.patch
        text = decoder_dims(tok, shape, max_position_embeddings=4096, tie_word_embeddings=False)
        vision = dict(hidden_size=shape.vision_hidden, num_hidden_layers=shape.vision_layers,
                      num_attention_heads=shape.vision_heads, image_size=shape.image_size, patch_size=shape.patch,
                      projection_dim=shape.hidden, num_image_tokens=side * side, depth=2)
        levels = shape.extra.get("vq_levels", 4)  # 2 ** (levels - 1) downsampling: 8x at 4 levels
        vq = dict(embed_dim=shape.extra.get("vq_dim", 8), num_embeddings=shape.extra.get("vq_codes", 128),
                  latent_channels=shape.extra.get("vq_latent", 64), base_channels=shape.extra.get("vq_base", 32),
                  channel_multiplier=[1, 1, 2, 2, 4][:levels], num_res_blocks=1, projection_dim=shape.hidden,
                  image_token_embed_dim=shape.hidden, num_hidden_layers=2)
        return transformers.JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                                        image_token_id=tok.convert_tokens_to_ids(self.image_marker))

    def processor(self, tok, shape: Shape):
        s = shape.image_size
        ip = transformers.JanusImageProcessor(size={"height": s, "width": s}, min_size=s, image_mean=[0.5] * 3,
                                              image_std=[0.5] * 3)
        proc = transformers.JanusProcessor(image_processor=ip, tokenizer=tok,
                                           chat_template=chat_template(self.layout, self.image_marker))
        proc.num_image_tokens = (s // shape.patch) ** 2
        return proc
