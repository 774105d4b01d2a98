"""Train the shipped tiny Janus (``JanusForConditionalGeneration``): one language model that answers and
captions images *and* draws them as VQ tokens.

    python -m unicache_lib.zoo.train.janus --out data/models/tiny-janus --seed 0

Stages (each a small model trained here on the synthetic world):

vq. The VQ-VAE (``model.model.vqmodel``, 4x downsampling of the scene at 32 px -> 8 x 8 tokens from a
    128-entry codebook; generated images are 32 px, understanding reads 64 px) as an autoencoder: reconstruction MSE plus the codebook/commitment loss, straight-through
    gradients, codebook rows kept at unit norm (``JanusVQVAE.decode`` looks entries up L2-normalised, so
    encoding and decoding then agree) and unused rows restarted on encoder outputs.
a.  The understanding encoder alone with patch heads (:mod:`unicache_lib.zoo.train.patch_heads`).
b.  Aligner, language model and the generation modules with encoder and VQ-VAE frozen; every step one
    understanding batch (one question or caption per image, loss on the answer) and one generation batch
    (a one-object prompt, loss on its scene's 64 VQ tokens; 10% of prompts blanked to pad tokens as
    ``generate`` does for the unconditional half of classifier-free guidance).

The card records held-out VQA accuracy per question type, the image-shuffle control, captions, the
VQ-VAE's reconstruction (PSNR and the world's checker on reconstructions) and generated images scored by
the world's checker (:func:`unicache_lib.world.segment.score_object`) with guidance, drawn by the workbench's own
guided loop (:func:`generate_images` says why not ``model.generate``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.compat import transformers
from ...capture.unified import generate_image_with_capture, signed_to_uint8
from ...families import FAMILIES
from ...families.base import Shape
from ...world.scenes import make_scene
from ...world.segment import score_object
from ...world.text import make_qa, short_prompt
from .generator import eval_prompts
from .llava import TRAIN_QTYPES, heldout_set, sample_batch
from .loop import Stage, fit, parse, qtype_weights, recipe_parser, ship, start, vqa_options, warmup
from .patch_heads import train_patch_heads
from .vlm import GRID, IMAGE_SIZE, PATCH, encode, evaluate, evaluate_captions

GEN_LAYOUT = "user : {prompt} assistant :"
F = torch.nn.functional


def shape():
    return Shape(layers=4, heads=8, kv_heads=8, head_dim=16, vision_layers=2, vision_heads=4, vision_head_dim=32,
                 image_size=IMAGE_SIZE, patch=PATCH, extra={"vq_levels": 3})


def build(seed: int):
    """-> (model, processor) at the shipped shape, generation config set for ``generate(generation_mode="image")``."""
    fam = FAMILIES["Janus"]
    tok = fam.tokenizer()
    torch.manual_seed(seed)
    model = transformers.JanusForConditionalGeneration(fam.config(tok, shape()))

    # an explicit generation config (one derived from the model config is rebuilt on load, losing boi_token_id)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, guidance_scale=3.0,
        max_length=256, num_return_sequences=1,
        generation_kwargs={"boi_token_id": tok.convert_tokens_to_ids("<begin_of_image>")})
    return model, fam.processor(tok, shape())


VQ_SIZE = 32  # the VQ-VAE works on the scene at half resolution (4x cheaper on 2 CPU cores)


def pixels(processor, images_uint8) -> torch.Tensor:
    return processor.image_processor(list(images_uint8), return_tensors="pt")["pixel_values"]


def vq_pixels(processor, images_uint8) -> torch.Tensor:
    """``[B, 3, 32, 32]``: the processor's pixels averaged 2 x 2, what the VQ-VAE encodes and decodes."""
    return F.avg_pool2d(pixels(processor, images_uint8), IMAGE_SIZE // VQ_SIZE)


def quantize(vq, px):
    """Straight-through quantisation of ``px`` -> (decoded pixels, codebook loss, token ids ``[B, n]``)."""
    q, loss, idx = vq.quantize(vq.quant_conv(vq.encoder(px)))
    return vq.decoder(vq.post_quant_conv(q)), loss, idx.view(px.shape[0], -1)


def train_vq(vq, processor, rng, steps, batch, lr, log) -> dict:
    emb = vq.quantize.embedding.weight
    with torch.no_grad():
        emb.copy_(F.normalize(emb, dim=-1))
    usage = torch.zeros(emb.shape[0])

    now: dict = {}

    def step_loss(step):
        vq.train()
        scenes = [make_qa(rng, qtypes=TRAIN_QTYPES).scene for _ in range(batch)]
        px = vq_pixels(processor, np.stack([s.uint8() for s in scenes]))
        rec, cb_loss, idx = quantize(vq, px)
        now.update(px=px, idx=idx)
        return F.mse_loss(rec, px) + cb_loss, lambda: {"mse": F.mse_loss(rec, px).item(), "codebook_loss": cb_loss.item(),
                                                        "codes_in_use": int((usage > 1e-3).sum())}

    @torch.no_grad()
    def keep_codebook(step):  # on the unit sphere, unused rows restarted on encoder outputs
        px, idx = now["px"], now["idx"]
        emb.copy_(F.normalize(emb, dim=-1))
        usage.mul_(0.99).add_(torch.bincount(idx.flatten(), minlength=emb.shape[0]).float())
        dead = (usage < 1e-3).nonzero().flatten()
        if step % 50 == 0 and step < 0.8 * steps and len(dead):
            h = vq.quant_conv(vq.encoder(px)).permute(0, 2, 3, 1).reshape(-1, emb.shape[1])
            pick = h[torch.from_numpy(rng.choice(len(h), len(dead), replace=len(dead) > len(h)))]
            emb[dead] = F.normalize(pick, dim=-1)
            usage[dead] = 1.0

    fit(Stage("vq", "vq: VQ-VAE", steps, lr, warmup(steps, 100), weight_decay=0.0), list(vq.parameters()), step_loss,
        log, after_step=keep_codebook)
    return log[-1] if log else {}


@torch.no_grad()
def vq_quality(model, processor, n=100, seed=31) -> dict:
    """PSNR of VQ reconstructions (through ``encode`` + ``decode_image_tokens``, as generation decodes) and the
    world's checker on reconstructions of one-object scenes."""
    rng = np.random.default_rng(seed)
    objs = eval_prompts(n, seed=seed)
    imgs = np.stack([make_scene(rng, "single", IMAGE_SIZE, fixed=[o]).uint8() for o in objs])
    vq = model.model.vqmodel.eval()
    px = vq_pixels(processor, imgs)
    rec = signed_to_uint8(model.decode_image_tokens(vq.encode(px).image_tokens.view(len(imgs), -1)))
    mse = ((rec.astype(np.float64) - signed_to_uint8(px.permute(0, 2, 3, 1))) ** 2).mean(axis=(1, 2, 3))
    scores = [score_object(r, o) for r, o in zip(rec, objs)]
    return {"psnr_db": float(np.mean(10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-9)))), "n": n} | {
        k: float(np.mean([s[k] for s in scores])) for k in scores[0]}


def gen_batch(rng, n):
    """``n`` one-object generation items: (prompt, scene)."""
    return [(short_prompt([o]), make_scene(rng, "single", IMAGE_SIZE, fixed=[o]))
            for o in eval_prompts(n, seed=int(rng.integers(1 << 31)))]


def gen_inputs(processor, prompts) -> dict:
    """Prompts for image generation as ``generate(generation_mode="image")`` takes them (``<begin_of_image>`` last)."""
    processor.tokenizer.padding_side = "left"
    return dict(processor(text=[GEN_LAYOUT.format(prompt=p) for p in prompts], generation_mode="image",
                          return_tensors="pt", padding=True))


def generation_loss(model, processor, prompts, codes, blank=0.1, rng=None):
    """Teacher-forced cross-entropy of the VQ tokens ``codes [B, n]`` after ``prompts``."""
    tok = processor.tokenizer
    inp = gen_inputs(processor, prompts)
    ids = inp["input_ids"].clone()
    if blank and rng is not None:  # the unconditional rows of classifier-free guidance: all but <s> and <boi> -> pad
        rows = torch.from_numpy(rng.random(len(ids)) < blank)
        keep = (ids == tok.bos_token_id) | (ids == model.generation_config.generation_kwargs["boi_token_id"])
        ids[rows[:, None] & ~keep] = tok.pad_token_id
    P = ids.shape[1]
    emb = torch.cat([model.get_input_embeddings()(ids), model.prepare_embeddings_for_image_generation(codes[:, :-1])], 1)
    mask = torch.cat([inp["attention_mask"], torch.ones_like(codes[:, :-1])], 1)
    h = model.model.language_model(inputs_embeds=emb, attention_mask=mask,
                                   position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    return F.cross_entropy(model.model.generation_head(h[:, P - 1 :]).flatten(0, 1), codes.flatten())


@torch.no_grad()
def generate_images(model, processor, prompts, guidance=3.0) -> np.ndarray:
    """Greedy, classifier-free-guided drawings -> uint8 images ``[N, 32, 32, 3]``, one prompt at a time through
    :func:`unicache_lib.capture.unified.generate_image_with_capture` (capture off). Not ``model.generate(...,
    generation_mode="image")``: in transformers 5.2 that loop feeds ``<begin_of_image>`` again at every step instead
    of the token just drawn (``prepare_inputs_for_generation`` keeps ``inputs_embeds`` only on a first iteration that
    Janus never marks), so its images do not follow the prompt."""
    model.eval()
    drawn = [generate_image_with_capture(model, gen_inputs(processor, [p])["input_ids"], guidance, capture=False)[0]
             for p in prompts]
    return np.stack([signed_to_uint8(model.decode_image_tokens(t[None].to(next(model.parameters()).device)))[0]
                     for t in drawn])


def evaluate_generation(model, processor, n=100, guidance=3.0) -> dict:
    """Colour / position / shape of ``n`` one-object drawings (greedy, guided) by the world's checker."""
    objs = eval_prompts(n)
    imgs = generate_images(model, processor, [short_prompt([o]) for o in objs], guidance)
    scores = [score_object(im, o) for im, o in zip(imgs, objs)]
    return {k: float(np.mean([s[k] for s in scores])) for k in scores[0]} | {"n": n, "guidance": guidance}


def train_lm(fam, model, processor, rng, steps, batch, lr, log, eval_every=0, eval_qas=None, single_frac=0.08,
             weights=None, exists_negatives="hard"):
    """Stage b. The first ``single_frac`` of the understanding batches use one-object scenes only; ``weights`` and
    ``exists_negatives`` shape the question mix (:func:`unicache_lib.zoo.train.llava.sample_batch`)."""
    m = model.model
    for part in (m.vision_model, m.vqmodel):
        part.requires_grad_(False)
    proj = list(m.aligner.parameters()) + list(m.generation_aligner.parameters())
    rest = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith(
        ("model.aligner", "model.generation_aligner"))]

    def step_loss(step):
        model.train()
        m.vision_model.eval()
        m.vqmodel.eval()
        items = sample_batch(rng, batch, single_only=step < single_frac * steps, weights=weights,
                             exists_negatives=exists_negatives)
        inp, labels = encode(fam, processor, [q for _, q, _ in items], np.stack([qa.scene.uint8() for qa, _, _ in items]),
                             [a for _, _, a in items])
        u_loss = F.cross_entropy(model(**inp).logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        gen = gen_batch(rng, batch)
        with torch.no_grad():
            codes = m.vqmodel.encode(vq_pixels(processor, np.stack([s.uint8() for _, s in gen]))).image_tokens.view(batch, -1)
        g_loss = generation_loss(model, processor, [p for p, _ in gen], codes, rng=rng)
        return u_loss + g_loss, lambda: {"answer_loss": u_loss.item(), "image_loss": g_loss.item()}

    def held_out():
        r = evaluate(fam, model, processor, eval_qas)
        gq = evaluate_generation(model, processor, n=30)
        return {"eval": r, "generation": gq}, f"held-out accuracy {r['accuracy']:.3f} {r['per_type']}; generation {gq}"

    fit(Stage("b", "stage b: understanding + generation", steps, lr, warmup(steps), (0.9, 0.98), eval_every=eval_every),
        [{"params": proj, "lr_scale": 3.0}, {"params": rest, "lr_scale": 1.0}], step_loss, log,
        held_out if eval_qas else None)


def main(argv=None):
    ap = recipe_parser(__doc__, out="data/models/tiny-janus", lr=2e-3,
                       ints={"--steps-vq": 1000, "--batch-vq": 32, "--n-generate": 100})
    vqa_options(ap, steps_b=3000, batch_b=32, weights_help="e.g. colour=3,exists=3 (others 1): skew the question mix",
                curriculum=True)
    args = parse(ap, argv)

    fam = FAMILIES["Janus"]
    run = start(args, fam.model_class, lambda: build(args.seed))
    model, proc, log = run.model, run.processor, run.log
    if args.init_from:
        fam.adapt_processor(proc, model.config)
        model.generation_config = transformers.GenerationConfig.from_pretrained(args.init_from)  # keeps boi_token_id
    if args.steps_vq:
        train_vq(model.model.vqmodel, proc, run.rng, args.steps_vq, args.batch_vq, 1e-3, log)
    vq_min = run.minutes()
    tower = model.model.vision_model
    patch_acc = train_patch_heads(lambda imgs: tower(pixels(proc, imgs)).last_hidden_state, tower.parameters(),
                                  tower.config.hidden_size, GRID, PATCH, run.rng, args.steps_a, args.batch_a, args.lr, log) \
        if args.steps_a else (run.previous or {}).get("stage_a_patch_accuracy", float("nan"))
    a_min = run.minutes() - vq_min
    train_lm(fam, model, proc, run.rng, args.steps_b, args.batch_b, args.lr, log, args.eval_every,
             heldout_set(200, seed=999) if args.eval_every else None,
             single_frac=args.single_frac if args.single_frac is not None else (0.0 if args.init_from else 0.08),
             weights=qtype_weights(args), exists_negatives=args.exists_negatives)
    held = heldout_set(args.n_heldout)

    def measure(model):  # every number on the card is measured on what ships
        fam.adapt_processor(proc, model.config)
        return {
            "prompt": fam.layout, "generation_prompt": GEN_LAYOUT + " <begin_of_image>", "image_size": IMAGE_SIZE,
            "patch": PATCH, "vq_tokens": GRID * GRID, "trained_question_types": list(TRAIN_QTYPES) + ["caption"],
            "recipe": (__doc__ or "").strip().split("\n\n", 2)[2], "vq_minutes": vq_min, "stage_a_minutes": a_min,
            "stage_a_patch_accuracy": patch_acc, "heldout": evaluate(fam, model, proc, held),
            "heldout_images_shuffled": evaluate(fam, model, proc, held, shuffle_seed=1),
            "captions": evaluate_captions(fam, model, proc, [q.scene for q in heldout_set(args.n_captions, seed=4321)]),
            "vq_reconstruction": vq_quality(model, proc), "generation": evaluate_generation(model, proc, args.n_generate)}
    ship(run, measure, ("heldout", "heldout_images_shuffled", "captions", "vq_reconstruction", "generation"),
         model="tiny-janus", family="Janus")

if __name__ == "__main__":
    main()
