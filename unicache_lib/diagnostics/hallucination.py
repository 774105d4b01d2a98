"""Does the answer's attention cover the image? A per-answer signal for wrong answers (claim U12).

For each question the query that produces the answer (the last prompt position) is read in every
layer: ``coverage`` = its attention mass on image keys, ``concentration`` = 1 - normalised entropy
of that mass over the image keys; means over heads and layers. ``confidence`` = the answer's
softmax probability, the baseline any attention signal must beat.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..capture import AttentionCapture
from ..capture.runner import inputs_for
from ..core.errors import InputError
from ..core.scoring import same_answer
from ..families import family_of
from ..progress import bar


@torch.no_grad()
def answer_attention(model, processor, qas, progress: bool | None = None, layers=None) -> pd.DataFrame:
    """One row per question: qtype, answer, prediction, correct, confidence, coverage, concentration.
    Needs an eager model (attention weights). The layers read are those whose keys include the image
    (a cross-attention VLM: its cross-attention layers); ``layers`` (indices of those layers, e.g. the
    shallow band) averages coverage and concentration over these only (None: all)."""
    tok, part = processor.tokenizer, family_of(model).image_part
    rows = []
    for q in bar(qas, progress, desc="answers"):
        inp = inputs_for(model, processor, q.scene.uint8(), q.question)
        with AttentionCapture(model, "full", part=part) as cap:
            out = model(**inp)
        p = torch.softmax(out.logits[0, -1].float(), -1)
        cov, conc = [], []
        for r in cap.result.select(part=part):
            if layers is not None and r.layer not in layers:
                continue
            img = torch.as_tensor(r.spans.array == 1)  # cross-attention: every key is a vision token
            on = r.probs[:, -1][:, img]  # [H, n_image]: the answer position's reads of the image keys
            mass = on.sum(-1)
            d = on / mass.clamp(min=1e-12)[:, None]
            seen = r.data["visible"][-1][img] if "visible" in r.data else torch.ones(len(on[0]), dtype=torch.bool)
            h = -(torch.special.xlogy(d, d)).sum(-1) / np.log(max(int(seen.sum()), 2))  # over the image keys it sees
            cov.append(mass.mean())
            conc.append((1 - h).mean())
        if not cov:
            raise InputError(f"layers {list(layers)}: none of them is a captured {part!r} layer "
                             f"({sorted({r.layer for r in cap.result.select(part=part)})}); pass indices of those")
        pred = tok.convert_ids_to_tokens(int(p.argmax()))
        rows.append({"qtype": q.qtype, "question": q.question, "answer": q.answer, "prediction": pred,
                     "correct": same_answer(pred, q.answer), "confidence": float(p.max()),
                     "coverage": float(torch.stack(cov).mean()), "concentration": float(torch.stack(conc).mean())})
    return pd.DataFrame(rows)
