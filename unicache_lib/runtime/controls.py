"""Control models: the same architecture with parts re-initialised, for chance baselines."""
from __future__ import annotations

import copy

import torch

from ..families import family_of


def untrained_language_model(model, seed: int = 0):
    """A copy of a vision-language model whose language model and projector are re-initialised (the
    vision tower keeps its trained weights): what an attention measure gives without any learned
    text-image binding."""
    fam = family_of(model)
    ctrl = copy.deepcopy(model)
    torch.manual_seed(seed)
    for part in (fam.language_model(ctrl), fam.projector(ctrl), ctrl.lm_head):
        for m in part.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
            if "norm" in type(m).__name__.lower() and getattr(m, "weight", None) is not None:
                # RMSNorm has no reset_parameters; Gemma-style norms scale by (1 + weight), so 0 is their identity
                (torch.nn.init.zeros_ if "gemma" in type(m).__name__.lower() else torch.nn.init.ones_)(m.weight)
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=getattr(ctrl.config.get_text_config(), "initializer_range", 0.02))
                if getattr(m, "bias", None) is not None:
                    torch.nn.init.zeros_(m.bias)
    return ctrl.eval()
