"""Idefics3 and SmolVLM: SigLIP-style tower, pixel shuffle (``scale_factor``) in the connector, image
tokens wrapped in ``<fake_token_around_image>`` markers, Llama-style causal decoder at
``model.model.text_model``. Large images are split into tiles, each its own block of tokens."""
from __future__ import annotations

from ..core.compat import transformers
from .base import VLMFamily, chat_template, decoder_dims, register, vit_dims


@register
class Idefics3(VLMFamily):
    name = "Idefics3/SmolVLM"
    model_types = ("idefics3", "smolvlm")
    model_class = "Idefics3ForConditionalGeneration"
    special_tokens = ("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>")

    def model_class_for(self, model_type: str) -> str:
        return "SmolVLMForConditionalGeneration" if model_type == "smolvlm" else self.model_class

    def language_model(self, model):
        return model.model.text_model

    def projector(self, model):
        return model.model.connector

    def expected_image_tokens(self, config, inputs):
        pv = inputs.get("pixel_values")
        if pv is None:
            return None
        v = config.vision_config
        per_tile = (v.image_size // v.patch_size) ** 2 // config.scale_factor ** 2
        pam = inputs.get("pixel_attention_mask")
        tiles = int(pam.flatten(0, -3).any(-1).any(-1).sum()) if pam is not None else int(pv.shape[0] * pv.shape[1])
        return tiles * per_tile

    def image_grid(self, config, inputs):
        pv = inputs.get("pixel_values")
        if pv is None or pv.shape[1] != 1:
            return None  # split into tiles
        v = config.vision_config
        side = v.image_size // v.patch_size // config.scale_factor
        return (side, side)

    def config(self, tok, shape, smol: bool = False):
        text = transformers.LlamaConfig(**decoder_dims(tok, shape, tie_word_embeddings=False))
        kind = "SmolVLM" if smol else "Idefics3"
        vc = getattr(transformers, f"{kind}VisionConfig")(**vit_dims(shape))
        return getattr(transformers, f"{kind}Config")(vision_config=vc, text_config=text, scale_factor=2,
                                                     image_token_id=tok.convert_tokens_to_ids("<image>"),
                                                     pad_token_id=tok.pad_token_id)

    def processor(self, tok, shape):
        s = shape.image_size
        ip = transformers.Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": s},
                                                 max_image_size={"longest_edge": s})
        return transformers.Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=(s // shape.patch) ** 2 // 4,
                                              chat_template=chat_template(self.layout, "<image>"))
