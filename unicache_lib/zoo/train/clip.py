"""Train the shipped tiny CLIP (``CLIPModel``, dual towers) contrastively on scenes and their captions.

    python -m unicache_lib.zoo.train.clip --out data/models/tiny-clip --seed 0

One stage: the symmetric contrastive loss over the batch (each scene against the other scenes' captions,
and back), plus the patch heads of :mod:`unicache_lib.zoo.train.patch_heads` on the image tower's last layer
(weight ``--aux``; without them the tower learns colour and misses position). Captions name every object
with its colour, shape and position (``"red circle left , blue square top"``). The card records
text->image recall@1 over 200 held-out scenes (a scene whose caption equals the query's counts as found:
identical captions cannot be told apart) and the control with captions shuffled across scenes.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.compat import transformers
from ...families import FAMILIES
from ...families.base import Shape
from ...world.text import caption, make_qa
from .llava import TRAIN_QTYPES, heldout_set
from .loop import Stage, fit, parse, recipe_parser, ship, start, warmup
from .patch_heads import PatchHeads, patch_labels

IMAGE_SIZE, PATCH = 64, 8
GRID = IMAGE_SIZE // PATCH


def build(seed: int, layers: int = 4, heads: int = 8, head_dim: int = 16):
    """-> (model, processor): CLIP at tiny width; the text tower pools at ``</s>``, which the tokenizer appends."""
    fam = FAMILIES["CLIP"]
    tok = fam.tokenizer()
    shape = Shape(layers=layers, heads=heads, head_dim=head_dim, vision_layers=layers, vision_heads=heads,
                  vision_head_dim=head_dim, image_size=IMAGE_SIZE, patch=PATCH)
    torch.manual_seed(seed)
    return transformers.CLIPModel(fam.config(tok, shape)), fam.processor(tok, shape)


def encode(processor, texts, images_uint8) -> dict:
    return dict(processor(text=list(texts), images=list(images_uint8), return_tensors="pt", padding=True))


@torch.no_grad()
def embed(model, processor, scenes, batch=100) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised ``(image [N, proj], text [N, proj])`` embeddings of scenes and their captions."""
    model.eval()
    im, tx = [], []
    for s in range(0, len(scenes), batch):
        part = scenes[s : s + batch]
        out = model(**encode(processor, [caption(x) for x in part], np.stack([x.uint8() for x in part])))
        im.append(out.image_embeds.float())
        tx.append(out.text_embeds.float())
    return torch.cat(im), torch.cat(tx)


def recall_at_1(model, processor, scenes, shuffle_seed=None) -> dict:
    """Text->image and image->text recall@1; a hit is any item with the same caption as the right one.
    ``shuffle_seed``: the control, captions shuffled across scenes before querying (expect chance,
    ``(1 + mean_duplicate_captions) / n``)."""
    img, txt = embed(model, processor, scenes)
    caps = np.array([caption(s) for s in scenes])
    if shuffle_seed is not None:  # the control: scene i is queried with another scene's caption (chance level)
        txt = txt[np.random.default_rng(shuffle_seed).permutation(len(scenes))]
    sim = txt @ img.T  # [text, image]
    t2i = caps[sim.argmax(1).numpy()] == caps
    i2t = caps[sim.argmax(0).numpy()] == caps
    return {"text_to_image": float(t2i.mean()), "image_to_text": float(i2t.mean()), "n": len(scenes),
            "mean_duplicate_captions": float(np.mean([(caps == c).sum() - 1 for c in caps]))}


def train(model, processor, rng, steps, batch, lr, aux, log, eval_every=0, eval_scenes=None):
    heads = PatchHeads(model.config.vision_config.hidden_size, GRID)
    F = torch.nn.functional

    def step_loss(step):
        model.train()
        scenes = [make_qa(rng, qtypes=TRAIN_QTYPES).scene for _ in range(batch)]
        caps = [caption(s) for s in scenes]
        out = model(**encode(processor, caps, np.stack([s.uint8() for s in scenes])), output_hidden_states=True)
        # scenes with the same caption are positives of each other, not negatives
        same = torch.tensor([[a == b for b in caps] for a in caps], dtype=torch.float32)
        target = same / same.sum(1, keepdim=True)
        lt = out.logits_per_text
        loss = 0.5 * (F.cross_entropy(lt, target) + F.cross_entropy(lt.T, target))
        aux_loss, patch_acc = heads.loss(out.vision_model_output.last_hidden_state[:, 1:],
                                         torch.from_numpy(np.stack([patch_labels(s, PATCH) for s in scenes])))
        return loss + aux * aux_loss, lambda: {
            "loss": loss.item(), "aux_loss": aux_loss.item(),
            "batch_recall": (lt.argmax(1) == torch.arange(batch)).float().mean().item(), "patch_acc": patch_acc}

    def held_out():
        r = recall_at_1(model, processor, eval_scenes)
        return {"eval": r}, f"held-out recall@1 {r}"

    fit(Stage(None, "CLIP: contrastive + patch heads", steps, lr, warmup(steps), (0.9, 0.98), eval_every=eval_every),
        list(model.parameters()) + list(heads.parameters()), step_loss, log, held_out if eval_scenes else None)


def main(argv=None):
    ap = recipe_parser(__doc__, out="data/models/tiny-clip", lr=1e-3,
                       ints={"--steps": 2500, "--batch": 64, "--n-heldout": 200})
    ap.add_argument("--aux", type=float, default=0.5, help="weight of the patch-head loss")
    args = parse(ap, argv)
    run = start(args, "CLIPModel", lambda: build(args.seed))
    train(run.model, run.processor, run.rng, args.steps, args.batch, args.lr, args.aux, run.log, args.eval_every,
          [q.scene for q in heldout_set(200, seed=999)] if args.eval_every else None)
    held = [q.scene for q in heldout_set(args.n_heldout)]
    ship(run, lambda model: {
        "text": "a caption, e.g. 'red circle left , blue square top' (the tokenizer adds <s> and </s>)",
        "image_size": IMAGE_SIZE, "patch": PATCH, "recipe": (__doc__ or "").strip().split("\n\n", 2)[2],
        "heldout_recall": recall_at_1(model, run.processor, held),
        "heldout_recall_captions_shuffled": recall_at_1(model, run.processor, held, shuffle_seed=1)},
        ("heldout_recall", "heldout_recall_captions_shuffled"), model="tiny-clip", family="CLIP")

if __name__ == "__main__":
    main()
