"""One evaluation vocabulary (#61): every accuracy compares a predicted token with the expected answer through
``core.scoring.same_answer`` and every answer KL is ``core.scoring.kl_divergence``.

A real checkpoint's tokenizer marks a word's start (SentencePiece, LLaVA-1.5 and Gemma 3: ``"▁Red"``; byte-level BPE:
``"ĠRed"``); the shipped models' tokens are bare words. Here the shipped tiny LLaVA's tokenizer (and a tiny ViLT's
labels) are made to answer SentencePiece-style, ``"▁Red"`` for ``"red"``, and every scoring path of the lessons --
lesson 04's pruning accuracy, lesson 07's right / wrong split, lesson 05's eviction rows, the model cards' held-out
score and lesson 08's fusion-encoder answers -- must score them exactly as it scores the bare words.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from unicache_lib.core.errors import InputError
from unicache_lib.core.scoring import accuracy, correct, kl_divergence, same_answer

MARK = "\u2581"  # SentencePiece's word start


def sentencepiece_style(token):
    """``"red"`` -> ``"▁Red"``: what a SentencePiece checkpoint's first answer token looks like."""
    return None if token is None else MARK + token[:1].upper() + token[1:]


@contextmanager
def marked(tokenizer):
    """Inside the block ``tokenizer.convert_ids_to_tokens`` answers SentencePiece-style (one id or a list)."""
    plain = tokenizer.convert_ids_to_tokens

    def convert(ids, *a, **k):
        out = plain(ids, *a, **k)
        return [sentencepiece_style(t) for t in out] if isinstance(out, list) else sentencepiece_style(out)

    tokenizer.convert_ids_to_tokens = convert
    try:
        yield
    finally:
        del tokenizer.convert_ids_to_tokens  # the class's method again


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny LLaVA (trained: most answers right), eager for the diagnostics' attention, and 8 questions."""
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    model, proc = load_understanding("tiny-llava", attn_implementation="eager")
    return model, proc, heldout_set(8, seed=7)


def test_same_answer_ignores_the_word_mark_and_case_and_nothing_else():
    assert same_answer("\u2581Red", "red") and same_answer("\u0120red", " Red ") and same_answer("red", "red")
    assert same_answer("2", 2) and same_answer("\u2581Yes", "yes")
    assert not same_answer("\u2581blue", "red") and not same_answer("reds", "red") and not same_answer("\u2581", "red")
    ok = correct(["\u2581Red", "blue", "\u0120Left"], ["red", "red", "left"])
    assert ok.dtype == bool and ok.tolist() == [True, False, True]
    assert accuracy(["\u2581Red", "blue", "\u0120Left", "no"], ["red", "red", "left", "yes"]) == 0.5
    with pytest.raises(InputError, match="2 predictions for 3 answers"):
        correct(["red", "blue"], ["red", "blue", "left"])


def test_kl_divergence_is_kl_ref_to_x_in_float32_from_logits_or_log_probs():
    g = torch.Generator().manual_seed(0)
    ref, x = torch.randn(5, 40, generator=g) * 3, torch.randn(5, 40, generator=g) * 3
    r, q = torch.log_softmax(ref, -1), torch.log_softmax(x, -1)
    want = (r.exp() * (r - q)).sum(-1)
    got = kl_divergence(ref, x)
    assert got.shape == (5,) and got.dtype == torch.float32 and (got > 0).all()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(kl_divergence(r, q), want)  # log-probabilities give the same
    assert not torch.allclose(kl_divergence(x, ref), want)  # the direction matters: KL(ref || x)
    assert float(kl_divergence(ref[0], ref[0])) == 0.0
    half = kl_divergence(ref.half(), x.half())
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, kl_divergence(ref.half().float(), x.half().float()))


def test_lesson_04_pruning_accuracy_and_the_model_cards_score_sentencepiece_tokens(tiny):
    from unicache_lib.pruning.evaluate import answer_logprobs, understanding_metrics
    from unicache_lib.world.questions import score_answers

    model, proc, qas = tiny
    lp = answer_logprobs(model, proc, qas)
    plain = understanding_metrics(lp, lp, proc, qas)
    plain_card = score_answers(proc.tokenizer.convert_ids_to_tokens(lp.argmax(-1).tolist()), qas)
    assert plain["accuracy"] > 0.5 and plain_card["accuracy"] == plain["accuracy"]
    with marked(proc.tokenizer):
        pred = proc.tokenizer.convert_ids_to_tokens(lp.argmax(-1).tolist())
        assert all(p.startswith(MARK) for p in pred) and any(p[1:2].isupper() for p in pred)  # "▁Red", not "red"
        got = understanding_metrics(lp, lp, proc, qas)
        card = score_answers(pred, qas)
    assert got["accuracy"] == plain["accuracy"] and np.array_equal(got["correct_q"], plain["correct_q"])
    assert card == plain_card


def test_lesson_07_right_and_wrong_answers_split_the_same_with_sentencepiece_tokens(tiny):
    from unicache_lib.diagnostics.hallucination import answer_attention

    model, proc, qas = tiny
    plain = answer_attention(model, proc, qas[:4], progress=False)
    assert plain.correct.any()
    with marked(proc.tokenizer):
        got = answer_attention(model, proc, qas[:4], progress=False)
    assert got.prediction.str.startswith(MARK).all()
    assert got.correct.tolist() == plain.correct.tolist()


def test_lesson_05_eviction_rows_score_sentencepiece_tokens(tiny):
    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import run_eviction

    model, proc, qas = tiny
    pols = {n: POLICIES[n]() for n in ("full", "key_coverage")}
    plain = run_eviction(model, proc, qas[:2], [0.5], pols, None, 0, progress=False)
    assert plain.correct.any()
    with marked(proc.tokenizer):
        got = run_eviction(model, proc, qas[:2], [0.5], pols, None, 0, progress=False)
    assert got.correct.tolist() == plain.correct.tolist()
    assert np.allclose(got.kl, plain.kl, atol=1e-6)


def test_lesson_08_fusion_encoder_answers_score_sentencepiece_labels(tmp_path):
    """A tiny ViLT whose classifier always says "yes", on questions whose answer is "yes": every answer right,
    whether its labels are bare words or SentencePiece-style."""
    import transformers

    from unicache_lib.analysis.architectures import fusion_correct
    from unicache_lib.families import FAMILIES, Shape
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.questions import heldout_set

    fam, shape = FAMILIES["ViLT"], Shape(layers=2, heads=2, head_dim=8, image_size=32, patch=8)
    tok = fam.tokenizer()
    torch.manual_seed(0)
    getattr(transformers, fam.model_class)(fam.config(tok, shape)).save_pretrained(tmp_path)
    fam.processor(tok, shape).save_pretrained(tmp_path)
    model, proc = load_understanding(str(tmp_path), attn_implementation="eager")
    last = model.classifier[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(-1.0)
        last.bias[model.config.label2id["yes"]] = 1.0
    qas = [q for q in heldout_set(24, seed=3, qtypes=("exists",)) if q.answer == "yes"][:3]
    assert qas
    assert fusion_correct(model, proc, qas).tolist() == [1.0] * len(qas)
    model.config.id2label = {i: sentencepiece_style(a) for i, a in model.config.id2label.items()}
    assert fusion_correct(model, proc, qas).tolist() == [1.0] * len(qas)
