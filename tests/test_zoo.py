"""The shipped checkpoints load offline through from_pretrained and meet their bars; the training
scripts run."""
import json

import numpy as np
import pytest
import torch

from unicache_lib.runtime.loaders import MODELS_DIR, SHIPPED, load_generator, load_understanding


def test_shipped_weights_fit_the_size_budget():
    total = sum(f.stat().st_size for f in MODELS_DIR.rglob("*.safetensors"))
    assert 0 < total <= 60 * 2**20, f"{total / 2**20:.1f} MB"  # all of data/models


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_cards_record_the_checksum_of_every_weight_file(name):
    import time

    from unicache_lib.runtime.checksums import _digests, verify_checksums, weight_checksums

    card = json.loads((MODELS_DIR / name / "model_card.json").read_text())
    assert card["checksums"] and card["checksums"] == weight_checksums(MODELS_DIR / name)
    _digests.clear()
    t0 = time.perf_counter()
    assert verify_checksums(MODELS_DIR / name, required=True) == len(card["checksums"])
    assert time.perf_counter() - t0 < 2  # a few MB


def test_tiny_llava_meets_its_bar_and_uses_the_image():
    from unicache_lib.zoo.train.llava import evaluate, heldout_set

    model, processor = load_understanding("tiny-llava")
    qas = heldout_set(400)  # the first 400 of the model card's 1,500 held-out questions
    res = evaluate(model, processor.tokenizer, qas)
    assert res["accuracy"] >= 0.95, res
    assert min(res["per_type"].values()) >= 0.85, res
    shuffled = evaluate(model, processor.tokenizer, qas, shuffle_seed=1)
    assert shuffled["accuracy"] < 0.6, shuffled  # images swapped: back towards the text prior
    card = json.loads((MODELS_DIR / "tiny-llava" / "model_card.json").read_text())
    assert card["heldout"]["n"] >= 1000 and card["heldout"]["accuracy"] >= 0.95


def test_tiny_llava_576_has_llava_15s_image_tokens_meets_its_bar_and_uses_the_image():
    """Issue #50: the shipped LLaVA with LLaVA-1.5's 576 image tokens (a 24 x 24 grid) loads through from_pretrained,
    answers the first 150 of its card's held-out questions (96 px scenes) at its bar and falls back towards the text
    prior when the images are shuffled."""
    from unicache_lib.world.questions import heldout_set
    from unicache_lib.zoo.train.llava import evaluate

    model, processor = load_understanding("tiny-llava-576")
    assert model.config.image_seq_length == 576 and model.config.vision_config.image_size == 96
    card = json.loads((MODELS_DIR / "tiny-llava-576" / "model_card.json").read_text())
    assert card["image_tokens"] == 576 and card["heldout"]["n"] >= 1500 and card["heldout"]["accuracy"] >= 0.95
    assert min(card["heldout"]["per_type"].values()) >= 0.90, card["heldout"]
    qas = heldout_set(150, size=96)
    res = evaluate(model, processor.tokenizer, qas)
    assert res["accuracy"] >= 0.93, res
    assert evaluate(model, processor.tokenizer, qas, shuffle_seed=1)["accuracy"] < 0.6


def test_tiny_llava_processor_matches_training_encoding():
    from unicache_lib.runtime import tiny_layouts as tl
    from unicache_lib.world.samples import load

    model, processor = load_understanding("tiny-llava")
    s = load(per_type=1)[1]
    enc = processor(images=[s.image], text=[tl.PROMPT.format(question=s.question)], return_tensors="pt")
    ids, _, _ = tl.encode(processor.tokenizer, [s.question], None, model.config.image_seq_length)
    assert torch.equal(enc["input_ids"], ids)
    assert torch.allclose(enc["pixel_values"], tl.pixel_values(s.image[None]))


def test_tiny_llava_captions_name_the_objects():
    from unicache_lib.world.text import make_qa
    from unicache_lib.zoo.train.llava import evaluate_captions

    model, processor = load_understanding("tiny-llava")
    rng = np.random.default_rng(99)
    scenes = [make_qa(rng, "exists").scene for _ in range(40)]
    r = evaluate_captions(model, processor.tokenizer, scenes)
    assert r["objects_named"] >= 0.8, r


# ---- the study's other architectures (notebook 08): each re-checked on a slice of its card's held-out set ----------
# The targets: 95% (Mllama, ViLT), 90% (Janus answers), recall@1 90% (CLIP), drawn colour 90% / position 80%
# (Janus). The slice bars sit a little under the cards' (300 questions wobble more than 1,500).
BAR_VILT, BAR_MLLAMA, BAR_JANUS = 0.95, 0.95, 0.88  # Janus: 0.913 on its card's 1,500 (bar 0.90)
VQA_BARS = {"tiny-mllama": BAR_MLLAMA, "tiny-vilt": BAR_VILT, "tiny-janus": BAR_JANUS}


@pytest.mark.parametrize("name", sorted(VQA_BARS))
def test_architecture_models_answer_from_the_image(name):
    """Accuracy on the first 300 of the card's held-out questions, and the image-shuffle control near the prior."""
    from unicache_lib.families import family_of
    from unicache_lib.world.questions import heldout_set
    from unicache_lib.zoo.train import vilt as train_vilt
    from unicache_lib.zoo.train import vlm as train_vlm

    model, proc = load_understanding(name)
    qas = heldout_set(300)
    if name == "tiny-vilt":
        res, shuf = train_vilt.evaluate(model, proc, qas), train_vilt.evaluate(model, proc, qas, shuffle_seed=1)
    else:
        fam = family_of(model)
        res, shuf = train_vlm.evaluate(fam, model, proc, qas), train_vlm.evaluate(fam, model, proc, qas, shuffle_seed=1)
    assert res["accuracy"] >= VQA_BARS[name], res
    assert shuf["accuracy"] < 0.6, shuf  # images swapped across questions: back towards the text prior
    card = json.loads((MODELS_DIR / name / "model_card.json").read_text())
    assert card["heldout"]["n"] >= 1000 and card["heldout"]["accuracy"] >= VQA_BARS[name]


def test_tiny_clip_retrieves_the_scene_its_caption_describes():
    from unicache_lib.world.questions import heldout_set
    from unicache_lib.zoo.train.clip import recall_at_1

    model, proc = load_understanding("tiny-clip")
    scenes = [q.scene for q in heldout_set(200)]
    r = recall_at_1(model, proc, scenes)
    assert r["text_to_image"] >= 0.90, r
    ctrl = recall_at_1(model, proc, scenes, shuffle_seed=1)
    assert ctrl["text_to_image"] <= 0.05, ctrl  # captions shuffled across scenes: chance
    card = json.loads((MODELS_DIR / "tiny-clip" / "model_card.json").read_text())
    assert card["heldout_recall"]["n"] == 200 and card["heldout_recall"]["text_to_image"] >= 0.90


def test_tiny_janus_draws_what_the_prompt_asks():
    """Colour and position of 40 one-object drawings (guided, greedy), by the world's checker: the issue's bars."""
    from unicache_lib.zoo.train.janus import evaluate_generation, vq_quality

    model, proc = load_understanding("tiny-janus")
    r = evaluate_generation(model, proc, n=40)
    assert r["colour"] >= 0.9 and r["position"] >= 0.8, r
    rec = vq_quality(model, proc, n=20)  # the VQ-VAE alone: what any drawing is limited by
    assert rec["colour"] >= 0.9 and rec["position"] >= 0.9 and rec["psnr_db"] > 25, rec
    card = json.loads((MODELS_DIR / "tiny-janus" / "model_card.json").read_text())
    assert card["generation"]["n"] >= 100 and card["generation"]["colour"] >= 0.9
    assert card["target"]["reached"] == {"understanding": True, "generation": True}
    per_type = card["heldout"]["per_type"]
    assert card["heldout"]["accuracy"] >= 0.9 and min(per_type.values()) >= 0.85, card["heldout"]  # issue 30's bars


@pytest.fixture(scope="module")
def generator_scores():
    from unicache_lib.zoo.train.generator import eval_prompts, evaluate

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
    from unicache_lib.zoo.train import generator as train_generator
    from unicache_lib.zoo.train import llava as train_llava

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


def test_architecture_training_scripts_smoke(tmp_path):
    """Every training script of notebook 08's models runs, writes a card with checksums, loads through
    ``load_understanding``, and continues from a saved checkpoint (``--init-from``, recorded on the card)."""
    from unicache_lib.zoo.train import clip as train_clip
    from unicache_lib.zoo.train import janus as train_janus
    from unicache_lib.zoo.train import vilt as train_vilt
    from unicache_lib.zoo.train import vlm as train_vlm

    small = ["--n-heldout", "8", "--eval-every", "0", "--threads", "1"]
    train_vilt.main(["--out", str(tmp_path / "vilt"), "--steps", "2", "--batch", "4", *small])
    train_vilt.main(["--init-from", str(tmp_path / "vilt"), "--out", str(tmp_path / "vilt2"), "--steps", "2", "--batch", "4", *small])
    train_clip.main(["--out", str(tmp_path / "clip"), "--steps", "2", "--batch", "4", *small])
    train_vlm.main(["--family", "Mllama", "--out", str(tmp_path / "mllama"), "--steps-a", "2", "--steps-b", "2",
                    "--batch-a", "4", "--batch-b", "4", "--n-captions", "2", *small])
    train_janus.main(["--out", str(tmp_path / "janus"), "--steps-vq", "2", "--steps-a", "2", "--steps-b", "2", "--batch-vq", "4",
                      "--batch-a", "4", "--batch-b", "4", "--n-captions", "2", "--n-generate", "2", *small])
    for name, cls in (("vilt", "ViltForQuestionAnswering"), ("vilt2", "ViltForQuestionAnswering"), ("clip", "CLIPModel"),
                      ("mllama", "MllamaForConditionalGeneration"), ("janus", "JanusForConditionalGeneration")):
        card = json.loads((tmp_path / name / "model_card.json").read_text())
        assert card["class"] == cls and list(card["checksums"]) == ["model.safetensors"], name
        model, proc = load_understanding(str(tmp_path / name))
        assert type(model).__name__ == cls
    assert json.loads((tmp_path / "vilt2" / "model_card.json").read_text())["previous_run"]["args"]["steps"] == 2
    janus = json.loads((tmp_path / "janus" / "model_card.json").read_text())
    assert janus["generation"]["n"] == 2 and janus["vq_tokens"] == 64
    assert proc.num_image_tokens == 64  # the Janus processor is told its checkpoint's count, not 576


def test_the_one_training_loop_is_the_recipe_it_replaced():
    """zoo.train.loop.fit: per step the learning rate lr * lr_scale * lr_at(step), AdamW, gradients clipped to norm 1,
    the same update as a hand-written loop (torch.equal); the log every log_every steps and at the last one (unless
    log_last is off), evaluations every eval_every steps, ``read()`` after the update."""
    from unicache_lib.zoo.train.loop import Stage, fit, lr_at, warmup

    def model_and_data():
        torch.manual_seed(0)
        return torch.nn.Linear(3, 2), torch.randn(7, 4, 3)

    stage = Stage("a", "test", 7, 0.05, warmup(7), (0.9, 0.98), log_every=3, eval_every=4)
    ref, xs = model_and_data()
    groups = [{"params": [ref.weight], "lr_scale": 3.0}, {"params": [ref.bias], "lr_scale": 1.0}]
    opt = torch.optim.AdamW(groups, lr=0.05, betas=(0.9, 0.98), weight_decay=0.01)
    for step in range(7):
        for g in opt.param_groups:
            g["lr"] = 0.05 * g["lr_scale"] * lr_at(step, 7, warmup(7))
        loss = ref(xs[step]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([ref.weight, ref.bias], 1.0)
        opt.step()

    lin, xs = model_and_data()
    log, seen = [], []
    last = fit(stage, [{"params": [lin.weight], "lr_scale": 3.0}, {"params": [lin.bias], "lr_scale": 1.0}],
               lambda step: (lambda loss: (loss, lambda: {"loss": loss.item(), "bias0": lin.bias[0].item()}))(
                   lin(xs[step]).pow(2).mean()), log, evaluate=lambda: ({"eval": len(seen)}, "ok"),
               after_step=seen.append)
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    assert seen == list(range(7))
    assert [(e["step"], "eval" in e) for e in log] == [(0, False), (3, False), (3, True), (6, False)]
    assert all(e["stage"] == "a" for e in log) and last["bias0"] == lin.bias[0].item()  # read after the update
    log = []
    fit(Stage(None, "test", 8, 0.05, 2, log_every=3, log_last=False), list(model_and_data()[0].parameters()),
        lambda step: (lambda loss: (loss, lambda: {"loss": loss.item()}))(torch.ones(()).requires_grad_() * 0), log)
    assert [e["step"] for e in log] == [0, 3, 6] and "stage" not in log[0]


def test_recipe_fingerprint_sees_one_changed_weight(tmp_path):
    """tools/recipe_fingerprint.py (the before/after check of a training refactor): the same tensors give the same
    fingerprint whatever the file's layout; one changed value, or a changed log, changes it."""
    import importlib.util
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    spec = importlib.util.spec_from_file_location("fp", Path(__file__).resolve().parents[1] / "tools" / "recipe_fingerprint.py")
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)
    w = {"a": torch.ones(3, dtype=torch.float16), "scale": torch.tensor(2.0, dtype=torch.float16)}  # a 0-dim tensor too
    (tmp_path / "m").mkdir()
    save_file(w, tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "model_card.json").write_text(json.dumps({"log": [{"step": 0, "loss": 1.0}]}))
    first = fp.fingerprint(tmp_path)
    save_file(dict(reversed(list(w.items()))), tmp_path / "m" / "model.safetensors")
    assert fp.fingerprint(tmp_path) == first
    w["a"][1] = 1.0009765625  # the next float16 after 1
    save_file(w, tmp_path / "m" / "model.safetensors")
    changed = fp.fingerprint(tmp_path)
    assert changed["m/model.safetensors"] != first["m/model.safetensors"] and changed["m/log"] == first["m/log"]
    (tmp_path / "m" / "model_card.json").write_text(json.dumps({"log": [{"step": 0, "loss": 1.5}]}))
    assert fp.fingerprint(tmp_path)["m/log"] != first["m/log"]
