"""Step statistics and the step-evolution helpers, on hand-made cases."""
import math

import numpy as np
import pytest
import torch

from unicache_lib.analysis import generation as G
from unicache_lib.modality import BLOCKS, IMAGE, TEXT
from unicache_lib.stats import step_statistics
from unicache_lib.world.text import prompt_set


def test_step_statistics_hand_case():
    # 2 image queries + 1 text query; keys: 2 image + 2 text (the last text key is padding)
    P = torch.tensor([[[0.5, 0.5, 0.0, 0.0],     # image row: all on image keys, uniform
                       [0.25, 0.25, 0.5, 0.0],   # image row: half on the real text key
                       [0.0, 0.0, 0.5, 0.5]]])   # text row
    q = [IMAGE, IMAGE, TEXT]
    k = [IMAGE, IMAGE, TEXT, TEXT]
    s = step_statistics(P, q, k, k_real=[True, True, True, False])
    blocks = dict(zip(BLOCKS, s["blocks"][0].tolist()))
    assert blocks["image->image"] == pytest.approx(1.5 / 3)
    assert blocks["image->text"] == pytest.approx(0.5 / 3)
    assert blocks["text->text"] == pytest.approx(1 / 3)
    assert blocks["text->image"] == pytest.approx(0.0)
    assert s["text_share"][0] == pytest.approx(0.25)
    assert s["word_map"].shape == (2, 1) and s["word_map"][1, 0] == pytest.approx(0.5)
    # image->image restricted rows are uniform over 2 keys: normalised entropy 1
    assert s["block_entropy"][0, BLOCKS.index("image->image")] == pytest.approx(1.0)
    # text row over all 4 keys: two halves -> log 2 / log 4
    assert s["row_entropy"][0, 1] == pytest.approx(math.log(2) / math.log(4))
    assert s["max_weight"][0, 0] == pytest.approx(0.5)


def test_step_statistics_shape_errors():
    with pytest.raises(ValueError, match="kinds cover"):
        step_statistics(torch.ones(1, 2, 2) / 2, [IMAGE], [IMAGE, IMAGE])


def test_phases_follow_the_study():
    phases = [G.phase_of(s, 20) for s in range(20)]
    assert phases.count("early") == 4 and phases.count("middle") == 8 and phases.count("late") == 8
    with pytest.raises(ValueError):
        G.phase_of(20, 20)


def test_knee():
    assert G.knee([np.nan, 0.3, 0.5, 0.8, 0.9, 0.95], 0.7) == 3
    assert G.knee([np.nan, 0.9, 0.5, 0.8], 0.7) == 3  # a dip later moves the knee
    assert G.knee([np.nan, 0.9, 0.95], 0.7) == 1
    assert G.knee([np.nan, 0.5, 0.6], 0.7) is None


def test_regions_and_chance():
    w = np.array([0.1, 0.5, 0.3, 0.05])
    assert G.top_region(w, 2).tolist() == [False, True, True, False]
    assert G.iou(G.top_region(w, 2), [False, True, False, True]) == pytest.approx(1 / 3)
    # chance IoU matches a simulation of random k-subsets
    rng = np.random.default_rng(0)
    n, k = 64, 8
    fixed = np.zeros(n, bool)
    fixed[:k] = True
    sims = [G.iou(fixed, rng.permutation(fixed)) for _ in range(4000)]
    assert G.chance_iou(k, n) == pytest.approx(np.mean(sims), abs=0.01)


def test_prompt_set_is_deterministic_and_balanced():
    a, b = prompt_set(20, 8, seed=3), prompt_set(20, 8, seed=3)
    assert a == b
    pairs = [p for p in a if p["pair"]]
    assert [p["pair"] for p in pairs] == ["same", "different"] * 4
    for p in pairs:
        c = [o["colour"] for o in p["objects"]]
        assert (c[0] == c[1]) == (p["pair"] == "same")
        assert p["objects"][0]["shape"] != p["objects"][1]["shape"]
    for p in a:
        assert len(p["long"].split()) >= 30 and all(o["colour"] in p["short"] for o in p["objects"])


def test_fused_step_statistics_equal_the_direct_definitions(monkeypatch):
    """The fused step statistics (group sums, entropies from sum p log p) equal the definitions computed
    on copied sub-maps, on random maps with every part's layout and masked padding."""
    import math

    import numpy as np
    import torch

    from unicache_lib.modality import BLOCKS, IMAGE, TEXT
    from unicache_lib.stats import step_statistics

    def ent(sub):  # rows renormalised, mean normalised entropy over rows
        k = sub.shape[-1]
        if sub.shape[-2] == 0 or k < 2:
            return torch.full(sub.shape[:1], float("nan"))
        r = sub / sub.sum(-1, keepdim=True).clamp(min=1e-30)
        return (-torch.special.xlogy(r, r).sum(-1) / math.log(k)).mean(-1)

    rng = np.random.default_rng(0)
    for ni, nt, part in [(12, 5, "joint"), (9, 4, "cross"), (10, 0, "self"), (0, 6, "joint"), (7, 1, "joint")]:
        qk = kk = np.r_[np.full(ni, IMAGE), np.full(nt, TEXT)]
        if part == "cross":
            qk, kk = np.full(ni, IMAGE), np.full(nt, TEXT)
        real = np.ones(len(kk), bool)
        real[(kk == TEXT).nonzero()[0][-1:]] = False  # one padding key
        logits = torch.from_numpy(rng.normal(0, 3, (3, len(qk), len(kk)))).float()
        logits[..., ~real] = -float("inf")
        P = torch.softmax(logits, -1)
        got = step_statistics(P, qk, kk, real)
        iq, tq = torch.as_tensor(qk == IMAGE), torch.as_tensor(qk == TEXT)
        ki, kt = torch.as_tensor(kk == IMAGE), torch.as_tensor(kk == TEXT)
        sel = {"image": (iq, ki), "text": (tq, kt)}
        want_ent = []
        for blk in BLOCKS:
            src, dst = blk.split("->")
            want_ent.append(ent(P[:, sel[src][0]][:, :, sel[dst][1]]))
        torch.testing.assert_close(got["block_entropy"], torch.stack(want_ent, -1), equal_nan=True, atol=1e-5, rtol=0)
        torch.testing.assert_close(got["row_entropy"][:, 0], ent(P[:, iq]), equal_nan=True, atol=1e-5, rtol=0)
        on_text = P[:, iq][:, :, torch.as_tensor(real) & kt]
        torch.testing.assert_close(got["text_entropy"], ent(on_text), equal_nan=True, atol=1e-5, rtol=0)
        torch.testing.assert_close(got["word_map"], on_text.mean(0), atol=1e-6, rtol=0)
        with monkeypatch.context() as m:  # read two query rows at a time: the same statistics
            m.setattr("unicache_lib.stats.CHUNK_BYTES", 2 * 3 * len(kk) * 4)
            chunked = step_statistics(P, qk, kk, real)
        for k in got:
            torch.testing.assert_close(chunked[k], got[k], equal_nan=True, atol=1e-6, rtol=0)
