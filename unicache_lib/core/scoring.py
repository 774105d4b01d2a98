"""How the workbench scores, written once: a predicted answer token against the expected answer, an answer
distribution against a reference's, and when a head counts as focused.

Every accuracy the lessons report (KV eviction, head pruning, the diagnostics' right / wrong split, the model cards'
held-out scores, the fusion encoder's answers) compares through :func:`same_answer`, so a real checkpoint's first
token (``"▁Red"`` from a SentencePiece tokenizer such as LLaVA-1.5's or Gemma 3's, ``"ĠRed"`` from a byte-level BPE
one) scores like the shipped models' bare ``"red"``. Every answer KL is :func:`kl_divergence`.

Nothing here imports torch (a tensor brings its own methods), so :mod:`unicache_lib.claims` reads :data:`FOCUSED`
without loading it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import InputError

if TYPE_CHECKING:  # annotations only
    import torch

WORD_MARKS = "\u2581\u0120 "  # SentencePiece's word start, byte-level BPE's, a plain space
FOCUSED = 0.45  # a head is focused when its rows put more than this on one key, on average (claims U2b, U8)


def same_answer(token: str, answer) -> bool:
    """Whether a predicted answer token is the expected answer: compared without the tokenizer's word-start mark
    (``▁`` / ``Ġ``) and case, so a real checkpoint's ``"▁Red"`` matches ``"red"`` (the shipped models' tokens are
    bare words already). Answers are single words (``samples.as_questions``), so the first answer token decides."""
    return token.lstrip(WORD_MARKS).lower() == str(answer).strip().lower()


def correct(predictions, answers) -> np.ndarray:
    """bool ``[N]``: :func:`same_answer` of each prediction with its answer (for intervals over questions)."""
    predictions, answers = list(predictions), list(answers)
    if len(predictions) != len(answers):
        raise InputError(f"{len(predictions)} predictions for {len(answers)} answers: give one per question")
    return np.array([same_answer(p, a) for p, a in zip(predictions, answers)], dtype=bool)


def accuracy(predictions, answers) -> float:
    """Share of predictions that are their answer (:func:`correct`)."""
    return float(correct(predictions, answers).mean())


def kl_divergence(ref_logits: torch.Tensor, x_logits: torch.Tensor) -> torch.Tensor:
    """KL(ref || x) over the last dimension, in float32: ``[...]`` from two ``[..., vocab]`` tensors of logits (or
    log-probabilities: log-softmax leaves those as they are). The reference is the unchanged model's answer (the
    full cache, the unpruned model, the sample's own image); ``x`` the changed one's."""
    ref, x = ref_logits.float().log_softmax(-1), x_logits.float().log_softmax(-1)
    return (ref.exp() * (ref - x)).sum(-1)
