"""LLaVA-1.5, LLaVA-NeXT and LLaVA-OneVision: a vision tower, a projector, image tokens spliced into
a causal language model (Llama, Mistral, Vicuna, Qwen2)."""
from __future__ import annotations

import torch.nn.functional as F

from ..core.compat import transformers
from .base import PatchGridImages, Shape, VLMFamily, chat_template, decoder_dims, images_only, register, vit_dims


def _clip(shape: Shape):
    return transformers.CLIPVisionConfig(**vit_dims(shape, projection_dim=shape.vision_hidden))


def _text(cls, tok, shape: Shape, **kw):
    return cls(**decoder_dims(tok, shape, intermediate_size=shape.extra.get("intermediate", 4 * shape.hidden),
                              max_position_embeddings=4096, tie_word_embeddings=False, **kw))


def _llama_text(tok, shape: Shape):
    """Llama, or Mistral where ``shape`` has a sliding window."""
    return (_text(transformers.MistralConfig, tok, shape, sliding_window=shape.sliding_window) if shape.sliding_window
            else _text(transformers.LlamaConfig, tok, shape))


def _clip_processor(shape: Shape):
    s = shape.image_size
    return transformers.CLIPImageProcessor(size={"shortest_edge": s}, crop_size={"height": s, "width": s},
                                           image_mean=[0.5] * 3, image_std=[0.5] * 3)


@register
class Llava(PatchGridImages, VLMFamily):
    """LLaVA-1.5 (``llava-hf/llava-1.5-7b-hf``): 576 image tokens (24 x 24 patches of a 336-px CLIP
    ViT-L/14 with the class token dropped), Llama/Vicuna language model, plain causal mask."""

    name = "LLaVA-1.5"
    model_types = ("llava",)
    model_class = "LlavaForConditionalGeneration"

    def image_tokens_per_picture(self, config):
        n = getattr(config, "image_seq_length", None)
        return int(n) if n else None

    def image_features_at(self, model, pixel_values, rows, cols):
        """The CLIP tower at ``rows x cols`` patches: the picture resized (bilinear, antialiased) to
        ``rows * patch x cols * patch`` pixels, the position embeddings interpolated to that grid
        (``interpolate_pos_encoding``), the class token dropped and the projector applied as the checkpoint says."""
        cfg = model.config
        if cfg.vision_feature_select_strategy != "default" or not isinstance(cfg.vision_feature_layer, int):
            return super().image_features_at(model, pixel_values, rows, cols)
        p = cfg.vision_config.patch_size
        small = F.interpolate(pixel_values.float(), size=(rows * p, cols * p), mode="bilinear", antialias=True,
                              align_corners=False).to(pixel_values.dtype)
        out = model.model.get_image_features(pixel_values=small, vision_feature_layer=cfg.vision_feature_layer,
                                             vision_feature_select_strategy="default", interpolate_pos_encoding=True)
        return (out.pooler_output[0] if hasattr(out, "pooler_output") else out[0]).reshape(rows * cols, -1).float()

    def config(self, tok, shape):
        return transformers.LlavaConfig(vision_config=_clip(shape), text_config=_llama_text(tok, shape),
                                        image_token_id=tok.convert_tokens_to_ids("<image>"),
                                        vision_feature_layer=shape.extra.get("vision_feature_layer", -1),
                                        vision_feature_select_strategy="default",
                                        image_seq_length=(shape.image_size // shape.patch) ** 2)

    def processor(self, tok, shape):
        return transformers.LlavaProcessor(image_processor=_clip_processor(shape), tokenizer=tok, patch_size=shape.patch,
                                           vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                           chat_template=chat_template(self.layout, "<image>"))


class _Tiled:
    """Tiles and newline tokens (LLaVA-NeXT, LLaVA-OneVision): no single patch grid to resize, and the image-token
    count follows the picture's size (``config.image_seq_length`` is not it)."""

    # the base's answers, not LLaVA's: no resized tower (refused), no fixed count (None), no one grid (None)
    image_features_at = VLMFamily.image_features_at
    image_tokens_per_picture = VLMFamily.image_tokens_per_picture
    image_grid = VLMFamily.image_grid


@register
class LlavaNext(_Tiled, Llava):
    """LLaVA-NeXT ("anyres"): a base image plus tiles of the best-fitting grid, with a learned newline
    token after each row of tiles, so the image tokens are not one regular grid. Mistral-based
    checkpoints use a sliding-window mask."""

    name = "LLaVA-NeXT"
    model_types = ("llava_next",)
    model_class = "LlavaNextForConditionalGeneration"

    def config(self, tok, shape):
        s = shape.image_size
        return transformers.LlavaNextConfig(vision_config=_clip(shape), text_config=_llama_text(tok, shape),
                                            image_grid_pinpoints=[[s, s], [s, 2 * s], [2 * s, s]],
                                            image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1)

    def processor(self, tok, shape):
        s = shape.image_size
        ip = transformers.LlavaNextImageProcessor(size={"shortest_edge": s}, crop_size={"height": s, "width": s},
                                                  image_grid_pinpoints=[[s, s], [s, 2 * s], [2 * s, s]])
        return transformers.LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=shape.patch,
                                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                               chat_template=chat_template(self.layout, "<image>"))


@register
class LlavaOnevision(_Tiled, Llava):
    """LLaVA-OneVision / -interleave: SigLIP tower, anyres tiles pooled and unpadded with newline
    tokens, Qwen2 language model. Its processor class requires a video processor (torchvision)."""

    name = "LLaVA-OneVision"
    model_types = ("llava_onevision",)
    model_class = "LlavaOnevisionForConditionalGeneration"
    needs_video_processor = True

    special_tokens = ("<image>", "<video>")

    def config(self, tok, shape):
        s = shape.image_size
        return transformers.LlavaOnevisionConfig(
            vision_config=transformers.SiglipVisionConfig(**vit_dims(shape)),
            text_config=_text(transformers.Qwen2Config, tok, shape), image_token_id=tok.convert_tokens_to_ids("<image>"),
            video_token_id=tok.convert_tokens_to_ids("<video>"), image_grid_pinpoints=[[s, s]], vision_feature_layer=-1,
            vision_feature_select_strategy="full")

    def processor(self, tok, shape):
        s = shape.image_size
        ip = transformers.LlavaOnevisionImageProcessor(size={"height": s, "width": s}, image_grid_pinpoints=[[s, s]],
                                                       image_mean=[0.5] * 3, image_std=[0.5] * 3)
        side = s // shape.patch
        return images_only(transformers.LlavaOnevisionProcessor)(
            image_processor=ip, tokenizer=tok, video_processor=None, num_image_tokens=side * side,
            vision_feature_select_strategy="full", chat_template=chat_template(self.layout, "<image>"))

