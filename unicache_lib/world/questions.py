"""The held-out evaluation data of the understanding side, beside the synthetic world it is drawn from: the
question types the shipped models were trained on, the fixed held-out question sets every notebook and benchmark
scores on, and scoring of answers and captions."""
from __future__ import annotations

import numpy as np

from ..core.scoring import correct
from .text import caption, make_qa

TRAIN_QTYPES = ("colour", "shape", "position", "exists")


def heldout_set(n=1500, seed=12345, qtypes=TRAIN_QTYPES, size=64):
    """The fixed held-out questions (balanced over ``qtypes`` and the five scene types), scenes rendered at
    ``size`` px."""
    rng = np.random.default_rng(seed)
    return [make_qa(rng, qtypes[i % len(qtypes)], size=size) for i in range(n)]


def scene_size(model, default: int = 64) -> int:
    """The side in pixels at which to render the world's scenes for ``model``: its vision tower's input size when it
    has a fixed one (tiny-llava: 64, tiny-llava-576: 96, LLaVA-1.5: 336), so no image is resized on the way in;
    ``default`` for a tower without one (dynamic-resolution families)."""
    size = getattr(getattr(getattr(model, "config", None), "vision_config", None), "image_size", None)
    return int(size) if isinstance(size, int) and size > 0 else default


def question_images(qas, shuffle_seed=None) -> np.ndarray:
    """``[N, H, W, 3]`` uint8 images of ``qas``, shuffled across questions with ``shuffle_seed`` (the control)."""
    imgs = np.stack([q.scene.uint8() for q in qas])
    if shuffle_seed is not None:
        imgs = imgs[np.random.default_rng(shuffle_seed).permutation(len(imgs))]
    return imgs


def score_answers(pred: list[str], qas) -> dict:
    """Accuracy of predicted answer tokens (:func:`~unicache_lib.core.scoring.same_answer`: word mark and case
    ignored), overall and per question type (every card's ``heldout``)."""
    ok = correct(pred, [q.answer for q in qas])
    per = {t: float(ok[[q.qtype == t for q in qas]].mean()) for t in sorted({q.qtype for q in qas})}
    return {"accuracy": float(ok.mean()), "n": len(qas), "per_type": per}


def score_captions(caps: list[str], scenes) -> dict:
    """Captions against the scenes: exact match, share of objects named (colour and shape), a few examples."""
    named = [f"{o.colour} {o.shape}" in c for c, s in zip(caps, scenes) for o in s.objects]
    return {"exact": float(np.mean([c == caption(s) for c, s in zip(caps, scenes)])),
            "objects_named": float(np.mean(named)), "n": len(scenes),
            "examples": [[caption(s), c] for s, c in list(zip(scenes, caps))[:5]]}
