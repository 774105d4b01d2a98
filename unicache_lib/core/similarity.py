"""Similarity of attention across steps, heads, layers and samples (pure functions)."""
from __future__ import annotations

import torch


def cosine(a, b, dim: int = -1) -> torch.Tensor:
    """Cosine similarity along ``dim`` (float32); 0 where either side is all zeros."""
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    num = (a * b).sum(dim)
    den = a.norm(dim=dim) * b.norm(dim=dim)
    return torch.where(den > 0, num / den.clamp(min=1e-30), torch.zeros_like(num))


def jaccard(a, b) -> float:
    """|A & B| / |A | B| of two index sets (1.0 for two empty sets)."""
    a, b = set(int(x) for x in a), set(int(x) for x in b)
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
