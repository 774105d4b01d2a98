"""How a training script ships its model: fp16 weights and the processor saved with ``save_pretrained``, then
reloaded in float32 through ``from_pretrained`` so every number on the card is measured on what ships."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.compat import transformers


def save_and_reload(model, processor, out: str | Path):
    """Save ``model`` (as float16) and ``processor`` under ``out``; returns the reloaded float32 model."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out)
    processor.save_pretrained(out)
    return type(model).from_pretrained(out, dtype=torch.float32)


def load_previous(init_from: str | Path, model_class: str):
    """``(model float32, processor, previous card)`` of a checkpoint a second schedule continues from."""

    model = getattr(transformers, model_class).from_pretrained(init_from, dtype=torch.float32)
    card = Path(init_from) / "model_card.json"
    return (model, transformers.AutoProcessor.from_pretrained(init_from),
            json.loads(card.read_text()) if card.exists() else None)
