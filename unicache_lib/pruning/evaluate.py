"""Measure what pruning does: task accuracy and answer KL for the understanding model, image
quality and prompt following for the generators. Always against the unpruned model's own outputs."""
from __future__ import annotations

import numpy as np
import torch

from ..quality import psnr, ssim
from ..world.segment import score_object


@torch.no_grad()
def answer_logprobs(model, processor, qas, batch: int = 100) -> torch.Tensor:
    """``[N, vocab]`` log-probabilities of the first answer token for world questions."""
    from ..capture.runner import answer_logits

    imgs = np.stack([q.scene.uint8() for q in qas])
    return torch.log_softmax(answer_logits(model, processor, [q.question for q in qas], imgs, batch), -1)


def understanding_metrics(logp: torch.Tensor, ref_logp: torch.Tensor, processor, qas) -> dict:
    """Exact-match accuracy, agreement with the reference answers and mean KL(ref || this); per
    question in ``correct_q`` (bool ``[N]``, for intervals over questions)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    pred = tokenizer.convert_ids_to_tokens(logp.argmax(-1).tolist())
    ok = np.array([p == q.answer for p, q in zip(pred, qas)])
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    return {"accuracy": float(ok.mean()), "agreement": float((logp.argmax(-1) == ref_logp.argmax(-1)).float().mean()),
            "kl": float(kl.mean()), "n": len(qas), "correct_q": ok}


def generation_metrics(images: np.ndarray, reference: np.ndarray, objects: list[dict]) -> dict:
    """PSNR / SSIM vs the reference images and colour / position / shape following rates
    (``objects``: the one object each single-object prompt asks for)."""
    p = psnr(images, reference)
    scores = [score_object(im, o) for im, o in zip(images, objects)]
    return {"psnr": float(np.mean(np.minimum(p, 100.0))), "ssim": float(np.mean(ssim(images, reference))),
            **{k: float(np.mean([s[k] for s in scores])) for k in ("colour", "position", "shape")}, "n": len(images)}


def understanding_loss_fns(model, processor, qas, batch: int = 32) -> list:
    """Closures: cross-entropy of the answer token on batches of ``qas`` (for the gradient scorer)."""
    from ..capture.runner import answer_logits

    fns = []
    for s in range(0, len(qas), batch):
        chunk = qas[s : s + batch]
        ids = torch.tensor(processor.tokenizer.convert_tokens_to_ids([q.answer for q in chunk]))
        imgs = np.stack([q.scene.uint8() for q in chunk])
        qs = [q.question for q in chunk]
        fns.append(lambda qs=qs, imgs=imgs, ids=ids: torch.nn.functional.cross_entropy(
            answer_logits(model, processor, qs, imgs, batch=len(qs)), ids.to(next(model.parameters()).device)))
    return fns


def generation_loss_fns(gen, n_batches: int = 4, batch: int = 16, seed: int = 0) -> list:
    """Closures: the rectified-flow training loss on fixed synthetic batches (gradient scorer)."""
    from ..zoo import tiny_generators as tg
    from ..zoo.train_generator import training_example

    rng = np.random.default_rng(seed)
    fns = []
    for _ in range(n_batches):
        ex = [training_example(rng) for _ in range(batch)]
        x0 = torch.from_numpy(np.stack([sc.image for sc, _ in ex])).permute(0, 3, 1, 2).float() * 2 - 1
        sigma = torch.sigmoid(torch.from_numpy(rng.normal(0, 1, batch)).float())
        noise = torch.from_numpy(rng.standard_normal(x0.shape)).float()
        xt = (1 - sigma[:, None, None, None]) * x0 + sigma[:, None, None, None] * noise
        prompts = [p for _, p in ex]

        def fn(xt=xt, sigma=sigma, noise=noise, x0=x0, prompts=prompts):
            with torch.no_grad():
                cond = tg.encode_prompts(gen.text_encoder, gen.tokenizer, prompts)
            v = tg.transformer_forward(gen.transformer, gen.family, xt, sigma * 1000, cond)
            return torch.nn.functional.mse_loss(v.float(), noise - x0)
        fns.append(fn)
    return fns


def sweep_understanding(model, processor, space, scores: dict, fractions, qas, ref_logp=None, progress=True):
    """Accuracy / agreement / KL for every (scorer, fraction). ``scores``: label -> ``[units, heads]``.
    Returns a tidy DataFrame with one row per (label, fraction); ``correct_q`` holds the per-question
    outcomes (bool ``[N]``)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..inputs import check_fractions
    from .heads import HeadMask

    check_fractions(fractions, "fraction", upper_inclusive=False, meaning="of the heads pruned")  # before the reference runs
    fractions = list(fractions)
    ref = answer_logprobs(model, processor, qas) if ref_logp is None else ref_logp
    rows = []
    for label, s in tqdm(scores.items(), desc="pruning sweep", disable=not progress):
        for f in fractions:
            keep = space.keep_mask(s, f)
            if f == 0:  # nothing pruned: the reference itself
                lp = ref
            else:
                with HeadMask(space, keep):
                    lp = answer_logprobs(model, processor, qas)
            rows.append({"scorer": label, "fraction": f, "pruned": int((keep[:, :] == 0).sum()),
                         **understanding_metrics(lp, ref, processor, qas)})
    return pd.DataFrame(rows)


def sweep_generation(gen, space, scores: dict, fractions, prompts, objects, steps=20, guidance=3.0, seed=0,
                     progress=True):
    """PSNR / SSIM vs the unpruned images and prompt following for every (scorer, fraction)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..inputs import check_fractions
    from ..zoo.sampling import sample, to_uint8
    from .heads import HeadMask

    check_fractions(fractions, "fraction", upper_inclusive=False, meaning="of the heads pruned")  # before the reference runs
    fractions = list(fractions)
    ref = to_uint8(sample(gen, prompts, steps, guidance, seed=seed))
    rows = []
    for label, s in tqdm(scores.items(), desc="pruning sweep", disable=not progress):
        for f in fractions:
            keep = space.keep_mask(s, f)
            with HeadMask(space, keep):
                imgs = ref if f == 0 else to_uint8(sample(gen, prompts, steps, guidance, seed=seed))
            rows.append({"scorer": label, "fraction": f, "pruned": int((keep == 0).sum()),
                         **generation_metrics(imgs, ref, objects)})
    return pd.DataFrame(rows), ref
