"""Solutions to the exercises of notebook 00 (the primer), on the shipped ``tiny-llava``.

Run ``python solutions/00_primer.py [--quick] [--only K]``. Change ``MODEL`` for your own model.
"""
from __future__ import annotations

import functools
import sys

import _common  # noqa: F401  (repository root on sys.path)
import numpy as np

MODEL = "tiny-llava"
SHORT = "where is the red circle ?"
LONG = "is there a blue square ? what color is the circle ?"
SAMPLE_SEED = 2024


@functools.lru_cache(maxsize=None)
def _model(name=MODEL):
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding(name, attn_implementation="eager")


def _maps(sentence: str) -> dict:
    """layer -> ``[heads, S, S]`` float32 maps of one sentence (text only)."""
    import torch

    from unicache_lib.capture import AttentionCapture

    model, processor = _model()
    enc = processor.tokenizer(sentence, return_tensors="pt")
    with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
        model(input_ids=enc["input_ids"])
    return {r.layer: r.probs.float() for r in cap.result}


def exercise_1(quick: bool = False) -> dict:
    """Exercise 1 (★), the starter's ``sink_ratio(P)`` (its body to write): per layer, over all heads, how many times
    the uniform share do the rows after the first put on the first token of a longer sentence? Is the first token a sink on a plain sentence?

    Both sentences are captured; for every row after the first (row 0 can only read itself), the weight on the first
    token, averaged over rows and heads, per layer, beside the uniform share ``1 / (keys visible)`` averaged the same
    way.

    Expected on tiny-llava, measured: only mildly, and not everywhere. On the 7-token sentence every layer gives the
    first token about its uniform share (0.23-0.29 against 0.27: 0.9-1.1x). On the 13-token one layers 0, 2 and 3 give
    it 1.3-1.5x uniform (0.24-0.28 against 0.18) and layer 1 less than uniform (0.12). A sink grows with the text in
    some layers, but no layer passes 2x uniform over all heads: §2's sink is one head's; notebook 02 measures
    it where it matters, on image prompts.
    """

    out, ratios = {}, {}
    for name, sentence in (("short", SHORT), ("long", LONG)):
        maps = _maps(sentence)
        S = maps[0].shape[-1]
        uniform = float(np.mean([1 / (i + 1) for i in range(1, S)]))  # mean over rows 1..S-1 of 1 / (keys visible)
        out[name] = {"tokens": S, "uniform": round(uniform, 3),
                     **{f"layer {li}": round(P[:, 1:, 0].mean().item(), 3) for li, P in sorted(maps.items())}}
        ratios[name] = [round(sink_ratio(P), 2) for _, P in sorted(maps.items())]  # the starter's function
    return {"weight on the first token, rows after the first, mean over heads": out,
            "x uniform per layer (the starter's `sink_ratio`)": ratios, "_out": out}


def sink_ratio(P) -> float:
    """The starter's function: ``P`` one layer's maps ``[heads, S, S]``; the mean weight rows 1..S-1 put on key 0,
    over rows and heads, divided by the uniform share (1 / keys visible, averaged over the same rows)."""
    S = P.shape[-1]
    return P[:, 1:, 0].float().mean().item() / float(np.mean([1 / (i + 1) for i in range(1, S)]))


def exercise_2(quick: bool = False) -> dict:
    """Exercise 2 (★★), the starter's expression ``per_head`` (code to write): for the sample of §4, which head of the last layer puts the most of the content word's weight
    on the image?

    The notebook's sample and content word (``content_position``) are captured again; per head of the last layer, the
    word's weight summed over the image keys.

    Expected on tiny-llava, measured: the heads differ widely — from 0.40 (head 5) to 0.99 (head 3) of the word's weight
    on the 64 image keys, with a mean over heads of 0.83: six heads read almost only the picture (0.83-0.99), two split
    their weight with the question's own words (0.40, 0.56).
    """
    import torch

    from unicache_lib.analysis.token_classes import content_position
    from unicache_lib.capture import AttentionCapture
    from unicache_lib.capture.runner import inputs_for
    from unicache_lib.world import samples as sample_set

    model, processor = _model()
    s = sample_set.load(per_type=1, seed=SAMPLE_SEED)[0]
    inputs = inputs_for(model, processor, s.image, s.question)
    toks = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
        model(**inputs)
    r = cap.result[-1]
    word = content_position(toks, r.spans.text_index)
    per_head = r.probs[:, word, r.spans.image_index].float().sum(-1).numpy()  # the starter's expression
    return {"word": toks[word], "layer": r.layer, "per head": np.round(per_head, 3).tolist(),
            "most image-reading head": int(per_head.argmax()), "mean over heads": round(float(per_head.mean()), 3),
            "_per_head": per_head}


if __name__ == "__main__":
    _common.run_all(sys.modules[__name__], _common.parse(__doc__))
