"""Solutions to the exercises of notebook 07 (diagnostics), on ``tiny-llava``.

Run ``python solutions/07_diagnostics.py [--quick] [--only K]``. For your own model change ``MODEL``.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import sys

import _common  # noqa: F401  (repository root on sys.path)
import numpy as np
import pandas as pd

MODEL = "tiny-llava"
SEED = 0
SAMPLE_SEED = 2024
QTYPES = ("exists", "colour", "exists", "shape", "position")  # the notebook's mix


@functools.lru_cache(maxsize=None)
def _model():
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding(MODEL, attn_implementation="eager")


@functools.lru_cache(maxsize=None)
def _qas(n):
    from unicache_lib.world.questions import heldout_set

    return tuple(heldout_set(n, seed=SEED + 4242, qtypes=QTYPES))


def _accuracy(qas) -> float:
    from unicache_lib.pruning import evaluate as E

    model, processor = _model()
    lp = E.answer_logprobs(model, processor, list(qas))
    return E.understanding_metrics(lp, lp, processor, list(qas))["accuracy"]


def _samples(quick):
    from unicache_lib.world import samples as sample_set

    return sample_set.load(per_type=1 if quick else 4, seed=SAMPLE_SEED)


def _detector(samples):
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.neglect import detect_neglect

    model, processor = _model()
    return detect_neglect(capture_samples(model, processor, samples, progress=False).records)


def exercise_1(quick: bool = False) -> dict:
    """Exercise 1 (★, code to write: the body of ``masked(from_layer)``): mask image attention from layer 1, then
    from layer 3: does accuracy fall with the first cut-off layer?

    :func:`~unicache_lib.diagnostics.broken.mask_image_attention` hides the image keys from text queries in every
    layer from ``from_layer`` on; under it the held-out questions (the notebook's mix) are answered again and the
    neglect detector is run on the standard samples (its first cut-off layer should be ``from_layer``).

    Expected on tiny-llava, measured (1500 questions; quick, 100, in brackets): yes — the earlier the cut-off,
    the lower the accuracy: unmasked 0.987 (0.97), from layer 3 0.903 (0.85), from layer 2 (the notebook's
    variant) 0.859 (0.85), from layer 1 0.328 (0.31), below guessing the "exists" questions right. The image
    content reaches the text positions mainly in layer 1; later layers add a few points. The detector's first
    cut-off layer equals ``from_layer`` every time (caught by construction).
    """
    from unicache_lib.diagnostics.broken import mask_image_attention

    model, _ = _model()
    qas = _qas(100 if quick else 1500)
    samples = _samples(quick)
    rows = [{"masked from": "none", "accuracy": _accuracy(qas), "first cut-off layer": _detector(samples).first_cutoff_layer}]
    for from_layer in (1, 2, 3):  # the starter's masked(from_layer), once per layer
        with mask_image_attention(model, from_layer):
            rows.append({"masked from": from_layer, "accuracy": _accuracy(qas), "first cut-off layer": _detector(samples).first_cutoff_layer})
    t = pd.DataFrame(rows).set_index("masked from")
    return {"questions": len(qas), "table": "\n" + t.round(3).to_string(), "_t": t}


def exercise_2(quick: bool = False) -> dict:
    """Exercise 2 (★★, code to write: the body of ``coverage_auroc(layers)``): swap coverage for the *shallow*
    layers' coverage only. Does the AUROC change, and in which
    direction? Report it with its stratified interval.

    :func:`~unicache_lib.diagnostics.hallucination.answer_attention` takes ``layers=`` (here the shallow band of
    :func:`~unicache_lib.analysis.layers.band_layers`, layer 0 on 4 layers); the AUROC of low coverage for wrong
    answers is compared with the all-layer coverage's and with the confidence baseline, each with a 95% interval
    that resamples wrong and right answers apart and its direction named
    (:func:`~unicache_lib.diagnostics.roc.auroc_table`).

    Expected on tiny-llava, measured (1500 questions, 20 wrong; quick: 200, 4 wrong): all-layer coverage is
    *inverted* — AUROC 0.31 [0.23, 0.39] in the claim's direction, i.e. wrong answers read the image more, strength
    0.69, the interval wholly below 0.5; shallow-only coverage sits at chance (0.49 [0.38, 0.60], across 0.5). Confidence
    (0.95 [0.94, 0.97]) stays far ahead of both. With 20 wrong answers (18 of them "yes" to an absent object) the intervals
    are about ±0.1 wide: enough to rule out a 0.7 detector in the claim's direction, not to say how coverage
    behaves on other kinds of error. The quick run (4 wrong) gives 0.46 / 0.65 / 0.92 with intervals too wide
    to read a direction.
    """
    from unicache_lib.analysis.layers import band_layers
    from unicache_lib.diagnostics.hallucination import answer_attention
    from unicache_lib.diagnostics.roc import auroc_table

    model, processor = _model()
    qas = list(_qas(200 if quick else 1500))
    n_layers = model.config.get_text_config().num_hidden_layers
    shallow = band_layers(n_layers)["shallow"]
    every = answer_attention(model, processor, qas, progress=False)
    # the starter's coverage_auroc(layers), on its questions [qas[i] for i in pick] and §1's answers to them (sub):
    #     low = answer_attention(model, processor, [qas[i] for i in pick], progress=False, layers=layers)
    #     return auroc(-low.coverage.to_numpy(), ~sub.correct.to_numpy())
    layers = shallow  # the starter asks it of the shallow band
    low = answer_attention(model, processor, qas, progress=False, layers=layers)
    wrong = ~every.correct
    t = auroc_table({"coverage, all layers": -every.coverage, f"coverage, shallow layers {shallow}": -low.coverage,
                     "confidence (baseline)": -every.confidence}, wrong)
    return {"wrong answers": int(wrong.sum()), "of": len(qas), "AUROC": "\n" + t.round(3).to_string(),
            "_auroc": t.auroc.to_dict(), "_table": t}


def exercise_3(quick: bool = False) -> dict:
    """Exercise 3 (★★, code to write: the body of ``shuffle_images(samples, offset)``): add another broken variant — images shuffled across samples — and predict the detector's
    verdict first. Is it a modality cut-off at all?

    Prediction: the detector stays quiet. It measures how much the text *reads* the image tokens, and a
    shuffled image is read as much as the right one. The variant is built from the standard samples, each given
    the next sample's picture; besides the detector, the answers are scored (held-out questions answered about
    another question's scene) and :func:`~unicache_lib.diagnostics.neglect.image_dependence` is measured.

    Expected on tiny-llava, measured (20 samples, 1500 questions; quick in brackets): the prediction holds — the
    detector does not fire (lowest-layer share 0.398 against the healthy 0.394; quick 0.477 / 0.470), image
    dependence stays as high as the healthy model's (KL 6.3 vs 5.9; quick 11.7 vs 12.2), and accuracy falls
    from 0.987 to 0.321 (quick 0.97 -> 0.32). It is not a modality cut-off: the model uses the image fully — the
    wrong one. Neither an attention share nor image dependence can tell; only the answers can.
    """
    from unicache_lib.diagnostics.neglect import image_dependence

    model, processor = _model()
    samples = _samples(quick)
    offset = 1
    shuffled = shuffle_images(samples, offset)
    qas = _qas(100 if quick else 1500)
    moved = tuple(dataclasses.replace(q, scene=qas[(i + offset) % len(qas)].scene) for i, q in enumerate(qas))
    rows = {}
    for name, ss, qq in (("healthy", samples, qas), ("shuffled images", shuffled, moved)):
        v = _detector(ss)
        rows[name] = {"fires": v.fires, "lowest layer share": float(v.shares.min()),
                      "image dependence (KL)": image_dependence(model, processor, ss, SEED), "accuracy": _accuracy(qq)}
    t = pd.DataFrame(rows).T
    return {"table": "\n" + t.to_string(float_format=lambda x: f"{x:.3f}"), "_t": t}


def _random_llava():
    """A random-weight LLaVA-family stand-in (3 layers, 4 heads, grouped-query attention), built once in a temp folder."""
    import tempfile
    from pathlib import Path

    import torch
    from transformers import LlavaForConditionalGeneration

    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.zoo import tiny_llava as tl

    d = Path(tempfile.gettempdir()) / "unicache-solutions-06" / "random-llava"
    if not (d / "config.json").exists():
        tok = tl.build_tokenizer()
        torch.manual_seed(SEED)
        LlavaForConditionalGeneration(tl.build_config(tok, lm_layers=3, lm_heads=4, kv_heads=2)).save_pretrained(d)
        tl.build_processor(tok).save_pretrained(d)
    return d, load_understanding(str(d), attn_implementation="eager", verify=False)


def shuffle_images(samples, offset):
    """The starter's function: copies of the samples, sample i showing the image of sample (i + offset) % n."""
    shuffled = [copy.copy(s) for s in samples]
    for i, s in enumerate(shuffled):
        s.image = samples[(i + offset) % len(samples)].image
    return shuffled


def next_steps(quick: bool = False) -> dict:
    """The lesson's "Next steps" checkpoint (not an exercise: a run of the whole lesson): run the notebook on your model and compare with the shipped one:
    the healthy lowest share against 5%, the blank image's image dependence against the healthy one, and the
    coverage AUROC — its direction and whether its interval excludes 0.5. How many wrong answers, and is that
    enough to decide U12?

    The notebook's calls with ``MODEL`` set to a checkpoint (papermill: ``-p MODEL /path/to/llava``); here on a
    random-weight stand-in of the LLaVA family (3 layers, 4 heads, grouped-query attention): the neglect detector
    and image dependence on the standard samples (healthy and blank image), then ``answer_attention`` on held-out
    questions and :func:`~unicache_lib.diagnostics.roc.auroc_interval` on its wrong answers.

    Expected on the stand-in: everything runs on another architecture; the detector is quiet (the random model's
    attention is spread over the 64 image positions, so the image share of the text queries' reads is high, not
    under 5%); image dependence is small for both the healthy and the blank input (random weights barely use the
    picture, so it cannot tell them apart); and the model answers (almost) nothing right, so the AUROC is refused
    with an error that names the fix ("at least 2 of each ... raise N_QUESTIONS") — raising N does not help a
    model that is never right: U12 needs a checkpoint with both right and wrong answers.
    """
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.broken import blank_image
    from unicache_lib.diagnostics.hallucination import answer_attention
    from unicache_lib.diagnostics.neglect import detect_neglect, image_dependence
    from unicache_lib.diagnostics.roc import auroc_interval, read_auroc
    from unicache_lib.world.questions import heldout_set

    d, (model, processor) = _random_llava()
    checkpoint = str(d)  # here a stand-in folder; yours is your model's path or hub id
    samples = _samples(quick)
    blank = [copy.copy(s) for s in samples]
    for s in blank:
        s.image = blank_image(s.image)
    rows = {}
    for name, ss in (("healthy", samples), ("blank image", blank)):
        v = detect_neglect(capture_samples(model, processor, ss, progress=False).records)
        rows[name] = {"fires": v.fires, "lowest share": float(v.shares.min()),
                      "image dependence (KL)": image_dependence(model, processor, ss, SEED)}
    A = answer_attention(model, processor, heldout_set(20 if quick else 200, seed=SEED + 4242, qtypes=QTYPES), progress=False)
    wrong = ~A.correct.to_numpy()
    try:
        iv = auroc_interval(-A.coverage.to_numpy(), wrong)
        u12 = f"coverage AUROC {iv} ({read_auroc(iv)})"
    except ValueError as e:
        u12 = f"refused: {e}"
    t = pd.DataFrame(rows).T
    return {"stand-in": str(d), "detector": "\n" + t.to_string(float_format=lambda x: f"{x:.3f}"),
            "wrong answers": f"{int(wrong.sum())} of {len(A)}", "U12": u12, "_t": t, "_wrong": int(wrong.sum()), "_n": len(A)}


if __name__ == "__main__":
    _common.run_all(sys.modules[__name__], _common.parse(__doc__))
