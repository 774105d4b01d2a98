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


# ---- right at the edges: the methods' published values and their coverage near p = 0.98 -------------------

def _ones(k, n):
    return np.r_[np.ones(k), np.zeros(n - k)]


def _wilson(k, n, z=1.959963984540054):
    p = k / n
    mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return mid - half, mid + half


def test_shares_use_wilson_so_all_correct_is_not_certain():
    iv = I.proportion_interval(np.ones(30), "questions")
    assert (round(iv.lo, 3), round(iv.hi, 3)) == (0.886, 1.0) and iv.method == "Wilson score"
    assert iv.hi - iv.lo > 0.1  # 30 of 30 is not [1, 1]
    iv = I.proportion_interval(_ones(29, 30), "questions")
    assert (iv.lo, iv.hi) == pytest.approx(_wilson(29, 30), abs=1e-9)
    # a mean of 0/1 values is a share: the same interval
    assert I.mean_interval(_ones(29, 30), "questions") == iv


@pytest.mark.parametrize("n", [30, 150])
@pytest.mark.parametrize("p", [0.975, 0.98])
def test_wilson_coverage_near_the_boundary_exact(n, p):
    # Wilson's coverage oscillates with p (0.926 at n = 30, p = 0.985; 0.935 at n = 150, p = 0.99): near 0.98 it holds
    from scipy import stats
    cover = sum(stats.binom.pmf(k, n, p) for k in range(n + 1)
                if (lambda iv: iv.lo <= p <= iv.hi)(I.proportion_interval(_ones(k, n), "questions")))
    assert cover >= 0.94


def test_newcombe_unpaired_matches_the_published_method():
    # statsmodels' confint_proportions_2indep(56, 70, 48, 80, method="newcomb"): (0.0524315, 0.3338727)
    iv = I.difference_interval(_ones(56, 70), _ones(48, 80), "questions", paired=False)
    assert (iv.lo, iv.hi) == pytest.approx((0.0524315, 0.3338727), abs=1e-6) and iv.method == "Newcombe score"
    # and at the boundary: 29/30 against 30/30, (-0.1667039, 0.0834460)
    iv = I.difference_interval(_ones(29, 30), np.ones(30), "questions", paired=False)
    assert (iv.lo, iv.hi) == pytest.approx((-0.1667039, 0.0834460), abs=1e-6)


def _paired_outcomes(rng, n, p_full=0.987, p_method=0.975):
    full = rng.random(n) < p_full
    method = np.where(full, rng.random(n) < p_method / p_full, rng.random(n) < 0.0)
    return method.astype(float), full.astype(float)


@pytest.mark.parametrize("n", [30, 150])
def test_paired_share_difference_and_ratio_cover(n):
    rng = np.random.default_rng(7)
    true_diff, true_ratio, trials = 0.975 - 0.987, 0.975 / 0.987, 600
    hit_d = hit_r = 0
    for _ in range(trials):
        a, b = _paired_outcomes(rng, n)
        d = I.difference_interval(a, b, "questions")
        hit_d += d.lo <= true_diff <= d.hi
        r = I.ratio_interval(a, b, "questions")
        hit_r += r.lo <= true_ratio <= r.hi
        assert d.method == "Newcombe score, paired" and r.method == "Newcombe score ratio, paired"
        assert d.hi > d.lo and r.hi > r.lo  # never zero width, even when both sides are all correct
    assert hit_d / trials >= 0.94 and hit_r / trials >= 0.94


def test_paired_difference_of_identical_shares_is_not_zero_width():
    iv = I.difference_interval(np.ones(30), np.ones(30), "questions")
    assert iv.value == 0 and iv.lo < -0.05 and iv.hi > 0.05
    r = I.ratio_interval(np.ones(30), np.ones(30), "questions")
    assert r.value == 1 and r.lo < 0.95 and r.hi > 1.05


@pytest.mark.parametrize("n,trials", [(30, 2000), (150, 1000)])
def test_bca_mean_coverage(n, trials):
    rng = np.random.default_rng(11)
    hits = sum((lambda iv: iv.lo <= 0.98 <= iv.hi)(I.mean_interval(rng.normal(0.98, 0.05, n), "prompts", n_boot=1000, seed=t))
               for t in range(trials))
    assert hits / trials >= 0.94


def test_continuous_statistics_use_bca_and_say_so():
    rng = np.random.default_rng(12)
    x, y = rng.normal(1, 0.2, 40), rng.normal(2, 0.2, 40)
    for iv in (I.mean_interval(x, "samples"), I.difference_interval(x, y, "samples"),
               I.ratio_interval(x, y, "samples"), I.difference_interval(x, y, "samples", paired=False),
               I.bootstrap(list(x), lambda u: float(np.std(u)), "samples")):
        assert iv.method.startswith(("BCa", "expanded bootstrap percentile")) and iv.lo < iv.value < iv.hi
    iv = I.mean_interval(np.full(5, 0.3), "samples")
    assert iv.lo == iv.hi == 0.3 and iv.method == I.IDENTICAL  # zero width only when every unit is identical


def test_largest_gap_is_decided_statistic_by_statistic():
    """M4's interval: the farthest any per-statistic interval reaches (intersection-union), not a bootstrap of the
    maximum (biased upward by each resample's noise)."""
    import pandas as pd

    from unicache_lib.analysis.capture_claims import largest_gap

    rng = np.random.default_rng(3)
    a = pd.DataFrame({"x": rng.normal(0.5, 0.01, 40), "y": rng.normal(0.2, 0.01, 40)})
    b = pd.DataFrame({"x": rng.normal(0.5, 0.01, 40), "y": rng.normal(0.23, 0.01, 40)})
    iv = largest_gap(a, b)
    per = {c: I.difference_interval(a[c], b[c], "samples per set", paired=False) for c in a}
    assert iv.value == pytest.approx(max(abs(v.value) for v in per.values()))
    assert iv.hi == pytest.approx(max(max(abs(v.lo), abs(v.hi)) for v in per.values()))
    assert 0.02 < iv.lo < iv.value < iv.hi  # y's gap (~0.03) is clearly above 0.02: "below 0.02" does not hold
    assert largest_gap(a, a.sample(frac=1, random_state=0).reset_index(drop=True)).hi < 0.01  # same set: tiny
