"""Qwen2-VL and Qwen2.5-VL: dynamic resolution (a 14-px patch grid merged 2 x 2 into image tokens)
and M-RoPE (three rotary position streams: time, row, column), so text after an image continues
from the image's largest position, not from its sequence index."""
from __future__ import annotations

from ..core.compat import transformers
from .base import Shape, VLMFamily, chat_template, images_only, register


@register
class Qwen2VL(VLMFamily):
    name = "Qwen2-VL"
    model_types = ("qwen2_vl",)
    model_class = "Qwen2VLForConditionalGeneration"
    config_class, processor_class = "Qwen2VLConfig", "Qwen2VLProcessor"  # the transformers classes config() builds
    image_marker = "<|image_pad|>"
    special_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    needs_video_processor = True
    layout = "user : <|vision_start|>{image}<|vision_end|> {question} assistant :"

    def vision_model(self, model):
        return model.model.visual

    def projector(self, model):
        return model.model.visual.merger

    def expected_image_tokens(self, config, inputs):
        thw = inputs.get("image_grid_thw")
        if thw is None:
            return None
        merge = config.vision_config.spatial_merge_size
        return int(thw.prod(-1).sum()) // merge**2

    def image_grid(self, config, inputs):
        thw = inputs.get("image_grid_thw")
        if thw is None or int(thw[0, 0]) != 1:
            return None
        merge = config.vision_config.spatial_merge_size
        return int(thw[0, 1]) // merge, int(thw[0, 2]) // merge

    def position_ids(self, model, input_ids, inputs):
        pos, _ = model.model.get_rope_index(input_ids, image_grid_thw=inputs.get("image_grid_thw"),
                                            attention_mask=inputs.get("attention_mask"))
        return pos  # [3, B, S]

    def _vision_config(self, shape: Shape) -> dict:
        return dict(depth=shape.vision_layers, embed_dim=shape.vision_hidden, hidden_size=shape.hidden,
                    num_heads=shape.vision_heads, patch_size=shape.patch, spatial_merge_size=2, temporal_patch_size=2,
                    in_channels=3)

    def config(self, tok, shape):
        half = shape.head_dim // 2
        t = half // 4
        text = dict(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                    num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                    max_position_embeddings=32768, tie_word_embeddings=False,
                    rope_scaling={"type": "mrope", "mrope_section": [t, (half - t) // 2, half - t - (half - t) // 2]},
                    **({"sliding_window": shape.sliding_window, "use_sliding_window": True,
                        "max_window_layers": 0} if shape.sliding_window else {}))
        return getattr(transformers, self.config_class)(
            text_config=text, vision_config=self._vision_config(shape),
            image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
            video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
            vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"))

    def processor(self, tok, shape):
        px = shape.image_size ** 2  # every image resized to this many pixels: fixed token count
        ip = transformers.Qwen2VLImageProcessor(min_pixels=px, max_pixels=px, patch_size=shape.patch, merge_size=2)
        return images_only(getattr(transformers, self.processor_class))(
            image_processor=ip, tokenizer=tok, video_processor=None,
            chat_template=chat_template(self.layout, self.image_marker))


@register
class Qwen25VL(Qwen2VL):
    """Qwen2.5-VL: as Qwen2-VL, with window attention in most vision blocks (the vision part's
    attention is computed window by window, so only the language part is captured)."""

    name = "Qwen2.5-VL"
    model_types = ("qwen2_5_vl",)
    model_class = "Qwen2_5_VLForConditionalGeneration"
    config_class, processor_class = "Qwen2_5_VLConfig", "Qwen2_5_VLProcessor"

    def _vision_config(self, shape: Shape) -> dict:
        return dict(depth=shape.vision_layers, hidden_size=shape.vision_hidden,
                    intermediate_size=2 * shape.vision_hidden, out_hidden_size=shape.hidden,
                    num_heads=shape.vision_heads, patch_size=shape.patch, spatial_merge_size=2, temporal_patch_size=2,
                    in_channels=3, window_size=4 * shape.patch, fullatt_block_indexes=[shape.vision_layers - 1])
