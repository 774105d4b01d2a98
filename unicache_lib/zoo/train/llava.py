"""Train the shipped tiny LLaVA from scratch on the synthetic world.

    python -m unicache_lib.zoo.train.llava --out data/models/tiny-llava --seed 0

Two stages (a one-stage run from scratch collapses to the text prior, see the model card):

a. The CLIP vision tower alone, with linear heads that classify every patch as background or
   colour x shape x position of the object covering it, plus the patch's row and column.
b. The whole LLaVA with the tower frozen: projector and language model learn to answer one
   question (or write one caption) per image; the loss is on the answer tokens only.

``--image-size 96 --patch 4`` builds tiny-llava-576 instead (a 24 x 24 patch grid: LLaVA-1.5's 576 image tokens);
``--init-lm-from`` starts its projector and language model from a shipped tiny-llava (same vocabulary and widths)
while the tower, whose patches differ, learns stage a from scratch.

A model card (config, data, accuracy per question type, image-shuffle control, time, seed) is
written next to the weights.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.compat import transformers
from ...families import family_of
from ...runtime import tiny_layouts as layout
from ...runtime.tiny_layouts import answer_logits
from ...world.questions import TRAIN_QTYPES, heldout_set, question_images, score_answers, score_captions  # noqa: F401
from ...world.text import CAPTION_QUESTION, QA, caption, make_qa
from .. import tiny_llava as tl
from ..tiny_llava import IMAGE_SIZE, N_IMG, PATCH  # noqa: F401
from .loop import Stage, fit, parse, qtype_weights, recipe_parser, ship, start, vqa_options, warmup
from .patch_heads import patch_labels as _patch_labels
from .patch_heads import train_patch_heads


def patch_labels(qa: QA, patch: int = PATCH) -> np.ndarray:
    """``[n_patches]`` class per patch: 0 background, else 1 + colour*15 + shape*5 + position."""
    return _patch_labels(qa.scene, patch)


def n_image_tokens(model) -> int:
    return family_of(model).image_tokens_per_picture(model.config)  # the LLaVA adapter's count (image_seq_length)


def sample_batch(rng, n, single_only=False, caption_rate=0.16, weights=None, exists_negatives="hard", size=IMAGE_SIZE):
    """``n`` (qa, question, answer) items; ``weights`` (question type -> weight) skews the mix;
    ``exists_negatives`` is passed to :func:`make_qa` (``"hard"``: the held-out kind)."""
    w = np.array([(weights or {}).get(t, 1.0) for t in TRAIN_QTYPES], float)
    items = []
    for _ in range(n):
        st = ("single",) if single_only else None
        kw = {"scene_types": st, "size": size} if st else {"size": size}
        if rng.random() < caption_rate:
            qa = make_qa(rng, "exists", **kw)
            items.append((qa, CAPTION_QUESTION, caption(qa.scene)))
        else:
            qt = str(rng.choice(TRAIN_QTYPES, p=w / w.sum()))
            if qt == "exists" and exists_negatives != "hard":
                kw["exists_negatives"] = exists_negatives
            qa = make_qa(rng, qt, **kw)
            items.append((qa, qa.question, qa.answer))
    return items


def train_tower(model, rng, steps, batch, lr, log):
    tower = model.model.vision_tower
    vc = tower.config
    return train_patch_heads(
        lambda imgs: tower(layout.pixel_values(imgs), output_hidden_states=True).hidden_states[-1][:, 1:],
        tower.parameters(), vc.hidden_size, vc.image_size // vc.patch_size, vc.patch_size, rng, steps, batch, lr, log,
        size=vc.image_size)


@torch.no_grad()
def answer_questions(model, tokenizer, questions, images_uint8, batch=100):
    """Greedy one-token answers. Returns a list of words."""
    return tokenizer.convert_ids_to_tokens(answer_logits(model, tokenizer, questions, images_uint8, batch).argmax(-1).tolist())


@torch.no_grad()
def greedy_captions(model, tokenizer, images_uint8, inputs, max_new_tokens=16, batch=50) -> list[str]:
    """Greedy captions via ``model.generate``, ``batch`` images at a time: ``inputs(images) -> generate's inputs``
    (the caption question laid out for the model). Returns a list of strings."""
    out = []
    model.eval()
    for s in range(0, len(images_uint8), batch):
        inp = inputs(images_uint8[s : s + batch])
        gen = model.generate(**inp, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        out += tokenizer.batch_decode(gen[:, inp["input_ids"].shape[1]:], skip_special_tokens=True)
    return [" ".join(c.split()) for c in out]


def generate_captions(model, tokenizer, images_uint8, max_new_tokens=16, batch=50):
    """Greedy captions via ``model.generate``. Returns a list of strings."""
    def inputs(imgs):
        ids, mask, _ = layout.encode(tokenizer, [CAPTION_QUESTION] * len(imgs), None, n_image_tokens(model))
        return {"input_ids": ids, "attention_mask": mask, "pixel_values": layout.pixel_values(imgs)}
    return greedy_captions(model, tokenizer, images_uint8, inputs, max_new_tokens, batch)


def evaluate(model, tokenizer, qas, shuffle_seed=None) -> dict:
    """Exact-match accuracy overall and per question type (optionally with images shuffled)."""
    return score_answers(answer_questions(model, tokenizer, [q.question for q in qas], question_images(qas, shuffle_seed)),
                         qas)


def evaluate_captions(model, tokenizer, scenes) -> dict:
    return score_captions(generate_captions(model, tokenizer, np.stack([s.uint8() for s in scenes])), scenes)


def train_lm(model, tokenizer, rng, steps, batch, lr, log, eval_every=0, eval_qas=None, weights=None,
             single_frac=0.08):
    model.model.vision_tower.requires_grad_(False)
    size, n_img = model.config.vision_config.image_size, n_image_tokens(model)
    proj = list(model.model.multi_modal_projector.parameters())
    rest = [p for n, p in model.named_parameters()
            if p.requires_grad and "multi_modal_projector" not in n and "vision_tower" not in n]

    def step_loss(step):
        model.train()
        model.model.vision_tower.eval()
        items = sample_batch(rng, batch, single_only=step < single_frac * steps, weights=weights, size=size)
        ids, mask, labels = layout.encode(tokenizer, [q for _, q, _ in items], [a for _, _, a in items], n_img)
        px = layout.pixel_values(np.stack([qa.scene.uint8() for qa, _, _ in items]))
        # the label of position t is predicted from position t-1
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=px).logits[:, :-1].flatten(0, 1)
        loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100)
        return loss, lambda: {"loss": loss.item()}

    fit(Stage("b", "stage b: projector + language model", steps, lr, warmup(steps), (0.9, 0.98), eval_every=eval_every),
        [{"params": proj, "lr_scale": 3.0}, {"params": rest, "lr_scale": 1.0}], step_loss, log,
        evaluate=(lambda: held_out(evaluate(model, tokenizer, eval_qas))) if eval_qas else None)


def held_out(r: dict) -> tuple[dict, str]:
    """An in-training evaluation as :func:`~unicache_lib.zoo.train.loop.fit` logs it."""
    return {"eval": r}, f"held-out accuracy {r['accuracy']:.3f} {r['per_type']}"


def main(argv=None):
    ap = recipe_parser(__doc__, out="data/models/tiny-llava", lr=2e-3, ints={"--patch": PATCH})
    vqa_options(ap, steps_b=4200, batch_b=48, weights_help="e.g. colour=2,exists=2 (others 1)")
    ap.add_argument("--image-size", type=int, default=IMAGE_SIZE, help="image side in px (96 with --patch 4: 576 tokens)")
    ap.add_argument("--vision-layers", type=int, default=2,
                    help="tower depth (4 for tiny-llava-576: objects span about 3x more patches per side than at 64 tokens)")
    ap.add_argument("--init-lm-from", default=None,
                    help="a saved tiny-llava whose projector and language model start this run (the tower is new)")
    args = parse(ap, argv)
    torch.manual_seed(args.seed)
    run = start(args, "LlavaForConditionalGeneration", lambda: build(args))
    model, tok = run.model, run.processor.tokenizer
    patch_acc = train_tower(model, run.rng, args.steps_a, args.batch_a, args.lr, run.log) if args.steps_a else \
        (run.previous or {}).get("stage_a_patch_accuracy", float("nan"))
    t_a = run.minutes()
    size = model.config.vision_config.image_size
    quick = heldout_set(200, seed=999, size=size) if args.eval_every else None
    train_lm(model, tok, run.rng, args.steps_b, args.batch_b, args.lr, run.log, args.eval_every, quick,
             qtype_weights(args), single_frac=0.0 if args.init_from else 0.08)
    held = heldout_set(args.n_heldout, size=size)

    def measure(model):  # the bar is measured on what ships: the fp16 checkpoint, reloaded
        n = n_image_tokens(model)
        return {"model": "tiny-llava" if n == N_IMG else f"tiny-llava-{n}", "prompt": layout.PROMPT, "image_size": size,
                "patch": model.config.vision_config.patch_size, "image_tokens": n,
                "trained_question_types": list(TRAIN_QTYPES) + ["caption"], "stage_a_patch_accuracy": patch_acc,
                "stage_a_minutes": t_a, "heldout": evaluate(model, tok, held),
                "heldout_images_shuffled": evaluate(model, tok, held, shuffle_seed=1),
                "captions": evaluate_captions(model, tok, [q.scene for q in heldout_set(args.n_captions, seed=4321,
                                                                                         size=size)])}
    ship(run, measure, ("heldout", "heldout_images_shuffled", "captions"))


def build(args):
    """-> (model, processor) from code at ``--image-size`` / ``--patch`` / ``--vision-layers``; projector and language
    model from ``--init-lm-from`` when given."""
    tok = tl.build_tokenizer()
    n_img = (args.image_size // args.patch) ** 2
    proc = tl.build_processor(tok, args.image_size, args.patch)
    cfg = tl.build_config(tok, args.image_size, args.patch, vision_layers=args.vision_layers,
                          max_positions=max(256, 2 ** (n_img + 64).bit_length()))
    model = transformers.LlavaForConditionalGeneration(cfg)
    if args.init_lm_from:
        donor = transformers.LlavaForConditionalGeneration.from_pretrained(args.init_lm_from, dtype=torch.float32)
        if donor.config.text_config.vocab_size != model.config.text_config.vocab_size:
            raise SystemExit(f"--init-lm-from {args.init_lm_from}: its vocabulary differs from this run's")
        keep = {k: v for k, v in donor.state_dict().items() if "vision_tower" not in k}
        missing, unexpected = model.load_state_dict(keep, strict=False)
        if unexpected or any("vision_tower" not in k for k in missing):
            raise SystemExit(f"--init-lm-from {args.init_lm_from}: weights do not match ({missing}, {unexpected})")
    return model, proc

if __name__ == "__main__":
    main()
