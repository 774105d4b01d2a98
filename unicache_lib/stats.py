"""Attention statistics: tensors in, tensors out, always in float32.

Every function takes attention probabilities ``P`` of shape ``[..., Sq, Sk]`` (rows sum to 1; the
leading dims are usually ``[heads]`` or ``[batch, heads]``) and casts them to float32 first, so fp16
or bf16 weights give the same statistics as an fp32 reference (claim M1).

Causal maps: when ``Sq < Sk`` the queries are taken to be the *last* ``Sq`` positions (a decode
step or a strided capture says so through ``query_positions``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .modality import BLOCKS, IMAGE, TEXT, Spans


class AttentionValueError(ValueError):
    """Attention weights that are not probabilities (NaN / inf / negative)."""


def as_probs(P: torch.Tensor, check: bool = True) -> torch.Tensor:
    """``P`` as float32; with ``check``, NaN or inf values raise :class:`AttentionValueError`."""
    P = torch.as_tensor(P).float()
    if check and not torch.isfinite(P).all():
        n = int((~torch.isfinite(P)).sum())
        raise AttentionValueError(
            f"attention weights contain {n} NaN/inf values: the forward overflowed (fp16?) or a mask "
            f"row is fully masked; rerun in float32 or bfloat16"
        )
    return P


def _query_positions(P: torch.Tensor, query_positions=None) -> torch.Tensor:
    sq, sk = P.shape[-2], P.shape[-1]
    if query_positions is None:
        return torch.arange(sk - sq, sk, device=P.device)
    return torch.as_tensor(query_positions, device=P.device)


def visible_keys(P: torch.Tensor, causal: bool = True, query_positions=None) -> torch.Tensor:
    """``[Sq]`` number of keys each query row can see (``Sk`` for non-causal maps)."""
    sk = P.shape[-1]
    if not causal:
        return torch.full((P.shape[-2],), sk, device=P.device)
    return _query_positions(P, query_positions) + 1


def row_entropy(P: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each row in nats: ``[..., Sq]``; zero probabilities contribute 0."""
    P = as_probs(P)
    return -torch.special.xlogy(P, P).sum(-1)


def normalised_entropy(P: torch.Tensor, causal: bool = True, query_positions=None,
                       entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Row entropy divided by ``log(#visible keys)``: ``[..., Sq]`` in [0, 1]; 1 = uniform over what the
    row can see. Rows that see a single key have no spread to measure and give NaN."""
    n = visible_keys(P, causal, query_positions).float()
    h = row_entropy(P) if entropy is None else entropy
    denom = torch.log(n)
    return torch.where(n > 1, h / denom.clamp(min=1e-12), torch.full_like(h, float("nan")))


def max_weight(P: torch.Tensor) -> torch.Tensor:
    """Largest weight of each row: ``[..., Sq]``."""
    return as_probs(P).amax(-1)


def diagonal_concentration(P: torch.Tensor, width: int = 0, query_positions=None) -> torch.Tensor:
    """Mean mass within ``width`` positions of the diagonal (``|q - k| <= width``): ``[...]``."""
    P = as_probs(P)
    q = _query_positions(P, query_positions)
    if width == 0:  # a gather, no S^2 temporary
        return P[..., torch.arange(P.shape[-2], device=P.device), q].mean(-1)
    k = torch.arange(P.shape[-1], device=P.device)
    band = ((q[:, None] - k[None, :]).abs() <= width).float()
    return (P * band).sum(-1).mean(-1)


def mean_attention_distance(P: torch.Tensor, query_positions=None, causal: bool = False) -> torch.Tensor:
    """Expected ``|q - k|`` under each row, averaged over rows: ``[...]`` (in positions).

    With ``causal`` (keys never after the query) this is ``q - E[k]``, one matrix-vector product.
    """
    P = as_probs(P)
    q = _query_positions(P, query_positions).float()
    k = torch.arange(P.shape[-1], device=P.device, dtype=torch.float32)
    if causal:
        return (q * P.sum(-1) - P @ k).mean(-1)
    d = (q[:, None] - k[None, :]).abs()
    return (P * d).sum(-1).mean(-1)


def head_variance(P: torch.Tensor, causal: bool = True, query_positions=None) -> torch.Tensor:
    """Per-head variance of the weights over each row's visible keys, averaged over rows: ``[...]``.
    Near 0 means near-uniform rows (the study's 'low variance' pruning signal)."""
    P = as_probs(P)
    n = visible_keys(P, causal, query_positions).float()
    # rows sum to 1 over their n visible keys (mean 1/n), so var = sum(p^2)/n - 1/n^2
    sumsq = torch.linalg.vector_norm(P, dim=-1) ** 2
    return (sumsq / n - 1.0 / n**2).mean(-1)


def read_frequency(P: torch.Tensor, normalise: bool = False, causal: bool = True, query_positions=None) -> torch.Tensor:
    """How much each key is read: column sums over query rows, ``[..., Sk]``.

    Un-normalised, the result sums to the number of query rows. With ``normalise`` each column is
    divided by how many queries could see that key (under a causal mask early keys are visible to
    more queries, which otherwise inflates them).
    """
    P = as_probs(P)
    col = P.sum(-2)
    if not normalise:
        return col
    return col / queries_seeing(P, causal, query_positions)


def queries_seeing(P: torch.Tensor, causal: bool = True, query_positions=None) -> torch.Tensor:
    """``[Sk]`` how many query rows can see each key."""
    q = _query_positions(P, query_positions)
    k = torch.arange(P.shape[-1], device=P.device)
    if not causal:
        return torch.full((P.shape[-1],), float(P.shape[-2]), device=P.device)
    return (q[:, None] >= k[None, :]).sum(0).float().clamp(min=1)


def block_mass(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """Attention mass in the four modality blocks, ``[..., 4]`` in :data:`BLOCKS` order."""
    P = as_probs(P)
    spans.check(P.shape[-1], "attention map's key axis")
    kinds = torch.as_tensor(spans.array, device=P.device)
    qk = kinds[_query_positions(P, query_positions)]
    to = {"image": P @ (kinds == IMAGE).float(), "text": P @ (kinds == TEXT).float()}  # [..., Sq] each
    frm = {"image": (qk == IMAGE).float(), "text": (qk == TEXT).float()}
    out = [to[dst] @ frm[src] for src, dst in (b.split("->") for b in BLOCKS)]
    return torch.stack(out, -1)


def block_shares(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """The four blocks as shares of all attention mass: ``[..., 4]``, sums to 1."""
    m = block_mass(P, spans, query_positions)
    return m / m.sum(-1, keepdim=True).clamp(min=1e-12)


def cross_modal_share(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """Share of attention mass that crosses modalities (image->text + text->image): ``[...]``."""
    s = block_shares(P, spans, query_positions)
    return s[..., BLOCKS.index("image->text")] + s[..., BLOCKS.index("text->image")]


def head_similarity(P: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Cosine similarity between the flattened maps of every pair of heads: ``[..., H, H]``
    for ``P`` of shape ``[..., H, Sq, Sk]``."""
    P = as_probs(P, check)
    f = P.flatten(-2)
    gram = f @ f.transpose(-1, -2)
    norm = gram.diagonal(dim1=-2, dim2=-1).clamp(min=1e-24).sqrt()
    return gram / (norm[..., :, None] * norm[..., None, :])


def mean_offdiag(S: torch.Tensor) -> torch.Tensor:
    """Mean of the off-diagonal entries of ``[..., H, H]`` similarity matrices: ``[...]``."""
    h = S.shape[-1]
    if h < 2:
        return torch.full(S.shape[:-2], float("nan"))
    off = ~torch.eye(h, dtype=torch.bool, device=S.device)
    return S[..., off].reshape(*S.shape[:-2], h * (h - 1)).mean(-1)


def gini(x: torch.Tensor) -> torch.Tensor:
    """Gini coefficient of non-negative values along the last axis: 0 equal, -> 1 concentrated."""
    x = torch.as_tensor(x).float().sort(-1).values
    n = x.shape[-1]
    idx = torch.arange(1, n + 1, dtype=torch.float32, device=x.device)
    tot = x.sum(-1).clamp(min=1e-12)
    return ((2 * idx - n - 1) * x).sum(-1) / (n * tot)


def top_share(x: torch.Tensor, fraction: float = 0.1) -> torch.Tensor:
    """Share of the total held by the top ``fraction`` of entries along the last axis."""
    x = torch.as_tensor(x).float()
    k = max(1, math.ceil(fraction * x.shape[-1]))
    return x.topk(k, -1).values.sum(-1) / x.sum(-1).clamp(min=1e-12)


# The statistics a capture in ``stats`` mode keeps for one layer, and their shapes for H heads,
# S positions. Nothing here is of size S^2.
LAYER_STATS = {
    "entropy": "[H, Sq] row entropy (nats)",
    "norm_entropy": "[H, Sq] entropy / log(#visible keys)",
    "max_weight": "[H, Sq] largest weight per row",
    "read_freq": "[H, Sk] column sums",
    "read_freq_norm": "[H, Sk] column sums / #queries that see the key",
    "diag": "[H] mass on the diagonal",
    "distance": "[H] mean attention distance",
    "variance": "[H] mean within-row variance",
    "head_sim": "[H, H] cosine similarity of head maps",
    "blocks": "[H, 4] four-block shares (only with spans)",
    "text_read_freq": "[H, Sk] column sums over text query rows only (only with spans)",
    "image_share": "[H, Sq] each query row's mass on image keys (only with spans)",
}


def layer_statistics(P: torch.Tensor, spans: Spans | None = None, causal: bool = True,
                     query_positions=None) -> dict[str, torch.Tensor]:
    """All of :data:`LAYER_STATS` for one layer's map ``P [H, Sq, Sk]`` (float32, same device).

    Equal to calling the individual functions (tested), but fused so the map is read about six
    times instead of twenty: the row-side quantities (expected key position, row mass, mass on
    image and text keys) come from one matrix product with a few key-indicator columns, the
    column-side ones (read frequency overall and by text queries) from another. NaN/inf anywhere
    in ``P`` shows up in those products and raises :class:`AttentionValueError`.
    """
    P = torch.as_tensor(P).float()
    if P.dim() != 3:
        raise ValueError(f"layer_statistics expects one sample's map [heads, Sq, Sk], got shape {tuple(P.shape)}")
    H, sq, sk = P.shape
    dev = P.device
    q = _query_positions(P, query_positions)
    kpos = torch.arange(sk, device=dev, dtype=torch.float32)
    key_cols = [kpos, torch.ones(sk, device=dev)]
    q_rows = [torch.ones(sq, device=dev)]
    if spans is not None:
        spans.check(sk, "attention map's key axis")
        kinds = torch.as_tensor(spans.array, device=dev)
        key_cols += [(kinds == IMAGE).float(), (kinds == TEXT).float()]
        qk = kinds[q]
        q_rows += [(qk == TEXT).float(), (qk == IMAGE).float()]
    R = P @ torch.stack(key_cols, -1)  # [H, Sq, c]
    C = torch.stack(q_rows, 0) @ P  # [H, r, Sk]
    if not (torch.isfinite(R).all() and torch.isfinite(C).all()):
        raise AttentionValueError(
            "attention weights contain NaN/inf values: the forward overflowed (fp16?) or a mask row is "
            "fully masked; rerun in float32 or bfloat16"
        )
    n = visible_keys(P, causal, query_positions).float()
    h = _causal_entropy(P, q) if causal else -torch.special.xlogy(P, P).sum(-1)
    rf = C[:, 0]
    if causal:
        distance = (q.float() * R[..., 1] - R[..., 0]).mean(-1)
    else:
        distance = mean_attention_distance(P, query_positions, causal=False)
    sumsq = torch.linalg.vector_norm(P, dim=-1) ** 2
    out = {
        "entropy": h,
        "norm_entropy": normalised_entropy(P, causal, query_positions, entropy=h),
        "max_weight": P.amax(-1),
        "read_freq": rf,
        "read_freq_norm": rf / queries_seeing(P, causal, query_positions),
        "diag": P[:, torch.arange(sq, device=dev), q].mean(-1),
        "distance": distance,
        "variance": (sumsq / n - 1.0 / n**2).mean(-1),
        "head_sim": head_similarity(P, check=False),  # already checked through R and C
    }
    if spans is not None:
        to = {"image": R[..., 2], "text": R[..., 3]}
        frm = {"text": q_rows[1], "image": q_rows[2]}
        mass = torch.stack([to[dst] @ frm[src] for src, dst in (b.split("->") for b in BLOCKS)], -1)
        out["blocks"] = mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)
        out["text_read_freq"] = C[:, 1]
        out["image_share"] = R[..., 2]
    return out


def _causal_entropy(P: torch.Tensor, q: torch.Tensor, blocks: int = 8) -> torch.Tensor:
    """Row entropy of a causal map computing logs only left of the diagonal, in row blocks (the
    masked upper triangle is exactly 0 and contributes nothing): about half the work of
    :func:`row_entropy` on a square map, same result."""
    H, sq, sk = P.shape
    h = torch.empty(H, sq, device=P.device)
    step = -(-sq // blocks)
    for r0 in range(0, sq, step):
        r1 = min(sq, r0 + step)
        blk = P[:, r0:r1, : int(q[r1 - 1]) + 1]
        h[:, r0:r1] = -torch.special.xlogy(blk, blk).sum(-1)
    return h


def text_read_frequency(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """Column sums over the text query rows only: ``[..., Sk]`` (how much text reads each key)."""
    P = as_probs(P)
    spans.check(P.shape[-1], "attention map's key axis")
    qk = torch.as_tensor(spans.array, device=P.device)[_query_positions(P, query_positions)]
    return (qk == TEXT).float() @ P


def entropy_in_dtype(P: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row entropy computed *in* ``dtype`` (weights cast first), returned as float32.

    Only for showing the precision trap of claim M1; use :func:`row_entropy` for real work.
    """
    Q = torch.as_tensor(P).to(dtype)
    return (-(Q * torch.log(Q.clamp(min=torch.finfo(dtype).tiny))).sum(-1)).float()


def row_statistics_in_dtype(P: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``entropy``, ``max_weight`` and ``sum_sq`` (the sum of squared weights behind head variance) of
    every row of ``P [..., Sq, Sk]``, computed *in* ``dtype`` and returned as float32 ``[..., Sq]``.
    Only for claim M1 (what half-precision arithmetic does to statistics); real work uses float32."""
    Q = torch.as_tensor(P).to(dtype)
    return {"entropy": entropy_in_dtype(P, dtype), "max_weight": Q.amax(-1).float(), "sum_sq": (Q * Q).sum(-1).float()}


# What a diffusion capture keeps for one (sample, part, layer, step); H heads, Si image queries,
# Tr real text keys. Block order is :data:`~unicache_lib.modality.BLOCKS`.
STEP_STATS = {
    "blocks": "[H, 4] four-block shares of all attention mass",
    "block_entropy": "[H, 4] mean normalised entropy of the src queries' rows restricted to dst keys",
    "row_entropy": "[H, 2] mean normalised entropy of whole rows: image queries, text queries",
    "max_weight": "[H, 2] mean row maximum: image queries, text queries",
    "text_share": "[H] mean mass of image queries on text keys (padding included)",
    "text_entropy": "[H] mean normalised entropy of image queries over the real text keys",
    "word_map": "[Si, Tr] head-mean attention of each image query on each real text key",
    "head_sim": "[H, H] cosine similarity of head maps",
    "variance": "[H] mean within-row variance of the image queries' rows (0 = uniform)",
}


def _mean_norm_entropy(P: torch.Tensor) -> torch.Tensor:
    """``P [H, n, k]`` rows renormalised to sum 1 -> ``[H]`` mean entropy / log(k) (NaN if k < 2)."""
    k = P.shape[-1]
    if P.shape[-2] == 0 or k < 2:
        return torch.full(P.shape[:1], float("nan"), device=P.device)
    R = P / P.sum(-1, keepdim=True).clamp(min=1e-30)
    return (-torch.special.xlogy(R, R).sum(-1) / math.log(k)).mean(-1)


def step_statistics(P: torch.Tensor, q_kinds, k_kinds, k_real=None) -> dict[str, torch.Tensor]:
    """:data:`STEP_STATS` of one (non-causal) diffusion attention map.

    Args:
        P: ``[H, Sq, Sk]`` probabilities (any dtype; computed in float32).
        q_kinds / k_kinds: ``[Sq]`` / ``[Sk]`` modality of each query / key (IMAGE or TEXT).
        k_real: ``[Sk]`` bool, False for padding keys (excluded from ``text_entropy`` and
            ``word_map``); None = all real.
    """
    P = as_probs(P)
    if P.dim() != 3:
        raise ValueError(f"step_statistics expects [heads, Sq, Sk], got {tuple(P.shape)}")
    H, sq, sk = P.shape
    dev = P.device
    qk = torch.as_tensor(np.asarray(q_kinds), device=dev)
    kk = torch.as_tensor(np.asarray(k_kinds), device=dev)
    if len(qk) != sq or len(kk) != sk:
        raise ValueError(f"kinds cover {len(qk)} queries / {len(kk)} keys, the map is {sq} x {sk}")
    real = torch.ones(sk, dtype=torch.bool, device=dev) if k_real is None else torch.as_tensor(np.asarray(k_real), device=dev)
    nan = torch.full((H,), float("nan"), device=dev)
    sel = {"image": (qk == IMAGE, kk == IMAGE), "text": (qk == TEXT, kk == TEXT)}
    mass, bent = [], []
    for blk in BLOCKS:
        src, dst = blk.split("->")
        qs, ks = sel[src][0], sel[dst][1]
        sub = P[:, qs][:, :, ks]
        mass.append(sub.sum((-1, -2)))
        bent.append(_mean_norm_entropy(sub) if sub.shape[-2] else nan)
    mass = torch.stack(mass, -1)
    iq, tq = sel["image"][0], sel["text"][0]
    text_real = (kk == TEXT) & real
    img_rows = P[:, iq]
    on_text = img_rows[:, :, text_real]
    out = {
        "blocks": mass / mass.sum(-1, keepdim=True).clamp(min=1e-30),
        "block_entropy": torch.stack(bent, -1),
        "row_entropy": torch.stack([_mean_norm_entropy(P[:, iq]) if iq.any() else nan,
                                    _mean_norm_entropy(P[:, tq]) if tq.any() else nan], -1),
        "max_weight": torch.stack([P[:, iq].amax(-1).mean(-1) if iq.any() else nan,
                                   P[:, tq].amax(-1).mean(-1) if tq.any() else nan], -1),
        "text_share": img_rows[:, :, kk == TEXT].sum(-1).mean(-1) if iq.any() else nan,
        "text_entropy": _mean_norm_entropy(on_text) if on_text.shape[-1] else nan,
        "word_map": on_text.mean(0),
        "head_sim": head_similarity(P, check=False),
        "variance": ((img_rows ** 2).sum(-1) / sk - 1.0 / sk**2).mean(-1) if iq.any() else nan,
    }
    return out
