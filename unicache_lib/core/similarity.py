"""Similarity of attention across steps, heads, layers and samples (pure functions)."""
import torch


def cosine(a, b, dim: int = -1) -> torch.Tensor:
    """Cosine similarity along ``dim`` (float32); 0 where either side is all zeros."""
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    return _ratio((a * b).sum(dim), a.norm(dim=dim) * b.norm(dim=dim))


def cosine_from_sums(ab: torch.Tensor, aa: torch.Tensor, bb: torch.Tensor) -> torch.Tensor:
    """The same cosine from accumulated sums ``Σab``, ``Σa²``, ``Σb²`` (a map streamed in row chunks is never whole)."""
    return _ratio(ab, (aa * bb).sqrt())


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-30), torch.zeros_like(num))


def jaccard(a, b) -> float:
    """|A & B| / |A | B| of two index sets (1.0 for two empty sets)."""
    a, b = set(int(x) for x in a), set(int(x) for x in b)
    return len(a & b) / len(a | b) if a or b else 1.0
