"""Bootstrap intervals: coverage on known distributions, degenerate cases, clear errors."""
import numpy as np
import pytest

from unicache_lib import intervals as I


def test_mean_interval_covers_the_true_mean_about_95_percent():
    rng = np.random.default_rng(1)
    hits = 0
    trials = 200
    for t in range(trials):
        x = rng.normal(0.3, 1.0, 60)
        iv = I.mean_interval(x, "samples", n_boot=500, seed=t)
        hits += iv.lo <= 0.3 <= iv.hi
        assert iv.lo <= iv.value <= iv.hi and iv.n == 60 and iv.unit == "samples"
    # percentile bootstrap at n = 60: close to nominal (binomial s.d. over 200 trials ~ 1.5%)
    assert 0.89 <= hits / trials <= 0.99


def test_interval_width_shrinks_like_one_over_sqrt_n():
    rng = np.random.default_rng(2)
    w = {n: (lambda iv: iv.hi - iv.lo)(I.mean_interval(rng.normal(0, 1, n), "questions")) for n in (100, 1600)}
    assert 2.5 < w[100] / w[1600] < 6  # sqrt(16) = 4
    # and matches the normal-theory width 2 * 1.96 / sqrt(n) at n = 1600
    assert w[1600] == pytest.approx(2 * 1.96 / 40, rel=0.15)


def test_degenerate_and_deterministic():
    iv = I.mean_interval(np.full(7, 0.25), "layers")
    assert (iv.value, iv.lo, iv.hi) == (0.25, 0.25, 0.25)
    a = I.mean_interval(np.arange(10.0), "samples", seed=3)
    b = I.mean_interval(np.arange(10.0), "samples", seed=3)
    assert a == b  # fixed seed, same interval


def test_errors_are_clear():
    with pytest.raises(ValueError, match="at least 2 samples, got 1"):
        I.mean_interval([1.0], "samples")
    with pytest.raises(ValueError, match="name the unit"):
        I.mean_interval([1.0, 2.0], "")
    with pytest.raises(ValueError, match="non-finite"):
        I.mean_interval([1.0, float("nan")], "samples")
    with pytest.raises(ValueError, match="same units"):
        I.difference_interval([1.0, 2.0], [1.0, 2.0, 3.0], "questions")
    with pytest.raises(ValueError, match="0/1"):
        I.proportion_interval([0, 1, 2], "questions")
    with pytest.raises(ValueError, match="mean\\(b\\) is 0"):
        I.ratio_interval([1.0, 2.0], [0.0, 0.0], "samples")
    with pytest.raises(ValueError, match=">= 10 interleaved repeats"):
        I.speedup_interval([1.0] * 4, [0.5] * 4)


def test_paired_difference_is_tighter_than_unpaired_on_correlated_units():
    rng = np.random.default_rng(4)
    base = rng.normal(0, 1, 200)  # a per-question difficulty shared by both methods
    a, b = base + 0.1, base + rng.normal(0, 0.05, 200)
    p = I.difference_interval(a, b, "questions")
    u = I.difference_interval(a, b, "questions", paired=False)
    assert p.value == pytest.approx(u.value)
    assert p.lo > 0 and (p.hi - p.lo) < 0.25 * (u.hi - u.lo)
    assert u.lo < 0 < u.hi  # ignoring the pairing loses the effect


def test_proportion_ratio_and_general_bootstrap():
    ok = np.r_[np.ones(90), np.zeros(10)]
    iv = I.proportion_interval(ok, "questions")
    assert iv.value == 0.9 and 0.82 < iv.lo < 0.88 and 0.93 < iv.hi < 0.97
    r = I.ratio_interval(np.full(5, 2.0), np.full(5, 1.0), "samples")
    assert (r.value, r.lo, r.hi) == (2.0, 2.0, 2.0)
    g = I.bootstrap([np.array([1.0, 3.0]), np.array([2.0, 2.0]), np.array([0.0, 4.0])],
                    lambda us: float(np.mean([u.max() for u in us])), "prompts")
    assert g.value == pytest.approx(3.0) and g.lo >= 2.0 and g.hi <= 4.0
    s = I.grouped({"same": [1.0, 1.2, 0.9], "different": [0.2, 0.1, 0.3]}, "prompts",
                  lambda d: np.mean(d["same"]) - np.mean(d["different"]))
    assert s.lo > 0.5 and s.n == 3


def test_speedup_interval_and_interleaved_timings():
    rng = np.random.default_rng(5)
    base = 1.0 + rng.normal(0, 0.05, 12)
    fast = base / 1.5 * (1 + rng.normal(0, 0.01, 12))
    iv = I.speedup_interval(base, fast)
    assert 1.45 < iv.lo <= iv.value <= iv.hi < 1.55 and iv.unit == "repeats"
    order = []
    t = I.interleaved_timings({k: (lambda k=k: order.append(k)) for k in "abcd"}, repeats=10, seed=0)
    assert set(t) == set("abcd") and all(len(v) == 10 and (v >= 0).all() for v in t.values())
    rounds = [tuple(order[4 * i:4 * i + 4]) for i in range(10)]
    assert all(sorted(r) == list("abcd") for r in rounds)  # each round runs every label once
    assert len(set(rounds)) > 1  # and the order is shuffled between rounds


def test_n_to_settle():
    iv = I.Interval(0.52, 0.48, 0.56, 100, "questions", se=0.02)
    # the side towards 0.5 is 0.04 wide and must shrink to the gap 0.02: n * (0.04 / 0.02)^2 = 400
    assert I.n_to_settle(iv, 0.5) == 400
    # a skewed interval: the side that crosses the threshold decides
    assert I.n_to_settle(I.Interval(1.06, 1.05, 2.0, 3, "samples", se=0.2), 1.5) == pytest.approx(3 * (0.94 / 0.44) ** 2, abs=1)
    assert I.n_to_settle(I.Interval(0.5, 0.4, 0.6, 10, "samples", se=0.05), 0.5) == float("inf")
