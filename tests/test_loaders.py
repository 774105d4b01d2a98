"""Loaders and capture on tiny *random* configs of the real families (nothing is downloaded)."""
import json

import numpy as np
import pytest
import torch

from unicache_lib.capture import AttentionCapture
from unicache_lib.capture.runner import spans_fn
from unicache_lib.zoo.loaders import (UnsupportedModelError, load_generator, load_transformer, load_understanding,
                                      resolve, understanding_family)

PROMPT = "user : <image> what color is the circle ? assistant :"


def _text_cfg(cls, tok):
    return cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2)


def _check_capture(model, inputs, n_image):
    model.set_attn_implementation("eager")
    spans = spans_fn(model)(inputs["input_ids"])
    assert spans.n_image == n_image and spans.n_text == inputs["input_ids"].shape[1] - n_image
    with torch.no_grad(), AttentionCapture(model, "stats", spans=spans) as cap:
        model(**inputs)
    assert cap.result.layers == [0, 1]
    shares = cap.result[0].data["blocks"]
    assert torch.allclose(shares.sum(-1), torch.ones(4), atol=1e-5)


def test_llava_next_with_its_processor(tmp_path, tokenizer):
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessor, LlavaNextProcessor)

    grid = [[32, 32], [32, 64], [64, 32]]
    vc = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          image_size=32, patch_size=8)
    cfg = LlavaNextConfig(vision_config=vc, text_config=_text_cfg(LlamaConfig, tokenizer), image_grid_pinpoints=grid,
                          image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1)
    LlavaNextForConditionalGeneration(cfg).save_pretrained(tmp_path)
    ip = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_grid_pinpoints=grid)
    LlavaNextProcessor(image_processor=ip, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
                       num_additional_image_tokens=1).save_pretrained(tmp_path)
    assert understanding_family(tmp_path) == "llava_next"
    model, proc = load_understanding(str(tmp_path))
    img = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    inputs = proc(images=[img], text=[PROMPT], return_tensors="pt")
    n_image = int((inputs["input_ids"] == cfg.image_token_id).sum())
    assert n_image > 16  # anyres: base image plus tiles plus newline tokens
    _check_capture(model, inputs, n_image)


def test_llava_onevision_capture(tokenizer):
    # its processor needs torchvision (not installable beside torch 2.13 here): build the ids by hand,
    # with as many image tokens as the model's own image features
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config, SiglipVisionConfig

    vc = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                            image_size=32, patch_size=8)
    img_id = tokenizer.convert_tokens_to_ids("<image>")
    cfg = LlavaOnevisionConfig(vision_config=vc, text_config=_text_cfg(Qwen2Config, tokenizer), image_token_id=img_id,
                               video_token_id=tokenizer.unk_token_id, image_grid_pinpoints=[[32, 32]],
                               vision_feature_layer=-1, vision_feature_select_strategy="full")
    model = LlavaOnevisionForConditionalGeneration(cfg).eval()
    px = torch.randn(1, 2, 3, 32, 32)  # anyres: the base image and one 32x32 tile
    sizes = torch.tensor([[32, 32]])
    with torch.no_grad():
        feats = model.model.get_image_features(px, sizes, vision_feature_layer=-1, vision_feature_select_strategy="full")
    feats = feats.pooler_output if hasattr(feats, "pooler_output") else feats
    n_image = sum(f.shape[0] for f in feats)
    ids = torch.tensor([[tokenizer.bos_token_id] + [img_id] * n_image + tokenizer.encode("what color ?", add_special_tokens=False)])
    _check_capture(model, {"input_ids": ids, "pixel_values": px, "image_sizes": sizes}, n_image)


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnsupportedModelError, match="llava, llava_next, llava_onevision, qwen2_vl"):
        load_understanding(str(tmp_path))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    with pytest.raises(UnsupportedModelError, match="SD3Transformer2DModel"):
        load_transformer(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        understanding_family(tmp_path / "empty")
    assert resolve("llava-hf/llava-1.5-7b-hf") == "llava-hf/llava-1.5-7b-hf"  # hub ids pass through


@pytest.mark.parametrize("family", ["sd3", "pixart"])
def test_generator_families_load_by_class(tmp_path, tokenizer, family):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from unicache_lib.zoo import tiny_generators as tg
    from unicache_lib.zoo.sampling import sample

    torch.manual_seed(0)
    gen = tg.Generator(family, tg.build_transformer(family, layers=2), tg.build_text_encoder(tokenizer, layers=1),
                       tokenizer, FlowMatchEulerDiscreteScheduler())
    gen.save_pretrained(tmp_path)
    tr, fam = load_transformer(str(tmp_path))
    assert fam == family
    loaded = load_generator(str(tmp_path))
    a = sample(loaded, ["a red circle on the left"], steps=3, guidance=2.0, seed=7)
    b = sample(loaded, ["a red circle on the left", "a blue square at the top"], steps=3, guidance=2.0, seed=[7, 8])
    assert a.shape == (1, 3, 32, 32) and torch.allclose(a[0], b[0], atol=1e-5)  # per-sample noise
    with pytest.raises(ValueError, match="prompts is empty"):
        sample(loaded, [], steps=2)


def test_dit_family_is_recognised(tmp_path):
    from diffusers import DiTTransformer2DModel

    DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3, num_layers=1,
                          sample_size=8, patch_size=2, norm_num_groups=1).save_pretrained(tmp_path / "transformer")
    assert load_transformer(str(tmp_path))[1] == "dit"


def test_qwen2_vl_capture(tokenizer):
    # Qwen2-VL's processor needs torchvision too: ids by hand, 8x8 patches merged 2x2 -> 16 image tokens
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from unicache_lib.capture import find_attention_modules

    img_id = tokenizer.convert_tokens_to_ids("<image>")
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                           temporal_patch_size=2, in_channels=3),
        image_token_id=img_id, video_token_id=tokenizer.unk_token_id, vision_start_token_id=tokenizer.bos_token_id)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    assert len(find_attention_modules(model, part="vision")) == 2  # model.visual.blocks.N.attn
    ids = torch.tensor([[tokenizer.bos_token_id] + [img_id] * 16 + tokenizer.encode("what color ?", add_special_tokens=False)])
    inputs = {"input_ids": ids, "pixel_values": torch.randn(64, 3 * 2 * 4 * 4), "image_grid_thw": torch.tensor([[1, 8, 8]])}
    _check_capture(model, inputs, 16)
