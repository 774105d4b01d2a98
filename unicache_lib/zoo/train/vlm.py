"""Train a shipped tiny VLM of a registered family through its own processor: tiny-mllama (cross-attention
layers) and the understanding side of tiny-janus.

    python -m unicache_lib.zoo.train.vlm --family Mllama --out data/models/tiny-mllama --seed 0

The tiny-llava recipe (:mod:`unicache_lib.zoo.train.llava`), with every batch encoded by the family's
processor (so prompts, image tokens, cross-attention masks and pixel values are exactly what a user's
``processor(...)`` call gives):

a. the vision tower alone, with patch heads (:mod:`unicache_lib.zoo.train.patch_heads`);
b. the rest with the tower frozen: one question (or caption) per image, loss on the answer tokens only.

A model card (config, data, accuracy per question type, image-shuffle control, captions, time, seed,
log and weight checksums) is written next to the weights.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.compat import transformers
from ...core.models import first_token_logits
from ...families import FAMILIES
from ...families.base import Shape
from ...world.text import CAPTION_QUESTION
from .llava import (
    TRAIN_QTYPES,
    greedy_captions,
    held_out,
    heldout_set,
    question_images,
    sample_batch,
    score_answers,
    score_captions,
)
from .loop import Stage, fit, parse, qtype_weights, recipe_parser, ship, start, vqa_options, warmup
from .patch_heads import train_patch_heads

IMAGE_SIZE, PATCH = 64, 8
GRID = IMAGE_SIZE // PATCH


def encode(fam, processor, questions, images_uint8, answers=None) -> tuple[dict, torch.Tensor | None]:
    """Processor inputs for a batch (left-padded, with ``position_ids`` that skip the padding) and, when
    answers are given, labels ``[B, S]`` that are -100 except on the answer tokens and the closing ``</s>``."""
    tok = processor.tokenizer
    prompts = [fam.prompt(processor, q) for q in questions]
    n_ans = None
    if answers is not None:
        n_ans = [len(a.split()) + 1 for a in answers]
        prompts = [f"{p} {a} {tok.eos_token}" for p, a in zip(prompts, answers)]
    tok.padding_side = "left"
    inp = processor(text=prompts, images=[[im] for im in images_uint8], return_tensors="pt", padding=True)
    inp["position_ids"] = (inp["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    if answers is None:
        return dict(inp), None
    labels = torch.full_like(inp["input_ids"], -100)
    for i, n in enumerate(n_ans):
        labels[i, -n:] = inp["input_ids"][i, -n:]
    return dict(inp), labels


@torch.no_grad()
def evaluate(fam, model, processor, qas, shuffle_seed=None) -> dict:
    """Exact-match accuracy overall and per question type (optionally with images shuffled across questions)."""
    model.eval()
    ids = first_token_logits(model, lambda qs, imgs: encode(fam, processor, qs, imgs)[0], [q.question for q in qas],
                             question_images(qas, shuffle_seed)).argmax(-1)
    return score_answers(processor.tokenizer.convert_ids_to_tokens(ids.tolist()), qas)


def generate_captions(fam, model, processor, images_uint8, max_new_tokens=16, batch=50) -> list[str]:
    """Greedy captions through ``model.generate`` (:func:`~unicache_lib.zoo.train.llava.greedy_captions`)."""
    def inputs(imgs):  # generate numbers the positions itself
        return {k: v for k, v in encode(fam, processor, [CAPTION_QUESTION] * len(imgs), imgs)[0].items()
                if k != "position_ids"}
    return greedy_captions(model, processor.tokenizer, images_uint8, inputs, max_new_tokens, batch)


def evaluate_captions(fam, model, processor, scenes) -> dict:
    return score_captions(generate_captions(fam, model, processor, np.stack([s.uint8() for s in scenes])), scenes)


def train_lm(recipe, fam, model, processor, rng, steps, batch, lr, log, eval_every=0, eval_qas=None, single_frac=0.08,
             weights=None, exists_negatives="hard"):
    """Stage b: everything but the (frozen) vision tower. The first ``single_frac`` of the steps use one-object
    scenes only; ``exists_negatives`` is how the "is there a ...?" negatives are drawn (:func:`sample_batch`)."""
    tower = recipe.tower(model)
    tower.requires_grad_(False)
    proj, rest = recipe.lm_params(model)

    def step_loss(step):
        model.train()
        tower.eval()
        items = sample_batch(rng, batch, single_only=step < single_frac * steps, weights=weights,
                             exists_negatives=exists_negatives)
        inp, labels = encode(fam, processor, [q for _, q, _ in items], np.stack([qa.scene.uint8() for qa, _, _ in items]),
                             [a for _, _, a in items])
        # the label of position t is predicted at t-1
        loss = torch.nn.functional.cross_entropy(model(**inp).logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                 ignore_index=-100)
        return loss, lambda: {"loss": loss.item()}

    fit(Stage("b", "stage b: language model", steps, lr, warmup(steps), (0.9, 0.98), eval_every=eval_every),
        [{"params": proj, "lr_scale": 3.0}, {"params": rest, "lr_scale": 1.0}], step_loss, log,
        evaluate=(lambda: held_out(evaluate(fam, model, processor, eval_qas))) if eval_qas else None)


class MllamaRecipe:
    """Llama-3.2-Vision layout at tiny width: a one-tile 64 px vision encoder (2 local + 1 global layers),
    a text model of 6 layers of which 1, 3 and 5 are cross-attention layers (low / middle / top). A recipe (one per
    family in :data:`RECIPES`) says what differs between families: how to build the model (``build(seed) -> (model,
    processor)`` at the shipped shape), its vision tower (``tower``, ``tower_dim``), the ``[B, GRID*GRID, d]``
    features of its grid patches (``patch_features``, row-major) and its language-model parameters (``lm_params``:
    projector-like ones trained at 3x the rate, then the others)."""

    family = "Mllama"
    model_name = "tiny-mllama"

    def shape(self):
        return Shape(layers=6, heads=8, kv_heads=8, head_dim=16, vision_layers=2, vision_heads=4, vision_head_dim=32,
                     image_size=IMAGE_SIZE, patch=PATCH,
                     extra={"cross_every": 2, "global_layers": 1, "intermediate_layers_indices": [1], "max_tiles": 1})

    def build(self, seed):
        fam = FAMILIES[self.family]
        tok = fam.tokenizer()
        torch.manual_seed(seed)
        model = transformers.MllamaForConditionalGeneration(fam.config(tok, self.shape()))
        fam.activate(model)  # cross-attention gates start open (tanh(1)), not at 0
        return model, fam.processor(tok, self.shape())

    def tower(self, model):
        return model.model.vision_model

    def tower_dim(self, model):
        return model.config.vision_config.vision_output_dim

    def patch_features(self, model, processor, images_uint8):
        px = processor.image_processor([[im] for im in images_uint8], return_tensors="pt")
        h = self.tower(model)(px["pixel_values"], px["aspect_ratio_ids"], px["aspect_ratio_mask"]).last_hidden_state
        return h[:, 0, 0, 1 : 1 + GRID * GRID]  # first image, first tile, after the class token

    def lm_params(self, model):
        proj = list(model.model.multi_modal_projector.parameters())
        rest = [p for n, p in model.named_parameters()
                if p.requires_grad and "multi_modal_projector" not in n and "vision_model" not in n]
        return proj, rest


RECIPES = {r.family: r for r in (MllamaRecipe(),)}


def main(argv=None):
    ap = recipe_parser(__doc__, out=None, lr=2e-3)
    ap.add_argument("--family", default="Mllama", choices=sorted(RECIPES))
    vqa_options(ap, steps_b=3000, batch_b=48, weights_help="e.g. exists=3 (others 1): skew the question mix",
                curriculum=True)
    args = parse(ap, argv)

    recipe = RECIPES[args.family]
    fam = FAMILIES[recipe.family]
    run = start(args, fam.model_class, lambda: recipe.build(args.seed))
    if args.init_from:
        run.processor = fam.adapt_processor(run.processor, run.model.config)
    model, proc = run.model, run.processor
    patch_acc = train_patch_heads(lambda imgs: recipe.patch_features(model, proc, imgs), recipe.tower(model).parameters(),
                                  recipe.tower_dim(model), GRID, PATCH, run.rng, args.steps_a, args.batch_a, args.lr,
                                  run.log) if args.steps_a else (run.previous or {}).get("stage_a_patch_accuracy", float("nan"))
    t_a = run.minutes()
    train_lm(recipe, fam, model, proc, run.rng, args.steps_b, args.batch_b, args.lr, run.log, args.eval_every,
             heldout_set(200, seed=999) if args.eval_every else None,
             single_frac=args.single_frac if args.single_frac is not None else (0.0 if args.init_from else 0.08),
             weights=qtype_weights(args), exists_negatives=args.exists_negatives)
    held = heldout_set(args.n_heldout)
    ship(run, lambda model: {
        "prompt": fam.layout, "image_size": IMAGE_SIZE, "patch": PATCH,
        "trained_question_types": list(TRAIN_QTYPES) + ["caption"], "recipe": (recipe.__doc__ or "").strip(),
        "stage_a_patch_accuracy": patch_acc, "stage_a_minutes": t_a, "heldout": evaluate(fam, model, proc, held),
        "heldout_images_shuffled": evaluate(fam, model, proc, held, shuffle_seed=1),
        "captions": evaluate_captions(fam, model, proc, [q.scene for q in heldout_set(args.n_captions, seed=4321)])},
        ("heldout", "heldout_images_shuffled", "captions"), model=recipe.model_name, family=recipe.family)

if __name__ == "__main__":
    main()
