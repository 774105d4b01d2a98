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

from .core.errors import AttentionMaskError, AttentionValueError, InputError
from .core.modality import BLOCKS, IMAGE, TEXT, Spans
from .core.similarity import cosine_from_sums

# mass on hidden keys above this (per row) means the map and the mask disagree
HIDDEN_MASS_TOL = 1e-3


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
    return (torch.arange(sk - sq, sk, device=P.device) if query_positions is None
            else torch.as_tensor(query_positions, device=P.device))


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
        is_causal = bool(torch.equal(V, torch.arange(sk, device=V.device)[None, :] <= q[:, None]))
        return cls("causal", q, sk) if is_causal else cls("mask", q, sk, V)

    def counts(self) -> torch.Tensor:
        """``[Sq]`` visible keys per query row (0 for a dead row)."""
        return (torch.full((len(self.q),), self.sk, device=self.q.device) if self.kind == "all"
                else (self.q + 1).clamp(max=self.sk) if self.kind == "causal" else self.V.sum(-1))

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
    if (worst := float(hidden[..., live].max()) if bool(live.any()) and hidden.numel() else 0.0) > HIDDEN_MASS_TOL:
        expect = {"causal": "a causal mask", "mask": "the mask the model applied"}.get(vis.kind, "no mask")
        raise AttentionMaskError(
            f"the {what} puts up to {worst:.3f} of a row's mass on keys that {expect} hides: the map and the "
            f"mask disagree (the model does not use the mask assumed here, e.g. bidirectional image blocks, a "
            f"prefix-LM or sliding-window mask). Capture through AttentionCapture, which reads the mask the model "
            f"applied, or pass that mask (a bool [Sq, Sk] tensor) as `causal`."
        )


def row_entropy(P: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each row in nats: ``[..., Sq]``; zero probabilities contribute 0."""
    P = as_probs(P)
    return -torch.special.xlogy(P, P).sum(-1)


def normalised_entropy(P: torch.Tensor, causal=True, query_positions=None) -> torch.Tensor:
    """Row entropy divided by ``log(#visible keys)``: ``[..., Sq]`` in [0, 1]; 1 = uniform over what the
    row can see. Rows that see a single key (or none) have no spread to measure and give NaN.
    Raises :class:`AttentionMaskError` when rows put mass on keys the mask hides."""
    vis = Visibility.of(P, causal, query_positions)
    P = as_probs(P)
    check_mask(P, vis)
    n = vis.counts().float()
    h = row_entropy(P)
    return torch.where(n > 1, h / torch.log(n).clamp(min=1e-12), torch.full_like(h, float("nan")))


def block_shares(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """The four modality blocks (:data:`BLOCKS` order) as shares of all attention mass: ``[..., 4]``, sums to 1."""
    P = as_probs(P)
    spans.check(P.shape[-1], "attention map's key axis")
    kinds = torch.as_tensor(spans.array, device=P.device)
    qk = kinds[_query_positions(P, query_positions)]
    to = {"image": P @ (kinds == IMAGE).float(), "text": P @ (kinds == TEXT).float()}  # [..., Sq] each
    frm = {"image": (qk == IMAGE).float(), "text": (qk == TEXT).float()}
    m = torch.stack([to[dst] @ frm[src] for src, dst in (b.split("->") for b in BLOCKS)], -1)
    return m / m.sum(-1, keepdim=True).clamp(min=1e-12)


def _cosine(gram: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``[..., H, H]`` from a Gram matrix of inner products ``[..., H, H]``."""
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


#: float32 bytes per row chunk of a map read on a CPU: a chunk and its few temporaries stay in cache and no temporary
#: is of the map's size
CHUNK_BYTES = 4 << 20
#: the same when a map is streamed from its logits (:class:`LogitRows`): larger, because each chunk costs a matrix
#: product, which needs rows to be efficient; a few such buffers stay far below one map at real scale
STREAM_CHUNK_BYTES = 16 << 20
#: on an accelerator the chunk is about kernel launches, not caches: a few large chunks (memory still bounded)
DEVICE_CHUNK_BYTES = 256 << 20
_TINY = torch.finfo(torch.float32).tiny


def default_chunk_bytes(device=None) -> int:
    """Bytes of float32 per row chunk on ``device``: :data:`CHUNK_BYTES` on a CPU (or None), else
    :data:`DEVICE_CHUNK_BYTES`."""
    return CHUNK_BYTES if device is None or torch.device(device).type == "cpu" else DEVICE_CHUNK_BYTES


def stream_chunk_bytes(device=None) -> int:
    """:func:`default_chunk_bytes` of a map streamed from its logits: :data:`STREAM_CHUNK_BYTES` on a CPU."""
    return STREAM_CHUNK_BYTES if device is None or torch.device(device).type == "cpu" else DEVICE_CHUNK_BYTES


def row_chunks(heads: int, sq: int, sk: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[(r0, r1), ...]`` query-row ranges of about ``chunk_bytes`` of float32 ``[heads, r1 - r0, sk]`` each."""
    step = max(1, int(chunk_bytes) // max(1, heads * sk * 4))
    return [(r0, min(sq, r0 + step)) for r0 in range(0, sq, step)]


def map_chunks(P) -> list[tuple[int, int]]:
    """The query-row chunks a map ``[H, Sq, Sk]`` (a tensor or a :class:`LogitRows`) is read in."""
    H, sq, sk = P.shape
    return row_chunks(H, sq, sk, (stream_chunk_bytes if isinstance(P, LogitRows) else default_chunk_bytes)(P.device))


class LogitRows:
    """An attention map given by its logits, softmaxed one row chunk at a time, so the whole
    ``[H, Sq, Sk]`` map never exists (capture mode ``recompute``).

    Args:
        query: ``[H, Sq, D]`` and ``key``: ``[H, Sk, D]`` (post-rotary; key heads already repeated for
            grouped-query attention), any float dtype (computed in float32).
        scale: the logit scale. ``mask``: None, bool ``[Sq, Sk]`` (True = attend) or additive float
            ``[Sq, Sk]`` added to the scaled logits.
    """

    def __init__(self, query: torch.Tensor, key: torch.Tensor, scale: float, mask: torch.Tensor | None = None):
        self.q, self.k, self.scale = query, key, float(scale)
        self.shape = (query.shape[0], query.shape[1], key.shape[1])
        self.device = query.device
        self.visible, self.bias = None, None
        if mask is not None:  # the last Sq rows, as capture reads the mask; one row broadcasts over the queries
            mask = mask[-self.shape[1]:].expand(self.shape[1], self.shape[2])
            if mask.dtype == torch.bool:
                self.visible = mask
            else:  # additive: hidden where -inf or near the dtype's minimum, a bias where finite and non-zero
                m = mask.float()
                self.visible = torch.isfinite(m) & (m > torch.finfo(mask.dtype).min / 2)
                bias = torch.where(self.visible, m, 0.0)
                self.bias = bias if bool(bias.any()) else None

    def rows(self, r0: int, r1: int, k1: int | None = None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Probabilities ``[H, r1 - r0, k1]`` (float32) of query rows ``r0:r1`` over keys ``:k1`` (keys past
        ``k1`` must be hidden from these rows) and the rows' entropy ``[H, r1 - r0]`` in nats, from the
        logits (``H = logsumexp(l) - sum p l``: no logarithm per entry). ``out``: a float32 buffer of at least
        ``H * (r1 - r0) * k1`` elements to hold the probabilities (no allocation per chunk)."""
        k1 = self.shape[2] if k1 is None else k1
        keys = self.k if self.k is not None else self._kt.transpose(-1, -2)
        logits = torch.matmul(self.q[:, r0:r1].float(), keys[:, :k1].float().transpose(-1, -2)).mul_(self.scale)
        if self.bias is not None:
            logits.add_(self.bias[r0:r1, :k1])
        hide, lo = None, 0
        if self.visible is not None:
            hide = ~self.visible[r0:r1, :k1]
            cols = hide.any(0).nonzero()
            lo = int(cols[0]) if len(cols) else k1  # only columns lo: hold hidden keys (a causal chunk: a triangle)
            hide = hide[:, lo:]
            logits[..., lo:].masked_fill_(hide, float("-inf"))
        m = logits.amax(-1, keepdim=True)
        logits.sub_(m)  # logits now hold l - max
        p = logits.exp() if out is None else torch.exp(logits, out=out[: logits.numel()].view(logits.shape))
        z = p.sum(-1, keepdim=True)
        p.div_(z)
        if hide is not None:  # hidden keys: p = 0, and l = 0 keeps them out of sum p l
            logits[..., lo:].masked_fill_(hide, 0.0)
        # H = logsumexp(l) - sum p l = log z - sum p (l - max)
        ent = torch.log(z[..., 0]) - logits.mul_(p).sum(-1)
        return p, ent.clamp_(min=0.0)

    def parts(self, r0: int, r1: int):
        """``(p, logits, lse, p_max)`` of query rows ``r0:r1`` over all keys, for statistics read in one pass per
        chunk: the probabilities ``[H, c, Sk]`` (one fused softmax), the scaled logits ``[H, c, Sk]`` (0 at hidden
        keys, where ``p = 0``), ``lse = logsumexp(logits)`` ``[H, c]``, so ``log p = logits - lse`` wherever
        ``p > 0`` (entropies without a logarithm per entry), and each row's largest probability ``[H, c]``."""
        logits = torch.matmul(self.q[:, r0:r1].float() * self.scale, self._keys_t())
        if self.bias is not None:
            logits.add_(self.bias[r0:r1])
        hide = None
        if self.visible is not None:
            hide = ~self.visible[r0:r1]
            if bool(hide.any()):
                logits.masked_fill_(hide, float("-inf"))
            else:
                hide = None
        lmax = logits.amax(-1)
        p = torch.softmax(logits, -1)
        p_max = p.amax(-1)
        lse = lmax - torch.log(p_max)  # the largest p is exp(lmax - lse): no second exponential pass
        if hide is not None:
            logits.masked_fill_(hide, 0.0)
        return p, logits, lse, p_max

    def materialize(self) -> torch.Tensor:
        """The whole map ``[H, Sq, Sk]`` (float32)."""
        return self.rows(0, self.shape[1])[0]

    def _keys_t(self) -> torch.Tensor:
        """The keys transposed ``[H, D, Sk]`` float32, contiguous, made once (no copy per chunk); the keys themselves
        are then let go (one copy held, not two)."""
        if getattr(self, "_kt", None) is None:
            self._kt = self.k.float().transpose(-1, -2).contiguous()
            self.k = None
        return self._kt

    def thin(self, stride: int = 1, rows: torch.Tensor | None = None) -> "LogitRows":
        """The same map with every ``stride``-th query row (or the query rows ``rows``, an index tensor), holding
        only what it needs: its own copy of those queries and the transposed keys (``2 x H x S x D`` floats; not
        views that would keep a batch's projections alive), and the mask rows thinned. What diffusion capture
        keeps of the previous step, and the rows ``stats_stride`` reads."""
        sel = slice(None, None, stride) if rows is None else rows
        out = LogitRows.__new__(LogitRows)
        out.q = self.q[:, sel].float().contiguous()
        out.k, out._kt, out.scale, out.device = None, self._keys_t(), self.scale, self.device
        out.shape = (self.shape[0], out.q.shape[1], self.shape[2])
        out.visible = None if self.visible is None else self.visible[sel]
        out.bias = None if self.bias is None else self.bias[sel]
        return out


def row_weights(kept_kinds, all_kinds) -> np.ndarray:
    """``[len(kept_kinds)]``: how many rows of its kind in the whole map (``all_kinds``) each kept row stands for,
    ``n_kind(all) / n_kind(kept)``."""
    kept, every = np.asarray(kept_kinds), np.asarray(all_kinds)
    kinds, inverse, n_kept = np.unique(kept, return_inverse=True, return_counts=True)
    return (np.array([(every == x).sum() for x in kinds]) / n_kept)[inverse]  # n_kind(all) / n_kind(kept)


def sample_rows(q_kinds, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``stride``-th query row *of each kind* (image rows and text rows sampled apart, in order, starting
    ``stride // 2`` rows in, or in the middle of a kind with fewer rows than that) and the
    weight of each: how many rows of its kind it stands for (``n_kind / n_sampled_kind``). With the weights,
    :func:`step_statistics` of the sampled rows estimates the statistics of the whole map without a bias from
    the kinds' mix (a plain every-k-th sample of 64 image + 10 text rows at stride 7 holds 10 image rows and 1
    text row: 91% image against 86%). Returns ``(rows [n], weights [n])``, rows sorted."""
    qk = np.asarray(q_kinds)
    if stride < 1:
        raise InputError(f"stride must be >= 1, got {stride}")
    # per kind from the middle of the first stride, not its first row (a text sequence's first token, often an
    # attention sink, would otherwise always stand for k rows); at least one row of every kind
    rows = np.sort(np.concatenate([idx[min(stride // 2, (len(idx) - 1) // 2)::stride]
                                   for idx in (np.flatnonzero(qk == kind) for kind in np.unique(qk))]))
    return rows, row_weights(qk[rows], qk)


def map_rows(P, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a map ``[H, Sq, Sk]`` as float32 ``[H, r1 - r0, Sk]``: sliced from a tensor, or computed from
    the logits of a :class:`LogitRows` (so a streamed map and a materialised one are read alike)."""
    return P.parts(r0, r1)[0] if isinstance(P, LogitRows) else P[:, r0:r1].float().contiguous()


class _RowSums:
    """The chunked engine of :func:`layer_statistics` and :func:`step_statistics`: walks a map ``[H, Sq, Sk]`` one
    chunk of query rows at a time (each chunk read once, temporaries chunk-sized) and keeps the per-row quantities
    both take: each key group's mass ``[H, Sq, g]``, the row maxima and sums of squares ``[H, Sq]`` (variance) and
    the head Gram matrix ``[H, H]`` (head similarity; rows weighted by ``q_weights`` when given). :meth:`walk` yields
    every chunk after that, for what a front end adds of its own.

    ``groups``: the key groups, a list of ``None`` (every key: a row sum), a ``[Sk]`` float vector (a matrix-vector
    product) or a list of ``(a, b)`` runs of keys (slice sums), or a ``[Sk, g]`` matrix (one matrix product).
    """

    def __init__(self, H: int, sq: int, groups, device, q_weights: torch.Tensor | None = None):
        self.groups, self.wq = groups, q_weights
        n = groups.shape[-1] if torch.is_tensor(groups) else len(groups)
        self.mass = torch.empty(H, sq, n, device=device)
        self.rowmax = torch.empty(H, sq, device=device)
        self.sumsq = torch.empty(H, sq, device=device)
        self.gram = torch.zeros(H, H, device=device)

    def walk(self, chunks, read):
        """``read(r0, r1) -> (blk [H, c, k1] float32, rowmax [H, c] or None, extra)``; yields ``(r0, r1, blk, extra)``
        once the chunk's shared quantities are taken (a front end may then change ``blk`` in place)."""
        for r0, r1 in chunks:
            blk, rowmax, extra = read(r0, r1)
            H, c, k1 = blk.shape
            self.mass[:, r0:r1] = _group_sums(blk.view(H * c, k1), self.groups, k1).view(H, c, -1)
            self.rowmax[:, r0:r1] = blk.amax(-1) if rowmax is None else rowmax
            self.sumsq[:, r0:r1] = torch.linalg.vector_norm(blk, dim=-1).square_()
            f = blk.view(H, -1) if self.wq is None else (blk * self.wq[r0:r1, None].sqrt()).view(H, -1)
            self.gram.addmm_(f, f.T)
            yield r0, r1, blk, extra


def _group_sums(flat: torch.Tensor, groups, k1: int) -> torch.Tensor:
    """``[n, g]`` sums of the rows of ``flat [n, k1]`` over each key group of :class:`_RowSums` (keys from ``k1`` on
    left out): matrix-vector products and slice sums (a skinny matrix product is several times slower), or one
    matrix product when ``groups`` is a ``[Sk, g]`` matrix."""
    return flat @ groups[:k1] if torch.is_tensor(groups) else torch.stack([_group_sum(flat, g, k1) for g in groups], -1)


def _group_sum(flat: torch.Tensor, g, k1: int) -> torch.Tensor:
    """``[n]``: one key group's sums (:func:`_group_sums`)."""
    return (flat.sum(-1) if g is None else torch.mv(flat, g[:k1]) if torch.is_tensor(g)
            else sum((flat[:, a:min(b, k1)].sum(-1) for a, b in g if a < k1), torch.zeros(len(flat), device=flat.device)))


def layer_statistics(P, spans: Spans | None = None, causal=True, query_positions=None,
                     query_kinds=None, chunk_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """All of :data:`LAYER_STATS` for one layer's map ``P [H, Sq, Sk]`` (any float dtype; computed in
    float32) or a :class:`LogitRows` (the map from its logits, never materialised).

    Args:
        causal: the mask (module doc): ``True`` / ``False`` or the applied mask as bool ``[Sq, Sk]``.
        spans: modality of the *keys* (and, for self-attention, of the queries by position).
        query_kinds: ``[Sq]`` modality of each query row when the queries are another sequence than
            the keys (cross-attention: text queries over vision tokens); position statistics
            (``diag``, ``distance``) are then NaN.
        chunk_bytes: the map is read one chunk of query rows at a time (about this many bytes of
            float32 each; None: :func:`default_chunk_bytes` of the map's device): every statistic of a
            chunk is taken while it is in cache, temporaries are chunk-sized, and under a causal mask the
            keys right of a chunk's last row are read once, for the finiteness and hidden-mass checks.

    Equal to the single-purpose reference statistics in ``tests/test_stats.py`` (tested). NaN/inf anywhere
    in ``P`` raises :class:`AttentionValueError`; mass on keys the mask hides raises :class:`AttentionMaskError`.
    """
    if isinstance(P, LogitRows):
        source, shape = P, P.shape
    else:
        P = torch.as_tensor(P)
        if P.dim() != 3:
            raise InputError(f"layer_statistics expects one sample's map [heads, Sq, Sk], got shape {tuple(P.shape)}")
        source, shape = None, tuple(P.shape)
    H, sq, sk = shape
    dev = P.device
    vis = Visibility.of(torch.empty(1, device=dev).expand(sq, sk), causal, query_positions)
    q = vis.q
    n = vis.counts().float()
    dead = n == 0
    kpos = torch.arange(sk, device=dev, dtype=torch.float32)
    q_rows = [torch.ones(sq, device=dev)]
    if spans is not None:
        spans.check(sk, "attention map's key axis")
        kinds = torch.as_tensor(spans.array, device=dev)
        if query_kinds is not None:
            qk = torch.as_tensor(np.asarray(query_kinds), device=dev)
            if len(qk) != sq:
                raise InputError(f"query_kinds cover {len(qk)} rows, the map has {sq}")
        else:
            qk = kinds[q]
        q_rows += [(qk == TEXT).float(), (qk == IMAGE).float()]
    groups = [kpos, None]  # per row: sum k p, mass, and with spans the image mass
    if spans is not None:  # the image keys as contiguous runs [a, b): their mass is a slice sum
        edges = np.flatnonzero(np.diff(np.r_[0, (np.asarray(spans.array) == IMAGE).astype(np.int8), 0]))
        runs = list(zip(edges[::2].tolist(), edges[1::2].tolist()))
        groups.append(runs if len(runs) <= 8 else (kinds == IMAGE).float())
    Q = torch.stack(q_rows, 0)  # [r, Sq]
    C = torch.zeros(H, Q.shape[0], sk, device=dev)  # column sums by query-row group
    hidden = torch.zeros(H, sq, device=dev)
    h = torch.empty(H, sq, device=dev)
    dist = torch.empty(H, sq, device=dev) if (query_kinds is None and vis.kind != "causal") else None
    dg = torch.empty(H, sq, device=dev)
    chunk_bytes = default_chunk_bytes(dev) if chunk_bytes is None else int(chunk_bytes)
    size = max(chunk_bytes // 4, H * sk)
    buf, held = torch.empty(size, device=dev), torch.empty(size, device=dev)  # temporaries; the chunk itself

    def read(r0, r1):  # the chunk's rows over the keys they may see, gated rows zeroed (not read, so not counted)
        k1 = min(sk, int(q[r1 - 1]) + 1) if vis.kind == "causal" else sk
        gone = dead[r0:r1] if bool(dead[r0:r1].any()) else None
        if source is not None:
            blk, ent = source.rows(r0, r1, k1, out=held)
            if gone is not None:
                blk, ent = blk.masked_fill(gone[None, :, None], 0.0), ent.masked_fill(gone[None], 0.0)
            return blk, None, ent
        blk = held[: H * (r1 - r0) * k1].view(H, r1 - r0, k1)
        blk.copy_(P[:, r0:r1, :k1])  # one copy of the chunk, in cache and in float32
        blk = blk.masked_fill(gone[None, :, None], 0.0) if gone is not None else blk
        if k1 < sk:  # keys right of the chunk's last row are hidden from all its rows: read once, for the check
            right = P[:, r0:r1, k1:].float().sum(-1)
            right = right.masked_fill(gone[None], 0.0) if gone is not None else right
            if not bool(torch.isfinite(right).all()):
                _raise_nonfinite()
            hidden[:, r0:r1] = right
        return blk, None, None

    rows = _RowSums(H, sq, groups, dev)
    for r0, r1, blk, ent in rows.walk(row_chunks(H, sq, sk, chunk_bytes), read):
        c, k1 = r1 - r0, blk.shape[-1]
        dg[:, r0:r1] = blk[:, torch.arange(c, device=dev), q[r0:r1].clamp(max=k1 - 1)]
        colsum = blk.sum(1)  # [H, k1]
        C[:, 0, :k1] += colsum
        for j in range(1, Q.shape[0]):  # text / image query rows: usually all or none of a chunk's rows
            qj = Q[j, r0:r1]
            if bool((qj == 1).all()):
                C[:, j, :k1] += colsum
            elif bool(qj.any()):
                C[:, j, :k1] += torch.matmul(qj, blk)
        if vis.kind == "causal":
            lo = int(q[r0]) + 1  # keys a chunk row may not see lie right of its own position
            if lo < k1:
                tri = blk[..., lo:]
                right = torch.arange(lo, k1, device=dev)[None, :] > q[r0:r1, None]
                hidden[:, r0:r1] += torch.where(right, tri, 0.0).sum(-1)
        elif vis.kind == "mask":
            hidden[:, r0:r1] = torch.where(vis.V[r0:r1], 0.0, blk).sum(-1)
        if dist is not None:
            w = buf[: H * c * k1].view(H, c, k1)
            d = (q[r0:r1, None].float() - kpos[None, :k1]).abs()
            dist[:, r0:r1] = torch.mul(blk, d, out=w).sum(-1)
        if ent is None:  # last, as it changes the chunk (our own copy) in place: zeros -> the smallest normal
            w = buf[: H * c * k1].view(H, c, k1)  # number, whose p log p (-9e-37) is nothing next to a row's entropy
            ent = -torch.linalg.vecdot(blk, torch.log(blk.clamp_min_(_TINY), out=w))
        h[:, r0:r1] = ent
    R, sumsq, rowmax, gram = rows.mass, rows.sumsq, rows.rowmax, rows.gram
    if not (torch.isfinite(R).all() and torch.isfinite(C).all() and torch.isfinite(h).all()):
        _raise_nonfinite()
    if vis.kind != "all":
        check_mask(None, vis, hidden=hidden)
    nan = torch.tensor(float("nan"), device=dev)
    live = ~dead
    rf = C[:, 0]
    if query_kinds is not None:
        distance = torch.full((H,), float("nan"), device=dev)
        diag = torch.full((H,), float("nan"), device=dev)
    else:
        per_row = q.float() * R[..., 1] - R[..., 0] if vis.kind == "causal" else dist
        distance = per_row[:, live].mean(-1)
        diag = dg[:, live].mean(-1)
    var = sumsq / n - 1.0 / n**2
    out = {
        "entropy": torch.where(dead, nan, h),
        "norm_entropy": torch.where(n > 1, h / torch.log(n).clamp(min=1e-12), nan),
        "max_weight": torch.where(dead, nan, rowmax),
        "read_freq": rf,
        "read_freq_norm": rf / vis.seeing(),
        "diag": diag,
        "distance": distance,
        "variance": var[:, live].mean(-1),
        "head_sim": _cosine(gram),
    }
    if spans is not None:
        to = {"image": R[..., 2], "text": R[..., 1] - R[..., 2]}  # every key is image or text
        frm = {"text": q_rows[1], "image": q_rows[2]}
        block = torch.stack([to[dst] @ frm[src] for src, dst in (b.split("->") for b in BLOCKS)], -1)
        out["blocks"] = block / block.sum(-1, keepdim=True).clamp(min=1e-12)
        out["text_read_freq"] = C[:, 1]
        out["image_share"] = torch.where(dead, nan, R[..., 2])
    return out


def _raise_nonfinite():
    raise AttentionValueError(
        "attention weights contain NaN/inf values: the forward overflowed (fp16?) or a mask row is "
        "fully masked; rerun in float32 or bfloat16"
    )


def text_read_frequency(P: torch.Tensor, spans: Spans, query_positions=None) -> torch.Tensor:
    """Column sums over the text query rows only: ``[..., Sk]`` (how much text reads each key)."""
    P = as_probs(P)
    spans.check(P.shape[-1], "attention map's key axis")
    qk = torch.as_tensor(spans.array, device=P.device)[_query_positions(P, query_positions)]
    return (qk == TEXT).float() @ P


def row_statistics_in_dtype(P: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``entropy``, ``max_weight`` and ``sum_sq`` (the sum of squared weights behind head variance) of
    every row of ``P [..., Sq, Sk]``, computed *in* ``dtype`` and returned as float32 ``[..., Sq]``.
    Only for claim M1 (what half-precision arithmetic does to statistics); real work uses float32."""
    Q = torch.as_tensor(P).to(dtype)
    return {"entropy": (-(Q * torch.log(Q.clamp(min=torch.finfo(dtype).tiny))).sum(-1)).float(),
            "max_weight": Q.amax(-1).float(), "sum_sq": (Q * Q).sum(-1).float()}


# What a diffusion capture keeps for one (sample, part, layer, step); H heads, Si image queries,
# Tr real text keys. Block order is :data:`~unicache_lib.core.modality.BLOCKS`.
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


def _group_entropy(plogp_sum: torch.Tensor, mass: torch.Tensor, k: int) -> torch.Tensor:
    """Normalised entropy of rows restricted to a key group and renormalised, from the group's
    ``sum p log p`` and mass: ``H = log m - (sum p log p) / m``, divided by log(k); 0 for rows with no
    mass there (as renormalising an all-zero row gives), NaN when the group has fewer than 2 keys."""
    if k < 2:
        return torch.full_like(mass, float("nan"))
    m = mass.clamp(min=1e-30)
    h = (torch.log(m) - plogp_sum / m) / math.log(k)
    return torch.where(mass > 0, h, torch.zeros_like(h))


def step_statistics(P, q_kinds, k_kinds, k_real=None, q_weights=None, prev=None) -> dict[str, torch.Tensor]:
    """:data:`STEP_STATS` of one (non-causal) diffusion attention map.

    Args:
        P: ``[H, Sq, Sk]`` probabilities (any dtype; computed in float32), or a :class:`LogitRows` (capture mode
            ``recompute``: the map is formed one row chunk at a time from its logits and never exists whole).
        q_kinds / k_kinds: ``[Sq]`` / ``[Sk]`` modality of each query / key (IMAGE or TEXT).
        k_real: ``[Sk]`` bool, False for padding keys (excluded from ``text_entropy`` and
            ``word_map``); None = all real.
        q_weights: ``[Sq]`` how many query rows of the whole map each row stands for, when ``P`` holds a sample
            of them (:func:`sample_rows`, capture's ``stats_stride``): every mean over rows, the four-block
            shares and the head Gram matrix are weighted by it. None = every row once.
        prev: the previous denoising step's map of the same rows (a tensor or :class:`LogitRows` of
            ``P``'s shape), or None. Given, the step-to-step similarities :func:`map_similarity` returns are
            read in the same pass (each chunk of ``P`` formed once, not twice) and added to the result.

    Read one chunk of query rows at a time (:data:`CHUNK_BYTES`): per chunk one ``p log p`` pass and
    matrix-vector products with the key-group indicators give every group's mass and ``sum p log p`` per
    row (entropies of renormalised sub-rows follow from those), and the chunk's share of the head Gram
    matrix. Temporaries are chunk-sized, so beyond the map itself memory stays bounded (SD3-medium at
    1,024 px: 24 heads x 4,429^2 = 1.9 GB of float32 per map).
    """
    P = P if isinstance(P, LogitRows) else torch.as_tensor(P)
    if len(P.shape) != 3:
        raise InputError(f"step_statistics expects [heads, Sq, Sk], got {tuple(P.shape)}")
    H, sq, sk = P.shape
    dev = P.device
    qk = torch.as_tensor(np.asarray(q_kinds), device=dev)
    kk = torch.as_tensor(np.asarray(k_kinds), device=dev)
    if len(qk) != sq or len(kk) != sk:
        raise InputError(f"kinds cover {len(qk)} queries / {len(kk)} keys, the map is {sq} x {sk}")
    real = torch.ones(sk, dtype=torch.bool, device=dev) if k_real is None else torch.as_tensor(np.asarray(k_real), device=dev)
    nan = torch.full((H,), float("nan"), device=dev)
    wq = None
    if q_weights is not None:
        wq = torch.as_tensor(q_weights, dtype=torch.float32, device=dev)
        if wq.shape != (sq,) or not bool((wq > 0).all()):
            raise InputError(f"q_weights must be [{sq}] positive weights, one per query row, got {tuple(wq.shape)}")
    if prev is not None and tuple(prev.shape) != (H, sq, sk):
        raise InputError(f"prev is {tuple(prev.shape)}, the map is {(H, sq, sk)}: pass the previous step's map of the same rows")
    ki, kt = kk == IMAGE, kk == TEXT
    text_real = kt & real
    # key groups: image, text (padding included), real text, all
    G = torch.stack([ki, kt, text_real, torch.ones_like(ki)], -1).float()  # [Sk, 4]
    widths = [int(ki.sum()), int(kt.sum()), int(text_real.sum()), sk]
    iq, tq = qk == IMAGE, qk == TEXT
    ent = torch.empty(H, sq, 4, device=dev)  # per row and key group: sum p log p
    word = torch.empty(sq, int(text_real.sum()), device=dev)
    sums = _SimilaritySums(H, sq, kk) if prev is not None else None
    streamed = isinstance(P, LogitRows)
    groups = G if streamed else [G[:, 0], G[:, 1], G[:, 2], None]  # one matrix product, or products with vectors
    buf = None if streamed else torch.empty(max(default_chunk_bytes(dev) // 4, H * sk), device=dev)

    def read(r0, r1):
        if streamed:
            blk, logits, lse, p_max = P.parts(r0, r1)
            return blk, p_max, (logits, lse)
        return P[:, r0:r1].float().contiguous(), None, None

    rows = _RowSums(H, sq, groups, dev, wq)
    mass = rows.mass
    for r0, r1, blk, extra in rows.walk(map_chunks(P), read):
        c = r1 - r0
        if streamed:  # from the logits: sum p log p = sum p l - mass * logsumexp(l), no logarithm per entry
            logits, lse = extra
            plogits = _group_sums(logits.mul_(blk).view(H * c, sk), groups, sk).view(H, c, 4)
            ent[:, r0:r1] = plogits - mass[:, r0:r1] * lse[..., None]
        else:
            flat, w = blk.view(H * c, sk), buf[: H * c * sk].view(H * c, sk)
            torch.clamp_min(flat, _TINY, out=w).log_().mul_(flat)  # p log p, 0 where p = 0
            ent[:, r0:r1] = _group_sums(w, groups, sk).view(H, c, 4)
        word[r0:r1] = blk[..., text_real].mean(0)
        if prev is not None:
            sums.add(r0, r1, blk, map_rows(prev, r0, r1))
    rowmax, sumsq, gram = rows.rowmax, rows.sumsq, rows.gram
    if not (torch.isfinite(mass).all() and torch.isfinite(ent).all() and torch.isfinite(gram).all()):
        _raise_nonfinite()

    def rows_mean(x, q):  # x [H, Sq] -> [H], mean over the query rows q (weighted: q_weights); NaN without rows
        return nan if not bool(q.any()) else x[:, q].mean(-1) if wq is None else (x[:, q] * wq[q]).sum(-1) / wq[q].sum()

    cells = _blocks(qk)
    block_mass = torch.stack([mass[:, q, g].sum(-1) if wq is None else mass[:, q, g] @ wq[q] for q, g in cells], -1)
    bent = [rows_mean(_group_entropy(ent[..., g], mass[..., g], widths[g]), q) for q, g in cells]
    whole = _group_entropy(ent[..., 3], mass[..., 3], sk)
    out = {
        "blocks": block_mass / block_mass.sum(-1, keepdim=True).clamp(min=1e-30),
        "block_entropy": torch.stack(bent, -1),
        "row_entropy": torch.stack([rows_mean(whole, iq), rows_mean(whole, tq)], -1),
        "max_weight": torch.stack([rows_mean(rowmax, iq), rows_mean(rowmax, tq)], -1),
        "text_share": rows_mean(mass[..., 1], iq),
        "text_entropy": rows_mean(_group_entropy(ent[..., 2], mass[..., 2], widths[2]), iq),
        "word_map": word[iq],
        "head_sim": _cosine(gram),
        "variance": rows_mean(sumsq / sk - 1.0 / sk**2, iq),
    }
    if prev is not None:
        out.update(sums.cosines(qk, wq))
    return out


def _blocks(q_kinds: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Per block of :data:`BLOCKS` (``src->dst``): the ``src`` query rows ``[Sq]`` (bool) and the ``dst`` key group
    (0: image keys, 1: text keys)."""
    return [(q_kinds == (IMAGE if src == "image" else TEXT), 0 if dst == "image" else 1)
            for src, dst in (b.split("->") for b in BLOCKS)]


class _SimilaritySums:
    """Per query row and key group (image, text): ``Σab``, ``Σa²``, ``Σb²`` of two maps read chunk by chunk."""

    def __init__(self, H: int, sq: int, k_kinds: torch.Tensor):
        self.G = torch.stack([k_kinds == IMAGE, k_kinds == TEXT], -1).float()  # [Sk, 2]
        self.ab, self.aa, self.bb = (torch.empty(H, sq, 2, device=k_kinds.device) for _ in range(3))

    def add(self, r0: int, r1: int, a: torch.Tensor, b: torch.Tensor) -> None:
        self.ab[:, r0:r1] = (a * b) @ self.G  # one product at a time: one chunk-sized temporary, not three
        self.aa[:, r0:r1] = (a * a) @ self.G
        self.bb[:, r0:r1] = (b * b) @ self.G

    def cosines(self, q_kinds: torch.Tensor, wq: torch.Tensor | None) -> dict[str, torch.Tensor]:
        H = self.ab.shape[0]
        sums = [x.sum((1, 2)) if wq is None else x.sum(2) @ wq for x in (self.ab, self.aa, self.bb)]  # a row: wq rows
        sim_all = cosine_from_sums(*sums)
        sim_blocks = torch.full((H, len(BLOCKS)), float("nan"), device=self.ab.device)
        for i, (qs, g) in enumerate(_blocks(q_kinds)):
            if bool(qs.any()) and bool(self.G[:, g].any()):  # within one kind rows weigh alike: no weights needed
                sim_blocks[:, i] = cosine_from_sums(self.ab[:, qs, g].sum(-1), self.aa[:, qs, g].sum(-1),
                                                    self.bb[:, qs, g].sum(-1))
        return {"sim_prev": sim_blocks, "sim_prev_all": sim_all}


def map_similarity(P, prev, q_kinds, k_kinds, q_weights=None) -> dict[str, torch.Tensor]:
    """Step-to-step cosines of two maps of the same rows (tensors or :class:`LogitRows`), read one chunk of query
    rows at a time: ``sim_prev`` ``[H, 4]`` per block of :data:`~unicache_lib.core.modality.BLOCKS` (NaN where a
    block is empty) and ``sim_prev_all`` ``[H]`` of the whole map (rows weighted by ``q_weights`` when they are a
    sample, :func:`sample_rows`). :func:`step_statistics` computes the same in its own pass when given ``prev``."""
    H, sq, sk = P.shape
    if tuple(prev.shape) != (H, sq, sk):
        raise InputError(f"prev is {tuple(prev.shape)}, the map is {(H, sq, sk)}")
    qk = torch.as_tensor(np.asarray(q_kinds), device=P.device)
    kk = torch.as_tensor(np.asarray(k_kinds), device=P.device)
    sums = _SimilaritySums(H, sq, kk)
    for r0, r1 in map_chunks(P):
        sums.add(r0, r1, map_rows(P, r0, r1), map_rows(prev, r0, r1))
    wq = None if q_weights is None else torch.as_tensor(q_weights, dtype=torch.float32, device=P.device)
    return sums.cosines(qk, wq)
