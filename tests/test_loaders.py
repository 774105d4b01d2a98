"""Loaders on tiny *random* configs (nothing is downloaded). Every understanding family is covered by
tests/test_families.py; here: errors, generators, device and dtype."""
import json

import pytest
import torch

from unicache_lib.zoo.loaders import (UnsupportedModelError, load_generator, load_transformer, load_understanding,
                                      resolve, understanding_family)


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnsupportedModelError, match=r"LLaVA-1\.5 \(llava\).*Mllama \(mllama\).*To add one"):
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


def test_device_and_dtype_parameters(random_llava_dir):
    from unicache_lib.zoo.loaders import resolve_device, resolve_dtype

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("bf16") == torch.bfloat16
    assert resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="DTYPE must be"):
        resolve_dtype("half-ish")
    with pytest.raises(ValueError, match="DEVICE must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use DEVICE='cpu' or 'auto'"):
            resolve_device("cuda")
    model, _ = load_understanding(str(random_llava_dir), dtype="bfloat16", device="auto")
    p = next(model.parameters())
    assert p.dtype == torch.bfloat16 and p.device.type == resolve_device("auto").type
