"""InternVL (2.5 / 3, transformers-native): InternViT tower, pixel shuffle (``downsample_ratio``),
``<img> <IMG_CONTEXT>... </img>`` per tile, Qwen2 / Llama decoder. Its processor class requires a
video processor (torchvision)."""
from __future__ import annotations

from ..core.compat import transformers
from .base import VLMFamily, chat_template, decoder_dims, images_only, register, vit_dims


@register
class InternVL(VLMFamily):
    name = "InternVL"
    model_types = ("internvl",)
    model_class = "InternVLForConditionalGeneration"
    image_marker = "<IMG_CONTEXT>"
    special_tokens = ("<video>",)
    named_tokens = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                    "video_token": "<video>"}
    needs_video_processor = True

    def expected_image_tokens(self, config, inputs):
        pv = inputs.get("pixel_values")
        return None if pv is None else int(pv.shape[0]) * int(config.image_seq_length)

    def image_grid(self, config, inputs):
        pv = inputs.get("pixel_values")
        if pv is None or pv.shape[0] != 1:
            return None  # several tiles
        v = config.vision_config
        side = int(v.image_size[0] // v.patch_size[0] * config.downsample_ratio)
        return (side, side)

    def config(self, tok, shape):
        text = transformers.Qwen2Config(**decoder_dims(tok, shape, tie_word_embeddings=False))
        vc = vit_dims(shape, image_size=[shape.image_size] * 2, patch_size=[shape.patch] * 2)
        return transformers.InternVLConfig(vision_config=vc, text_config=text,
                                           image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
                                           image_seq_length=(shape.image_size // shape.patch) ** 2 // 4,
                                           downsample_ratio=0.5, vision_feature_layer=-1)

    def processor(self, tok, shape):
        s = shape.image_size
        ip = transformers.GotOcr2ImageProcessor(size={"height": s, "width": s}, crop_to_patches=False)
        return images_only(transformers.InternVLProcessor)(image_processor=ip, tokenizer=tok, video_processor=None,
                                                           image_seq_length=(s // shape.patch) ** 2 // 4,
                                                           chat_template=chat_template(self.layout, self.image_marker))
