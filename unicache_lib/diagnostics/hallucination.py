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
from tqdm.auto import tqdm

from ..capture.runner import model_inputs


@torch.no_grad()
def answer_attention(model, processor, qas, progress: bool = True) -> pd.DataFrame:
    """One row per question: qtype, answer, prediction, correct, confidence, coverage, concentration.
    Needs an eager model (attention weights)."""
    tok = processor.tokenizer
    tid = model.config.image_token_id
    rows = []
    for q in tqdm(qas, desc="answers", disable=not progress):
        inp = model_inputs(processor, q.scene.uint8(), q.question)
        out = model(**inp, output_attentions=True)
        if out.attentions is None or out.attentions[0] is None:
            raise RuntimeError("attention weights are not returned under sdpa: load with attn_implementation='eager'")
        img = (inp["input_ids"][0] == tid)
        p = torch.softmax(out.logits[0, -1].float(), -1)
        cov, conc = [], []
        for a in out.attentions:
            row = a[0, :, -1].float()  # [H, S]
            on = row[:, img]
            mass = on.sum(-1)
            r = on / mass.clamp(min=1e-12)[:, None]
            h = -(torch.special.xlogy(r, r)).sum(-1) / np.log(on.shape[-1])
            cov.append(mass.mean())
            conc.append((1 - h).mean())
        pred = tok.convert_ids_to_tokens(int(p.argmax()))
        rows.append({"qtype": q.qtype, "question": q.question, "answer": q.answer, "prediction": pred,
                     "correct": pred == q.answer, "confidence": float(p.max()),
                     "coverage": float(torch.stack(cov).mean()), "concentration": float(torch.stack(conc).mean())})
    return pd.DataFrame(rows)
