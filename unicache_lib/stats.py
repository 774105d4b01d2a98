"""Attention statistics: tensors in, tensors out, always in float32.

Every function takes attention probabilities ``P`` of shape ``[..., Sq, Sk]`` (rows sum to 1; the
leading dims are usually ``[heads]`` or ``[batch, heads]``) and casts them to float32 first, so fp16
or bf16 weights give the same statistics as an fp32 reference (claim M1).

**The mask.** Visible-key counts (the normaliser of entropy), the read-frequency normaliser, the
distance and the variance depend on which keys each query could see. Functions take ``causal``:
``True`` (a causal mask is assumed: key ``k`` visible to query ``q`` iff ``k <= q``), ``False`` (every
key visible) or a bool tensor ``[Sq, Sk]`` giving the mask that was actually applied (capture reads it
from the model; sliding windows, bidirectional image blocks and prefix-LM masks differ from causal).
A map that puts mass on keys its mask hides raises :class:`AttentionMaskError` instead of giving
wrong numbers. A query row that sees no key at all (a gated row, e.g. text before the image in a
cross-attention layer) is *dead*: its row statistics are NaN and it adds nothing to column sums.

Causal maps: when ``Sq < Sk`` the queries are taken to be the *last* ``Sq`` positions (a decode
step or a strided capture says so through ``query_positions``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .modality import BLOCKS, IMAGE, TEXT, Spans

# mass on hidden keys above this (per row) means the map and the mask disagree
HIDDEN_MASS_TOL = 1e-3


class AttentionValueError(ValueError):
    """Attention weights that are not probabilities (NaN / inf / negative)."""


class AttentionMaskError(ValueError):
    """A map with attention mass on keys its (assumed or applied) mask hides."""


def as_probs(P: torch.Tensor, check: bool = True) -> torch.Tensor:
    """``P`` as float32; with ``check``, NaN or inf values raise :class:`AttentionValueError`."""
    P = torch.as_tensor(P).float()
    # a NaN or inf anywhere makes the sum non-finite (weights are at most 1, so a finite map cannot
    # overflow it): one reduction instead of a boolean map-sized pass
    if check and not bool(torch.isfinite(P.sum())):
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


@dataclass
class Visibility:
    """Which keys each query row could see: ``kind`` is ``"all"``, ``"causal"`` or ``"mask"`` (then
    ``V [Sq, Sk]`` bool holds it); ``q [Sq]`` are the query positions."""

    kind: str
    q: torch.Tensor
    sk: int
    V: torch.Tensor | None = None

    @classmethod
    def of(cls, P: torch.Tensor, causal=True, query_positions=None) -> "Visibility":
        q = _query_positions(P, query_positions)
        sq, sk = P.shape[-2], P.shape[-1]
        if not torch.is_tensor(causal):
            return cls("causal" if causal else "all", q, sk)
        V = causal.to(device=P.device, dtype=torch.bool)
        if V.shape[-2:] != (sq, sk):
            raise AttentionMaskError(f"mask of shape {tuple(V.shape)} for a map of {sq} x {sk}")
        if V.dim() > 2:
            if not bool((V == V[:1]).all()):
                raise AttentionMaskError("per-head masks are not supported: every head must see the same keys")
            V = V.reshape(-1, sq, sk)[0]
        if bool(V.all()):
            return cls("all", q, sk)
        if bool(torch.equal(V, torch.arange(sk, device=V.device)[None, :] <= q[:, None])):
            return cls("causal", q, sk)
        return cls("mask", q, sk, V)

    def counts(self) -> torch.Tensor:
        """``[Sq]`` visible keys per query row (0 for a dead row)."""
        if self.kind == "all":
            return torch.full((len(self.q),), self.sk, device=self.q.device)
        if self.kind == "causal":
            return (self.q + 1).clamp(max=self.sk)
        return self.V.sum(-1)

    def seeing(self) -> torch.Tensor:
        """``[Sk]`` how many query rows can see each key (at least 1, to divide by)."""
        if self.kind == "all":
            return torch.full((self.sk,), float(len(self.q)), device=self.q.device)
        if self.kind == "causal":
            k = torch.arange(self.sk, device=self.q.device)
            return (self.q[:, None] >= k[None, :]).sum(0).float().clamp(min=1)
        return self.V.sum(-2).float().clamp(min=1)

    def hidden_mass(self, P: torch.Tensor) -> torch.Tensor:
        """``[..., Sq]`` mass each row puts on keys it cannot see."""
        if self.kind == "all":
            return torch.zeros(P.shape[:-1], device=P.device)
        if self.kind == "causal":
            k = torch.arange(self.sk, device=P.device)
            return torch.where(k[None, :] > self.q[:, None], P, 0).sum(-1)
        return torch.where(self.V, 0, P).sum(-1)


def check_mask(P: torch.Tensor, vis: "Visibility", what: str = "attention map", hidden=None) -> None:
    """Raise :class:`AttentionMaskError` when a live row puts more than :data:`HIDDEN_MASS_TOL` on
    keys the mask hides (``hidden``: that mass per row, when already computed)."""
    hidden = vis.hidden_mass(P) if hidden is None else hidden
    live = vis.counts() > 0
    worst = float(hidden[..., live].max()) if bool(live.any()) and hidden.numel() else 0.0
    if worst > HIDDEN_MASS_TOL:
        expect = {"causal": "a causal mask", "mask": "the mask the model applied"}.get(vis.kind, "no mask")
        raise AttentionMaskError(
            f"the {what} puts up to {worst:.3f} of a row's mass on keys that {expect} hides: the map and the "
            f"mask disagree (the model does not use the mask assumed here, e.g. bidirectional image blocks, a "
            f"prefix-LM or sliding-window mask). Capture through AttentionCapture, which reads the mask the model "
            f"applied, or pass that mask (a bool [Sq, Sk] tensor) as `causal`."
        )


def visible_keys(P: torch.Tensor, causal=True, query_positions=None) -> torch.Tensor:
    """``[Sq]`` number of keys each query row can see (``Sk`` for non-causal maps)."""
    return Visibility.of(P, causal, query_positions).counts()


def row_entropy(P: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each row in nats: ``[..., Sq]``; zero probabilities contribute 0."""
    P = as_probs(P)
    return -torch.special.xlogy(P, P).sum(-1)


def normalised_entropy(P: torch.Tensor, causal=True, query_positions=None,
                       entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Row entropy divided by ``log(#visible keys)``: ``[..., Sq]`` in [0, 1]; 1 = uniform over what the
    row can see. Rows that see a single key (or none) have no spread to measure and give NaN.
    Raises :class:`AttentionMaskError` when rows put mass on keys the mask hides."""
    vis = Visibility.of(P, causal, query_positions)
    if entropy is None:
        P = as_probs(P)
        check_mask(P, vis)
    n = vis.counts().float()
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


def mean_attention_distance(P: torch.Tensor, query_positions=None, causal=False) -> torch.Tensor:
    """Expected ``|q - k|`` under each row, averaged over rows: ``[...]`` (in positions).

    With a causal mask (keys never after the query) this is ``q - E[k]``, one matrix-vector product;
    with any other mask the general sum, which does not depend on the mask (hidden keys hold 0).
    """
    P = as_probs(P)
    vis = Visibility.of(P, causal, query_positions)
    q = vis.q.float()
    k = torch.arange(P.shape[-1], device=P.device, dtype=torch.float32)
    if vis.kind == "causal":
        check_mask(P, vis)
        return (q * P.sum(-1) - P @ k).mean(-1)
    d = (q[:, None] - k[None, :]).abs()
    return (P * d).sum(-1).mean(-1)


def head_variance(P: torch.Tensor, causal=True, query_positions=None) -> torch.Tensor:
    """Per-head variance of the weights over each row's visible keys, averaged over live rows: ``[...]``.
    Near 0 means near-uniform rows (the study's 'low variance' pruning signal)."""
    P = as_probs(P)
    vis = Visibility.of(P, causal, query_positions)
    check_mask(P, vis)
    n = vis.counts().float()
    # rows sum to 1 over their n visible keys (mean 1/n), so var = sum(p^2)/n - 1/n^2
    sumsq = torch.linalg.vector_norm(P, dim=-1) ** 2
    v = sumsq / n - 1.0 / n**2
    return v[..., n > 0].mean(-1)


def read_frequency(P: torch.Tensor, normalise: bool = False, causal=True, query_positions=None) -> torch.Tensor:
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


def queries_seeing(P: torch.Tensor, causal=True, query_positions=None) -> torch.Tensor:
    """``[Sk]`` how many query rows can see each key."""
    return Visibility.of(P, causal, query_positions).seeing()


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


def layer_statistics(P: torch.Tensor, spans: Spans | None = None, causal=True, query_positions=None,
                     query_kinds=None) -> dict[str, torch.Tensor]:
    """All of :data:`LAYER_STATS` for one layer's map ``P [H, Sq, Sk]`` (float32, same device).

    Args:
        causal: the mask (module doc): ``True`` / ``False`` or the applied mask as bool ``[Sq, Sk]``.
        spans: modality of the *keys* (and, for self-attention, of the queries by position).
        query_kinds: ``[Sq]`` modality of each query row when the queries are another sequence than
            the keys (cross-attention: text queries over vision tokens); position statistics
            (``diag``, ``distance``) are then NaN.

    Equal to calling the individual functions (tested), but fused so the map is read about six
    times instead of twenty: the row-side quantities (expected key position, row mass, mass on
    image and text keys) come from one matrix product with a few key-indicator columns, the
    column-side ones (read frequency overall and by text queries) from another. NaN/inf anywhere
    in ``P`` shows up in those products and raises :class:`AttentionValueError`; mass on keys the
    mask hides raises :class:`AttentionMaskError`.
    """
    P = torch.as_tensor(P).float()
    if P.dim() != 3:
        raise ValueError(f"layer_statistics expects one sample's map [heads, Sq, Sk], got shape {tuple(P.shape)}")
    H, sq, sk = P.shape
    dev = P.device
    vis = Visibility.of(P, causal, query_positions)
    q = vis.q
    n = vis.counts().float()
    dead = n == 0
    if bool(dead.any()):  # gated rows: not read, so not counted
        P = P.masked_fill(dead[None, :, None], 0.0)
    kpos = torch.arange(sk, device=dev, dtype=torch.float32)
    key_cols = [kpos, torch.ones(sk, device=dev)]
    q_rows = [torch.ones(sq, device=dev)]
    if spans is not None:
        spans.check(sk, "attention map's key axis")
        kinds = torch.as_tensor(spans.array, device=dev)
        key_cols += [(kinds == IMAGE).float(), (kinds == TEXT).float()]
        if query_kinds is not None:
            qk = torch.as_tensor(np.asarray(query_kinds), device=dev)
            if len(qk) != sq:
                raise ValueError(f"query_kinds cover {len(qk)} rows, the map has {sq}")
        else:
            qk = kinds[q]
        q_rows += [(qk == TEXT).float(), (qk == IMAGE).float()]
    R = P @ torch.stack(key_cols, -1)  # [H, Sq, c]
    C = torch.stack(q_rows, 0) @ P  # [H, r, Sk]
    if not (torch.isfinite(R).all() and torch.isfinite(C).all()):
        raise AttentionValueError(
            "attention weights contain NaN/inf values: the forward overflowed (fp16?) or a mask row is "
            "fully masked; rerun in float32 or bfloat16"
        )
    if vis.kind == "causal":
        h, seen = _causal_entropy(P, q)
        check_mask(P, vis, hidden=R[..., 1] - seen)
    else:
        h = -torch.special.xlogy(P, P).sum(-1)
        if vis.kind == "mask":
            check_mask(P, vis)
    nan = torch.tensor(float("nan"), device=dev)
    live = ~dead
    rf = C[:, 0]
    if query_kinds is not None:
        distance = torch.full((H,), float("nan"), device=dev)
        diag = torch.full((H,), float("nan"), device=dev)
    else:
        if vis.kind == "causal":
            per_row = q.float() * R[..., 1] - R[..., 0]
        else:
            per_row = (P * (q.float()[:, None] - kpos[None, :]).abs()).sum(-1)
        distance = per_row[:, live].mean(-1)
        diag = P[:, torch.arange(sq, device=dev), q.clamp(max=sk - 1)][:, live].mean(-1)
    sumsq = torch.linalg.vector_norm(P, dim=-1) ** 2
    var = sumsq / n - 1.0 / n**2
    out = {
        "entropy": torch.where(dead, nan, h),
        "norm_entropy": normalised_entropy(P, causal, query_positions, entropy=h),
        "max_weight": torch.where(dead, nan, P.amax(-1)),
        "read_freq": rf,
        "read_freq_norm": rf / vis.seeing(),
        "diag": diag,
        "distance": distance,
        "variance": var[:, live].mean(-1),
        "head_sim": head_similarity(P, check=False),  # already checked through R and C
    }
    if spans is not None:
        to = {"image": R[..., 2], "text": R[..., 3]}
        frm = {"text": q_rows[1], "image": q_rows[2]}
        mass = torch.stack([to[dst] @ frm[src] for src, dst in (b.split("->") for b in BLOCKS)], -1)
        out["blocks"] = mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)
        out["text_read_freq"] = C[:, 1]
        out["image_share"] = torch.where(dead, nan, R[..., 2])
    return out


def _causal_entropy(P: torch.Tensor, q: torch.Tensor, blocks: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Row entropy of a causal map computing logs only left of the diagonal, in row blocks (the
    masked upper triangle is exactly 0 and contributes nothing): about half the work of
    :func:`row_entropy` on a square map, same result. Also returns each row's mass on its visible
    keys ``[H, Sq]`` (for the hidden-mass check)."""
    H, sq, sk = P.shape
    h = torch.empty(H, sq, device=P.device)
    seen = torch.empty(H, sq, device=P.device)
    step = -(-sq // blocks)
    for r0 in range(0, sq, step):
        r1 = min(sq, r0 + step)
        blk = P[:, r0:r1, : int(q[r1 - 1]) + 1]
        h[:, r0:r1] = -torch.special.xlogy(blk, blk).sum(-1)
        k = torch.arange(blk.shape[-1], device=P.device)
        inside = k[None, :] <= q[r0:r1, None]
        seen[:, r0:r1] = torch.where(inside, blk, 0).sum(-1)
    return h, seen


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


def _group_entropy(plogp_sum: torch.Tensor, mass: torch.Tensor, k: int) -> torch.Tensor:
    """Normalised entropy of rows restricted to a key group and renormalised, from the group's
    ``sum p log p`` and mass: ``H = log m - (sum p log p) / m``, divided by log(k); 0 for rows with no
    mass there (as renormalising an all-zero row gives), NaN when the group has fewer than 2 keys."""
    if k < 2:
        return torch.full_like(mass, float("nan"))
    m = mass.clamp(min=1e-30)
    h = (torch.log(m) - plogp_sum / m) / math.log(k)
    return torch.where(mass > 0, h, torch.zeros_like(h))


def step_statistics(P: torch.Tensor, q_kinds, k_kinds, k_real=None) -> dict[str, torch.Tensor]:
    """:data:`STEP_STATS` of one (non-causal) diffusion attention map.

    Args:
        P: ``[H, Sq, Sk]`` probabilities (any dtype; computed in float32).
        q_kinds / k_kinds: ``[Sq]`` / ``[Sk]`` modality of each query / key (IMAGE or TEXT).
        k_real: ``[Sk]`` bool, False for padding keys (excluded from ``text_entropy`` and
            ``word_map``); None = all real.

    Fused: one pass for ``p log p``, one product with a ``[Sk, 4]`` key-group indicator for every
    group's mass and ``sum p log p`` per row (entropies of renormalised sub-rows follow from those), one
    Gram product for head similarity; no sub-map is copied, so memory stays at a few map-sized buffers
    (SD3-medium at 1,024 px: 24 heads x 4,429^2).
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
    ki, kt = kk == IMAGE, kk == TEXT
    text_real = kt & real
    # key groups: image, text (padding included), real text, all
    G = torch.stack([ki, kt, text_real, torch.ones_like(ki)], -1).float()  # [Sk, 4]
    mass = P @ G  # [H, Sq, 4]
    ent = torch.special.xlogy(P, P) @ G  # sum p log p per row and group
    widths = [int(ki.sum()), int(kt.sum()), int(text_real.sum()), sk]
    iq, tq = qk == IMAGE, qk == TEXT

    def rows_mean(x, q):  # x [H, Sq] -> [H], mean over the query rows q
        return x[:, q].mean(-1) if bool(q.any()) else nan

    block_mass, bent = [], []
    for blk in BLOCKS:
        src, dst = blk.split("->")
        q = iq if src == "image" else tq
        g = 0 if dst == "image" else 1
        block_mass.append(mass[:, q, g].sum(-1))
        bent.append(rows_mean(_group_entropy(ent[..., g], mass[..., g], widths[g]), q) if widths[g] and bool(q.any()) else nan)
    block_mass = torch.stack(block_mass, -1)
    whole = _group_entropy(ent[..., 3], mass[..., 3], sk)
    rowmax = P.amax(-1)
    mean_map = P.mean(0)  # [Sq, Sk]
    out = {
        "blocks": block_mass / block_mass.sum(-1, keepdim=True).clamp(min=1e-30),
        "block_entropy": torch.stack(bent, -1),
        "row_entropy": torch.stack([rows_mean(whole, iq), rows_mean(whole, tq)], -1),
        "max_weight": torch.stack([rows_mean(rowmax, iq), rows_mean(rowmax, tq)], -1),
        "text_share": rows_mean(mass[..., 1], iq),
        "text_entropy": rows_mean(_group_entropy(ent[..., 2], mass[..., 2], widths[2]), iq) if widths[2] and bool(iq.any()) else nan,
        "word_map": mean_map[iq][:, text_real],
        "head_sim": head_similarity(P, check=False),
        "variance": rows_mean((P * P).sum(-1) / sk - 1.0 / sk**2, iq),
    }
    return out
