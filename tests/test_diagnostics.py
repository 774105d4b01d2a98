"""Diagnostics: AUROC on hand cases, detector verdicts on healthy and broken models, the report."""

import numpy as np
import pytest

from unicache_lib.diagnostics.roc import auroc, rank_average


def test_auroc_hand_cases():
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]) == 0.5  # ties count half
    # 3 positives x 2 negatives: pairs won 5 of 6
    assert auroc([0.9, 0.7, 0.3, 0.4, 0.1], [1, 1, 1, 0, 0]) == pytest.approx(5 / 6)
    assert np.isnan(auroc([0.1, 0.2], [0, 0]))
    with pytest.raises(ValueError):
        auroc([0.1, 0.2], [1])
    assert np.allclose(rank_average([1, 2, 3], [3, 2, 1]), 2 / 3)


def test_auroc_interval_is_stratified_and_reads_the_direction():
    from unicache_lib.diagnostics.roc import auroc_interval, auroc_table, read_auroc

    rng = np.random.default_rng(0)
    y = np.r_[np.ones(20, bool), np.zeros(480, bool)]
    s = np.r_[rng.normal(-1, 1, 20), rng.normal(0, 1, 480)]  # positives score LOWER: inverted separation
    iv = auroc_interval(s, y)
    assert iv.value == pytest.approx(auroc(s, y)) and iv.lo <= iv.value <= iv.hi and iv.hi < 0.5
    assert iv.n == 500 and "20 positive, 480 negative" in iv.unit
    r = read_auroc(iv)
    assert r["direction"] == "inverted" and r["separates"] == "yes" and r["strength"] == pytest.approx(1 - iv.value)
    # a score that carries nothing: the interval straddles 0.5 and the reading says so
    flat = read_auroc(auroc_interval(rng.normal(0, 1, 500), y))
    assert flat["separates"].startswith("no evidence")
    # paired difference: a score against itself is exactly 0 on every resample
    d = auroc_interval(s, y, versus=s)
    assert d.value == 0 and d.lo == 0 and d.hi == 0
    t = auroc_table({"low": s, "high": -s}, y)
    assert list(t.direction) == ["inverted", "as oriented"] and t.strength.nunique() == 1
    with pytest.raises(ValueError, match="at least 2 of each"):
        auroc_interval(s[:21], y[:21] & False | (np.arange(21) == 0))
    ok = np.arange(21) < 2  # the fix the error names: more positives -> it runs
    assert np.isfinite(auroc_interval(s[:21], ok).value)


@pytest.fixture(scope="module")
def llava():
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world import samples as sample_set

    m, p = load_understanding("tiny-llava")
    return m, p, sample_set.load(per_type=1)


def test_detector_quiet_when_healthy_fires_when_masked(llava):
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.broken import mask_image_attention, zero_image_features
    from unicache_lib.diagnostics.neglect import detect_neglect, image_dependence

    m, p, ss = llava
    healthy = detect_neglect(capture_samples(m, p, ss, progress=False).records)
    assert not healthy.fires and healthy.shares.min() > 0.15
    for k in (1, 3):
        with mask_image_attention(m, k):
            v = detect_neglect(capture_samples(m, p, ss, progress=False).records)
        assert v.fires and v.first_cutoff_layer == k and (v.shares[k:] < 1e-6).all()
    # restored: the healthy shares come back exactly
    again = detect_neglect(capture_samples(m, p, ss, progress=False).records)
    assert np.array_equal(again.shares, healthy.shares)
    dep = image_dependence(m, p, ss)
    with zero_image_features(m):
        assert image_dependence(m, p, ss) < 1e-3 < dep  # the image no longer matters


def test_zeroed_image_values_cut_the_image_off_without_moving_attention(llava):
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.broken import zero_image_values
    from unicache_lib.diagnostics.neglect import detect_neglect, image_dependence

    m, p, ss = llava
    healthy = detect_neglect(capture_samples(m, p, ss, progress=False).records)
    dep = image_dependence(m, p, ss)
    with zero_image_values(m, 0):
        broken = detect_neglect(capture_samples(m, p, ss, progress=False).records)
        dep0 = image_dependence(m, p, ss)
    # layer 0's map is computed before any value is read: it cannot move. The answers lose most of
    # their dependence on the image (what is left flows through the attention weights themselves:
    # image keys still decide how much mass the text values get)
    assert abs(broken.shares[0] - healthy.shares[0]) < 1e-6
    assert dep0 < 0.5 * dep
    assert not broken.fires  # a share detector does not see this cut-off
    again = detect_neglect(capture_samples(m, p, ss, progress=False).records)
    assert np.array_equal(again.shares, healthy.shares)  # restored exactly


def test_answer_attention_columns(llava):
    from unicache_lib.diagnostics.hallucination import answer_attention
    from unicache_lib.world.questions import heldout_set

    m, p, _ = llava
    A = answer_attention(m, p, heldout_set(8, seed=1), progress=False)
    assert len(A) == 8 and A.coverage.between(0, 1).all() and A.concentration.between(0, 1).all()
    assert A.confidence.between(0, 1).all() and A.correct.dtype == bool


def test_report_renders_from_small_stores(llava, tmp_path):
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.diagnostics.report import build_report, main
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.store import Store

    m, p, ss = llava
    capture_samples(m, p, ss[:2], Store(tmp_path / "u", meta={"model": "tiny-llava"}), progress=False)
    capture_generation(load_generator("tiny-pixart"), ["a red circle on the left"], "r", Store(tmp_path / "g"), steps=3,
                       progress=False)
    page = build_report({"llava": tmp_path / "u", "pixart": tmp_path / "g"}, tmp_path / "rep")
    text = page.read_text()
    assert text.count("<img") == 4 + 2 and "neglect detector: healthy" in text
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.html").write_text("not ours")
    with pytest.raises(FileExistsError):
        build_report({"llava": tmp_path / "u"}, tmp_path / "other")
    assert (tmp_path / "other" / "report.html").read_text() == "not ours"
    main([str(tmp_path / "u"), f"px={tmp_path / 'g'}", "--out", str(tmp_path / "cli")])
    assert (tmp_path / "cli" / "report.html").exists()
