"""Build the tiny LLaVA (CLIP vision tower + Llama language model) and its processor.

The model is a stock ``transformers.LlavaForConditionalGeneration``: once saved with
``save_pretrained`` it loads through exactly the path a user takes with
``llava-hf/llava-1.5-7b-hf``. Prompt layout, as in LLaVA-1.5: image first, then the text::

    <s> user : <image>x64 {question} assistant : {answer} </s>

How a model in this layout is fed (:data:`~unicache_lib.runtime.tiny_layouts.PROMPT`, ``encode``, ``pixel_values``,
``answer_logits``) is in :mod:`unicache_lib.runtime.tiny_layouts`.
"""
from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from ..core.compat import transformers
from ..world.text import vocabulary

SPECIAL = ["<pad>", "<unk>", "<s>", "</s>", "<image>"]
IMAGE_SIZE, PATCH = 64, 8  # the shipped layout: 64 px images, 8 px patches
N_IMG = (IMAGE_SIZE // PATCH) ** 2


def build_tokenizer(extra_special=(), named: dict | None = None, close: bool = False):
    """Word-level fast tokenizer over the world's vocabulary; ``<image>`` is a special token.

    ``extra_special``: more special tokens (e.g. a model family's image markers), appended after the
    world's vocabulary so the shipped ids stay as they are; ``named``: special tokens the family's
    processor reads as tokenizer attributes (``{"boi_token": "<start_of_image>"}``); ``close``: end every
    text with ``</s>`` too (a CLIP text tower pools at its end token).
    """
    named = dict(named or {})
    extra_special = list(extra_special) + list(named.values())

    extra = [t for t in dict.fromkeys(extra_special) if t not in SPECIAL]
    vocab = {t: i for i, t in enumerate(SPECIAL + vocabulary() + extra)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>" if close else "<s> $A", pair="<s> $A $B </s>" if close else "<s> $A $B",
        special_tokens=[("<s>", vocab["<s>"])] + ([("</s>", vocab["</s>"])] if close else []),
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", additional_special_tokens=["<image>"] + extra,
        **({"extra_special_tokens": named} if named else {}),
    )
    fast.padding_side = "left"  # batched generation pads on the left
    return fast


def build_processor(tokenizer, image_size: int = 64, patch: int = 8):
    ip = transformers.CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size}, do_resize=True,
                                         do_center_crop=True, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return transformers.LlavaProcessor(image_processor=ip, tokenizer=tokenizer, patch_size=patch,
                                       vision_feature_select_strategy="default", num_additional_image_tokens=1)


def build_config(tokenizer, image_size=64, patch=8, vision_hidden=128, vision_layers=2,
                 lm_hidden=128, lm_layers=4, lm_heads=8, kv_heads=8, max_positions=256):
    vc = transformers.CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=4 * vision_hidden,
                                       num_hidden_layers=vision_layers, num_attention_heads=4, image_size=image_size,
                                       patch_size=patch, projection_dim=vision_hidden)
    tc = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=lm_hidden, intermediate_size=4 * lm_hidden,
                                  num_hidden_layers=lm_layers, num_attention_heads=lm_heads,
                                  num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    return transformers.LlavaConfig(vision_config=vc, text_config=tc,
                                    image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
                                    vision_feature_select_strategy="default",
                                    image_seq_length=(image_size // patch) ** 2, projector_hidden_act="gelu")
