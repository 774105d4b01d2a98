"""Greedy decoding with attention captured at every step (claim U6: does the image share of a
generated token rise while it names image content?).

The prompt is run once, then one token at a time against the KV cache; each step is recorded as
sample ``"{sample_id}/t{k}"`` (``k = 0`` is the prompt) with spans covering the whole cached
sequence, so a step's single query row is split into image and text keys correctly.
"""
from __future__ import annotations

import torch

from ..core.errors import UnknownNameError
from ..core.modality import TEXT, Spans
from ..families import family_of
from .record import CaptureResult
from .runner import inputs_for
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
    fam = family_of(model)
    inputs = inputs_for(model, processor, image, question)
    kinds = list(fam.spans(model.config, inputs["input_ids"], inputs).kinds)
    positions = fam.position_ids(model, inputs["input_ids"], inputs)
    generated: list[int] = []
    step_kw = {k: v for k, v in inputs.items() if k in fam.token_fields and k != "token_type_ids"}
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
            n = len(kinds)
            extra = {}
            if positions is not None:  # M-RoPE: continue from the largest position so far
                extra["position_ids"] = fam.text_positions(positions, n - 1, 1, positions.device)
                positions = torch.cat([positions, extra["position_ids"]], -1)
            # per-token inputs (Mllama's cross mask): the new row repeats the last
            step_kw = {key: torch.cat([v, v[:, -1:]], 1) for key, v in step_kw.items()}
            extra.update(step_kw)
            dev = inputs["input_ids"].device
            out = model(input_ids=torch.tensor([[nxt]], device=dev), attention_mask=torch.ones(1, n, dtype=torch.long, device=dev),
                        cache_position=torch.tensor([n - 1], device=dev),  # Mllama slices its cross mask with it
                        past_key_values=out.past_key_values, use_cache=True, **extra)
    return tok.convert_ids_to_tokens(generated), CaptureResult.from_records(cap.result.records)


def producing_rows(result: CaptureResult, sample_id: str, n_tokens: int, layer: int, name: str = "image_share",
                   part: str | None = None):
    """``[n_tokens, H]``: statistic ``name`` of the query row that produced each generated token
    (``part``: ``"cross"`` for a cross-attention layer; default: the record of that layer)."""
    rows = []
    for k in range(n_tokens):
        found = result.select(f"{sample_id}/t{k}", layer, part)
        if not found:
            raise UnknownNameError(f"no record for {sample_id}/t{k}, layer {layer}, part {part!r}")
        rows.append(found[0].data[name][:, -1])
    return torch.stack(rows)
