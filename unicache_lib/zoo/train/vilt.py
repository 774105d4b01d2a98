"""Train the shipped tiny ViLT (``ViltForQuestionAnswering``, single-stream fusion) on the world's questions.

    python -m unicache_lib.zoo.train.vilt --out data/models/tiny-vilt --seed 0

One stage: the answer classifier's cross-entropy on the pooled first text token, plus the patch heads of
:mod:`unicache_lib.zoo.train.patch_heads` on the last layer's image tokens (weight ``--aux``), which keeps the
image path from collapsing to the text prior. Image tokens are fed in grid order
(:func:`unicache_lib.families.vilt.grid_ordered`) so the patch labels line up. The card records held-out
accuracy per question type and the image-shuffle control.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.compat import transformers
from ...families import FAMILIES
from ...families.base import Shape
from ...families.vilt import grid_ordered
from ...world.text import ANSWERS
from .llava import TRAIN_QTYPES, held_out, heldout_set, question_images, score_answers
from .llava import sample_batch as _sample
from .loop import Stage, fit, parse, recipe_parser, ship, start, warmup
from .patch_heads import PatchHeads, patch_labels

IMAGE_SIZE, PATCH = 64, 8
GRID = IMAGE_SIZE // PATCH
LABELS = sorted({a for t in TRAIN_QTYPES for a in ANSWERS[t]})


def build(seed: int, layers: int = 6, heads: int = 8, head_dim: int = 16):
    """-> (model, processor): a ViLT at tiny width over the world tokenizer, answer classes :data:`LABELS`."""
    fam = FAMILIES["ViLT"]
    tok = fam.tokenizer()
    shape = Shape(layers=layers, heads=heads, head_dim=head_dim, image_size=IMAGE_SIZE, patch=PATCH, extra={"labels": LABELS})
    torch.manual_seed(seed)
    return transformers.ViltForQuestionAnswering(fam.config(tok, shape)), fam.processor(tok, shape)


def encode(processor, questions, images_uint8) -> dict:
    return dict(processor(images=list(images_uint8), text=list(questions), return_tensors="pt", padding=True))


def forward(model, processor, questions, images_uint8):
    """-> (answer logits ``[B, n_labels]``, last hidden states ``[B, S, d]``), image tokens in grid order."""
    out = model.vilt(**grid_ordered(model, encode(processor, questions, images_uint8)))
    return model.classifier(out.pooler_output), out.last_hidden_state


@torch.no_grad()
def evaluate(model, processor, qas, shuffle_seed=None, batch=100) -> dict:
    model.eval()
    imgs = question_images(qas, shuffle_seed)
    pred = []
    for s in range(0, len(qas), batch):
        inp = grid_ordered(model, encode(processor, [q.question for q in qas[s : s + batch]], imgs[s : s + batch]))
        # (grid order: the same answers on every run)
        pred += [model.config.id2label[int(i)] for i in model(**inp).logits.argmax(-1)]
    return score_answers(pred, qas)


def train(model, processor, rng, steps, batch, lr, aux, log, eval_every=0, eval_qas=None):
    heads = PatchHeads(model.config.hidden_size, GRID)
    label2id = model.config.label2id

    def step_loss(step):
        model.train()
        items = _sample(rng, batch, caption_rate=0.0)
        logits, hidden = forward(model, processor, [q for _, q, _ in items], np.stack([qa.scene.uint8() for qa, _, _ in items]))
        y = torch.tensor([label2id[a] for _, _, a in items])
        loss = torch.nn.functional.cross_entropy(logits, y)
        n_img = 1 + GRID * GRID
        pl = torch.from_numpy(np.stack([patch_labels(qa.scene, PATCH) for qa, _, _ in items]))
        aux_loss, patch_acc = heads.loss(hidden[:, -n_img + 1:], pl)
        return loss + aux * aux_loss, lambda: {"loss": loss.item(), "aux_loss": aux_loss.item(),
                                                "train_acc": (logits.argmax(-1) == y).float().mean().item(),
                                                "patch_acc": patch_acc}

    fit(Stage(None, "ViLT: answers + patch heads", steps, lr, warmup(steps), (0.9, 0.98), eval_every=eval_every),
        list(model.parameters()) + list(heads.parameters()), step_loss, log,
        (lambda: held_out(evaluate(model, processor, eval_qas))) if eval_qas else None)


def main(argv=None):
    ap = recipe_parser(__doc__, out="data/models/tiny-vilt", lr=1e-3,
                       ints={"--steps": 3000, "--batch": 48, "--n-heldout": 1500})
    ap.add_argument("--aux", type=float, default=0.5, help="weight of the patch-head loss")
    args = parse(ap, argv)
    run = start(args, "ViltForQuestionAnswering", lambda: build(args.seed))
    train(run.model, run.processor, run.rng, args.steps, args.batch, args.lr, args.aux, run.log, args.eval_every,
          heldout_set(200, seed=999) if args.eval_every else None)
    held = heldout_set(args.n_heldout)
    ship(run, lambda model: {
        "prompt": "{question} (text first, then the image's class token and 64 patches)", "image_size": IMAGE_SIZE,
        "patch": PATCH, "trained_question_types": list(TRAIN_QTYPES), "recipe": (__doc__ or "").strip().split("\n\n", 2)[2],
        "heldout": evaluate(model, run.processor, held),
        "heldout_images_shuffled": evaluate(model, run.processor, held, shuffle_seed=1)},
        ("heldout", "heldout_images_shuffled"), model="tiny-vilt", family="ViLT")

if __name__ == "__main__":
    main()
