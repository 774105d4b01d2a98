import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_lib import stats as S
from unicache_lib.core.modality import BLOCKS, Spans

from .conftest import random_probs

# Reference statistics, one per function: plain whole-map versions of what the fused, chunked
# S.layer_statistics computes (its results must equal these). Only tests use them.


def visible_keys(P, causal=True, query_positions=None):
    """``[Sq]`` number of keys each query row can see (``Sk`` for non-causal maps)."""
    return S.Visibility.of(P, causal, query_positions).counts()


def max_weight(P):
    """Largest weight of each row: ``[..., Sq]``."""
    return S.as_probs(P).amax(-1)


def diagonal_concentration(P, width=0, query_positions=None):
    """Mean mass within ``width`` positions of the diagonal (``|q - k| <= width``): ``[...]``."""
    P = S.as_probs(P)
    q = S.Visibility.of(P, False, query_positions).q
    k = torch.arange(P.shape[-1])
    band = ((q[:, None] - k[None, :]).abs() <= width).float()
    return (P * band).sum(-1).mean(-1)


def mean_attention_distance(P, query_positions=None):
    """Expected ``|q - k|`` under each row, averaged over rows: ``[...]`` (in positions)."""
    P = S.as_probs(P)
    q = S.Visibility.of(P, False, query_positions).q.float()
    d = (q[:, None] - torch.arange(P.shape[-1], dtype=torch.float32)[None, :]).abs()
    return (P * d).sum(-1).mean(-1)


def head_variance(P, causal=True, query_positions=None):
    """Per-head variance of the weights over each row's visible keys, averaged over live rows: ``[...]``."""
    P = S.as_probs(P)
    vis = S.Visibility.of(P, causal, query_positions)
    S.check_mask(P, vis)
    n = vis.counts().float()
    # rows sum to 1 over their n visible keys (mean 1/n), so var = sum(p^2)/n - 1/n^2
    v = (P * P).sum(-1) / n - 1.0 / n**2
    return v[..., n > 0].mean(-1)


def read_frequency(P, normalise=False, causal=True, query_positions=None):
    """Column sums over query rows, ``[..., Sk]``; with ``normalise`` each divided by how many queries see that key."""
    col = S.as_probs(P).sum(-2)
    return col / S.Visibility.of(P, causal, query_positions).seeing() if normalise else col


def cross_modal_share(P, spans, query_positions=None):
    """Share of attention mass that crosses modalities (image->text + text->image): ``[...]``."""
    s = S.block_shares(P, spans, query_positions)
    return s[..., BLOCKS.index("image->text")] + s[..., BLOCKS.index("text->image")]


def head_similarity(P):
    """Cosine similarity between the flattened maps of every pair of heads: ``[..., H, H]``."""
    f = torch.nn.functional.normalize(S.as_probs(P).flatten(-2), dim=-1)
    return f @ f.transpose(-1, -2)


def test_uniform_and_one_hot_entropy():
    n = 7
    P = torch.full((2, 3, n), 1.0 / n)
    assert torch.allclose(S.row_entropy(P), torch.full((2, 3), math.log(n)), atol=1e-6)
    one = torch.zeros(3, n)
    one[torch.arange(3), torch.tensor([0, 4, 6])] = 1.0
    assert torch.equal(S.row_entropy(one), torch.zeros(3))  # 0 log 0 is 0, not NaN


def test_normalised_entropy_causal_rows():
    # causal uniform map: row i is uniform over i+1 keys -> normalised entropy 1, row 0 undefined
    S_ = 5
    P = torch.tril(torch.ones(S_, S_))
    P = P / P.sum(-1, keepdim=True)
    ne = S.normalised_entropy(P)
    assert math.isnan(ne[0].item())
    assert torch.allclose(ne[1:], torch.ones(S_ - 1), atol=1e-6)


def test_hand_computed_small_map():
    P = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.2, 0.3, 0.5]])
    assert torch.allclose(max_weight(P), torch.tensor([1.0, 0.75, 0.5]))
    assert torch.allclose(read_frequency(P), torch.tensor([1.45, 1.05, 0.5]))
    # normalised: key 0 seen by 3 queries, key 1 by 2, key 2 by 1
    assert torch.allclose(read_frequency(P, normalise=True), torch.tensor([1.45 / 3, 1.05 / 2, 0.5]))
    assert torch.allclose(diagonal_concentration(P), torch.tensor((1.0 + 0.75 + 0.5) / 3))
    # distances: row0 0; row1 0.25*1; row2 0.2*2 + 0.3*1
    assert torch.allclose(mean_attention_distance(P), torch.tensor((0 + 0.25 + 0.7) / 3))
    sp = Spans.from_kinds([1, 1, 0])  # two image tokens then one text token
    shares = S.block_shares(P, sp)
    expected = {"image->image": 1.0 + 1.0, "text->text": 0.5, "image->text": 0.0, "text->image": 0.5}
    for i, name in enumerate(BLOCKS):
        assert shares[i].item() == pytest.approx(expected[name] / 3)
    assert cross_modal_share(P, sp).item() == pytest.approx(0.5 / 3)
    assert torch.allclose(S.text_read_frequency(P, sp), torch.tensor([0.2, 0.3, 0.5]))


def test_head_variance_zero_for_uniform_and_similarity():
    S_ = 6
    P = torch.tril(torch.ones(S_, S_))
    P = (P / P.sum(-1, keepdim=True)).expand(3, S_, S_)
    assert torch.allclose(head_variance(P), torch.zeros(3), atol=1e-8)
    sim = head_similarity(P)
    assert torch.allclose(sim, torch.ones(3, 3), atol=1e-6)
    assert S.mean_offdiag(sim).item() == pytest.approx(1.0, abs=1e-6)


def test_gini_and_top_share():
    assert S.gini(torch.ones(10)).item() == pytest.approx(0.0, abs=1e-6)
    x = torch.zeros(10)
    x[3] = 5
    assert S.gini(x).item() == pytest.approx(0.9, abs=1e-6)
    assert S.top_share(x, 0.1).item() == pytest.approx(1.0)


def test_nan_inf_weights_are_an_error():
    P = torch.full((2, 4, 4), 0.25)
    P[0, 1, 2] = float("nan")
    with pytest.raises(S.AttentionValueError, match="NaN/inf"):
        S.layer_statistics(P)
    P[0, 1, 2] = float("inf")
    with pytest.raises(S.AttentionValueError):
        S.row_entropy(P)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_weights_give_fp32_statistics(dtype):
    rng = np.random.default_rng(0)
    P = random_probs(rng, (4, 20, 20))
    lo = P.to(dtype)
    ref = S.layer_statistics(lo.float())  # the same weights, upcast by hand
    got = S.layer_statistics(lo)
    for k in ref:
        assert got[k].dtype == torch.float32
        assert torch.allclose(got[k].nan_to_num(), ref[k].nan_to_num(), atol=1e-6), k
    # and they stay close to the fp32 statistics of the unrounded map
    assert (S.row_entropy(lo) - S.row_entropy(P)).abs().max() < 0.05


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 24), heads=st.integers(1, 4), causal=st.booleans(),
       n_img=st.integers(0, 24))
def test_properties(seed, n, heads, causal, n_img):
    rng = np.random.default_rng(seed)
    P = random_probs(rng, (heads, n, n), causal=causal)
    h = S.row_entropy(P)
    vis = visible_keys(P, causal).float()
    assert (h >= -1e-5).all() and (h <= torch.log(vis) + 1e-4).all()
    ne = S.normalised_entropy(P, causal)
    fin = ne[~ne.isnan()]
    assert ((fin >= -1e-5) & (fin <= 1 + 1e-4)).all()
    # read frequency sums to the number of query rows
    assert torch.allclose(read_frequency(P, causal=causal).sum(-1), torch.full((heads,), float(n)), atol=1e-3)
    kinds = [1] * min(n_img, n) + [0] * (n - min(n_img, n))
    shares = S.block_shares(P, Spans.from_kinds(kinds))
    assert torch.allclose(shares.sum(-1), torch.ones(heads), atol=1e-5)
    assert (shares >= 0).all()


def test_stats_shapes_and_spans_mismatch():
    rng = np.random.default_rng(1)
    P = random_probs(rng, (3, 10, 10))
    out = S.layer_statistics(P, Spans.from_kinds([1] * 4 + [0] * 6))
    assert out["entropy"].shape == (3, 10) and out["head_sim"].shape == (3, 3) and out["blocks"].shape == (3, 4)
    with pytest.raises(ValueError, match="spans cover 9 positions"):
        S.layer_statistics(P, Spans.from_kinds([1] * 3 + [0] * 6))
    with pytest.raises(ValueError, match=r"\[heads, Sq, Sk\]"):
        S.layer_statistics(P[None])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 20), sq=st.integers(1, 20), causal=st.booleans(),
       n_img=st.integers(1, 20))
def test_fused_layer_statistics_equal_individual_functions(seed, n, sq, causal, n_img):
    rng = np.random.default_rng(seed)
    sq = min(sq, n)
    P = random_probs(rng, (3, n, n), causal=causal)[:, n - sq:]  # the last sq query rows
    sp = Spans.from_kinds([1] * min(n_img, n) + [0] * (n - min(n_img, n)))
    got = S.layer_statistics(P, sp, causal)
    want = {
        "entropy": S.row_entropy(P), "norm_entropy": S.normalised_entropy(P, causal),
        "max_weight": max_weight(P), "read_freq": read_frequency(P, False, causal),
        "read_freq_norm": read_frequency(P, True, causal), "diag": diagonal_concentration(P),
        "distance": mean_attention_distance(P), "variance": head_variance(P, causal),
        "head_sim": head_similarity(P), "blocks": S.block_shares(P, sp),
        "text_read_freq": S.text_read_frequency(P, sp),
        "image_share": P[..., :, torch.as_tensor(sp.array) == 1].sum(-1),
    }
    assert set(got) == set(want) == set(S.LAYER_STATS)
    for k in want:
        assert torch.allclose(got[k].nan_to_num(-1), want[k].nan_to_num(-1), atol=1e-5), k


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40), sq=st.integers(1, 40), kind=st.sampled_from(["causal", "all", "mask"]),
       rows_per_chunk=st.integers(1, 7), dead=st.booleans())
def test_row_chunks_give_the_one_chunk_statistics(seed, n, sq, kind, rows_per_chunk, dead):
    """The map read one chunk of query rows at a time (a few rows per chunk) gives the statistics of one pass."""
    rng = np.random.default_rng(seed)
    sq = min(sq, n)
    H = 3
    if kind == "mask":
        V = torch.from_numpy(rng.random((sq, n)) < 0.6)
        V[:, 0] = True
        if dead:
            V[0] = False  # a gated row sees nothing
        logits = torch.from_numpy(rng.normal(0, 2, (H, sq, n))).float().masked_fill(~V, float("-inf"))
        P = torch.nan_to_num(torch.softmax(logits, -1))
        causal = V
    else:
        P = random_probs(rng, (H, n, n), causal=kind == "causal")[:, n - sq:]
        causal = kind == "causal"
    sp = Spans.from_kinds(list(rng.integers(0, 2, n)))
    one = S.layer_statistics(P, sp, causal, chunk_bytes=1 << 30)
    many = S.layer_statistics(P, sp, causal, chunk_bytes=rows_per_chunk * H * n * 4)
    assert len(S.row_chunks(H, sq, n, rows_per_chunk * H * n * 4)) == -(-sq // rows_per_chunk)
    for k in one:
        assert torch.allclose(one[k].nan_to_num(-1), many[k].nan_to_num(-1), atol=1e-5), k


@pytest.mark.parametrize("mask", ["causal", "additive", "none", "dead"])
def test_statistics_from_logits_equal_those_of_the_softmaxed_map(mask):
    """LogitRows (capture mode recompute) never forms the whole map and takes entropy from the logits
    (logsumexp - sum p l); the statistics equal those of the map softmaxed in one piece."""
    g = torch.Generator().manual_seed(0)
    H, sq, D = 4, 23, 8
    q, k = torch.randn(H, sq, D, generator=g), torch.randn(H, sq, D, generator=g)
    tri = ~torch.ones(sq, sq, dtype=torch.bool).triu(1)
    m = {"causal": tri, "none": None, "dead": tri.clone(),
         "additive": torch.where(tri, 0.0, torch.finfo(torch.float32).min)}[mask]
    if mask == "dead":
        m[:3] = False  # rows that see nothing (gated)
    logits = (q @ k.transpose(-1, -2)) * 0.3
    if m is not None:
        logits = logits.masked_fill(~tri if mask == "additive" else ~m, float("-inf"))
    P = torch.nan_to_num(torch.softmax(logits, -1))
    vis = m if m is not None and m.dtype == torch.bool else (tri if mask == "additive" else False)
    sp = Spans.from_kinds([0] * 3 + [1] * 12 + [0] * 8)
    want = S.layer_statistics(P, sp, vis)
    got = S.layer_statistics(S.LogitRows(q, k, 0.3, m), sp, vis, chunk_bytes=5 * H * sq * 4)
    for name in want:
        assert torch.allclose(got[name].nan_to_num(-1), want[name].nan_to_num(-1), atol=1e-5), name
    assert torch.allclose(S.LogitRows(q, k, 0.3, m).materialize().nan_to_num(), P, atol=1e-6)


def test_logit_rows_take_a_padding_row_mask_over_every_query():
    """A mask of one row ``[1, Sk]`` (padding only) holds for every query row, as sdpa broadcasts it; a
    mask with more rows than queries is read from its last rows, as capture reads the applied mask."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 6, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    pad = torch.tensor([[True] * 5 + [False]])
    want = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~pad, float("-inf")), -1)
    assert torch.allclose(S.LogitRows(q, k, 1.0, pad).materialize(), want, atol=1e-6)
    tall = torch.cat([torch.zeros(3, 6, dtype=torch.bool), pad.expand(6, 6)])  # 9 rows: the last 6 apply
    assert torch.allclose(S.LogitRows(q, k, 1.0, tall).materialize(), want, atol=1e-6)
