"""The shipped checkpoints load offline through from_pretrained and meet their bars; the training
scripts run."""
import json

import numpy as np
import pytest
import torch

from unicache_lib.zoo.loaders import MODELS_DIR, SHIPPED, load_generator, load_understanding


def test_shipped_weights_fit_the_size_budget():
    total = sum(f.stat().st_size for f in MODELS_DIR.rglob("*.safetensors"))
    assert 0 < total <= 40 * 2**20, f"{total / 2**20:.1f} MB"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cards_record_the_checksum_of_every_weight_file(name):
    import time

    from unicache_lib.zoo.checksums import _digests, verify_checksums, weight_checksums

    card = json.loads((MODELS_DIR / name / "model_card.json").read_text())
    assert card["checksums"] and card["checksums"] == weight_checksums(MODELS_DIR / name)
    _digests.clear()
    t0 = time.perf_counter()
    assert verify_checksums(MODELS_DIR / name, required=True) == len(card["checksums"])
    assert time.perf_counter() - t0 < 2  # a few MB


def test_tiny_llava_meets_its_bar_and_uses_the_image():
    from unicache_lib.zoo.train_llava import evaluate, heldout_set

    model, processor = load_understanding("tiny-llava")
    qas = heldout_set(400)  # the first 400 of the model card's 1,500 held-out questions
    res = evaluate(model, processor.tokenizer, qas)
    assert res["accuracy"] >= 0.95, res
    assert min(res["per_type"].values()) >= 0.85, res
    shuffled = evaluate(model, processor.tokenizer, qas, shuffle_seed=1)
    assert shuffled["accuracy"] < 0.6, shuffled  # images swapped: back towards the text prior
    card = json.loads((MODELS_DIR / "tiny-llava" / "model_card.json").read_text())
    assert card["heldout"]["n"] >= 1000 and card["heldout"]["accuracy"] >= 0.95


def test_tiny_llava_processor_matches_training_encoding():
    from unicache_lib.world.samples import load
    from unicache_lib.zoo import tiny_llava as tl

    model, processor = load_understanding("tiny-llava")
    s = load(per_type=1)[1]
    enc = processor(images=[s.image], text=[tl.PROMPT.format(question=s.question)], return_tensors="pt")
    ids, _, _ = tl.encode(processor.tokenizer, [s.question], None, model.config.image_seq_length)
    assert torch.equal(enc["input_ids"], ids)
    assert torch.allclose(enc["pixel_values"], tl.pixel_values(s.image[None]))


def test_tiny_llava_captions_name_the_objects():
    from unicache_lib.world.text import make_qa
    from unicache_lib.zoo.train_llava import evaluate_captions

    model, processor = load_understanding("tiny-llava")
    rng = np.random.default_rng(99)
    scenes = [make_qa(rng, "exists").scene for _ in range(40)]
    r = evaluate_captions(model, processor.tokenizer, scenes)
    assert r["objects_named"] >= 0.8, r


@pytest.fixture(scope="module")
def generator_scores():
    from unicache_lib.zoo.train_generator import eval_prompts, evaluate

    return {name: evaluate(load_generator(name), eval_prompts(100)) for name in ("tiny-mmdit", "tiny-pixart")}


@pytest.mark.parametrize("name", ["tiny-mmdit", "tiny-pixart"])
def test_generators_follow_colour(generator_scores, name):
    r = generator_scores[name]
    assert r["n"] == 100 and r["colour"] >= 0.90, r
    card = json.loads((MODELS_DIR / name / "model_card.json").read_text())
    assert card["eval_short_prompts"]["n"] >= 100


@pytest.mark.parametrize("name", ["tiny-mmdit", "tiny-pixart"])
def test_generators_follow_position(generator_scores, name):
    r = generator_scores[name]
    assert r["position"] >= 0.80, r


@pytest.mark.parametrize("name", ["tiny-mmdit", "tiny-pixart"])
def test_generators_shape_target(generator_scores, name):
    r = generator_scores[name]
    assert r["shape"] >= 0.70, r


def test_training_scripts_smoke(tmp_path):
    from unicache_lib.zoo import train_generator, train_llava

    train_llava.main(["--out", str(tmp_path / "llava"), "--steps-a", "2", "--steps-b", "2", "--batch-a", "4",
                      "--batch-b", "4", "--n-heldout", "8", "--eval-every", "0", "--n-captions", "4"])
    card = json.loads((tmp_path / "llava" / "model_card.json").read_text())
    assert list(card["checksums"]) == ["model.safetensors"]
    assert card["heldout"]["n"] == 8 and set(card["heldout"]["per_type"]) == {"colour", "shape", "position", "exists"}
    model, _ = load_understanding(str(tmp_path / "llava"))
    assert model.config.image_seq_length == 64
    for fam in ("sd3", "pixart"):
        stale = {"checksums": {"transformer/diffusion_pytorch_model.safetensors": "0" * 64}}  # an earlier run's card
        (tmp_path / fam).mkdir()
        (tmp_path / fam / "model_card.json").write_text(json.dumps(stale))
        train_generator.main(["--family", fam, "--out", str(tmp_path / fam), "--steps", "2", "--batch", "4",
                              "--n-eval", "4", "--eval-every", "0"])
        card = json.loads((tmp_path / fam / "model_card.json").read_text())
        assert card["family"] == fam and card["eval_short_prompts"]["n"] == 4
        assert sorted(card["checksums"]) == ["text_encoder/model.safetensors", "transformer/diffusion_pytorch_model.safetensors"]
        g = load_generator(str(tmp_path / fam))
        assert g.family == fam
        assert type(g.text_encoder).__name__ == {"sd3": "CLIPTextModelWithProjection", "pixart": "T5EncoderModel"}[fam]
