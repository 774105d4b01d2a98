"""Greedy decoding with attention captured at every step (claim U6: does the image share of a
generated token rise while it names image content?).

The prompt is run once, then one token at a time against the KV cache; each step is recorded as
sample ``"{sample_id}/t{k}"`` (``k = 0`` is the prompt) with spans covering the whole cached
sequence, so a step's single query row is split into image and text keys correctly.
"""
from __future__ import annotations

import torch

from ..modality import TEXT, Spans
from .record import CaptureResult
from .runner import model_inputs, spans_fn
from .vlm import AttentionCapture


@torch.no_grad()
def decode_with_capture(model, processor, image, question: str, sample_id: str = "0", max_new_tokens: int = 16,
                        mode: str = "stats", layers=None) -> tuple[list[str], CaptureResult]:
    """Greedy-decode an answer and capture every step.

    Returns:
        ``(tokens, result)``: the generated token strings (without the end token) and one record
        per forward and layer: ``"{sample_id}/t0"`` is the prompt, ``"{sample_id}/t{k}"`` the forward
        whose single query is generated token ``k``. The attention that *produced* token ``k`` is the
        last query row of forward ``t{k-1}`` (use :func:`producing_rows`).
    """
    tok = processor.tokenizer
    inputs = model_inputs(processor, image, question, next(model.parameters()).device)
    kinds = list(spans_fn(model)(inputs["input_ids"]).kinds)
    result = CaptureResult()
    generated: list[int] = []
    with AttentionCapture(model, mode, layers=layers, spans=Spans(tuple(kinds)), sample_ids=[f"{sample_id}/t0"]) as cap:
        out = model(**inputs, use_cache=True)
        for k in range(1, max_new_tokens + 1):
            nxt = int(out.logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            generated.append(nxt)
            kinds.append(TEXT)
            cap.spans = Spans(tuple(kinds))
            cap.sample_ids = iter([f"{sample_id}/t{k}"])
            out = model(input_ids=torch.tensor([[nxt]], device=inputs["input_ids"].device),
                        past_key_values=out.past_key_values, use_cache=True)
    result.records = cap.result.records
    return tok.convert_ids_to_tokens(generated), result


def producing_rows(result: CaptureResult, sample_id: str, n_tokens: int, layer: int, name: str = "image_share"):
    """``[n_tokens, H]``: statistic ``name`` of the query row that produced each generated token."""
    rows = [result[f"{sample_id}/t{k}", layer].data[name][:, -1] for k in range(n_tokens)]
    return torch.stack(rows)
