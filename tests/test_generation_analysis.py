"""Step statistics and the step-evolution helpers, on hand-made cases."""
import functools
import math

import numpy as np
import pytest
import torch

from unicache_lib.analysis import generation as G
from unicache_lib.core.modality import BLOCKS, IMAGE, TEXT
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

    from unicache_lib.core.modality import BLOCKS, IMAGE, TEXT
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


def _two_blue(shapes=("circle", "circle"), size=32):
    """A generated-looking image: two blue objects left and right on the dark background."""
    from unicache_lib.world.scenes import BACKGROUND, COLOURS, shape_mask

    img = np.tile(np.array(BACKGROUND, np.float32), (size, size, 1))
    for s, cx in zip(shapes, (0.19 * size, 0.81 * size)):
        img[shape_mask(s, cx, size / 2, 0.14 * size, size)] = COLOURS["blue"]
    return img


PAIR = {"id": "p0", "pair": "same", "objects": [{"colour": "blue", "shape": "circle", "position": "left"},
                                                {"colour": "blue", "shape": "square", "position": "right"}]}


def test_object_masks_split_a_same_colour_pair_at_the_middle():
    from unicache_lib.analysis.word_regions import object_masks

    m = object_masks(_two_blue(), PAIR)
    assert m.shape == (2, 32, 32)
    assert m[0, :, 16:].sum() == 0 and m[1, :, :16].sum() == 0 and m[0].sum() > 20 and m[1].sum() > 20
    together = object_masks(_two_blue(), {**PAIR, "pair": "different"})
    assert (together[0] == together[1]).all()  # one colour, no split: both masks hold both blobs
    with pytest.raises(ValueError, match="prompt_set"):
        object_masks(_two_blue(), {"id": "x"})
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        object_masks(np.zeros((32, 32)), PAIR)


def test_drawn_objects_reads_back_a_shape_the_prompt_did_not_ask_for():
    from unicache_lib.analysis.word_regions import drawn_objects

    got = drawn_objects(_two_blue(("circle", "circle")), PAIR)  # asked circle + square, drew two circles
    assert [g["drawn"] for g in got] == ["circle", "circle"] and [g["shape_ok"] for g in got] == [True, False]
    assert got[1]["asked"] == "blue square, right" and got[1]["position"] == "right"
    ok = drawn_objects(_two_blue(("circle", "square")), PAIR)
    assert all(g["shape_ok"] for g in ok)
    red = {**PAIR, "objects": [{**o, "colour": "red"} for o in PAIR["objects"]]}
    assert [g["drawn"] for g in drawn_objects(_two_blue(), red)] == [None, None]  # nothing red drawn


def test_knee_table_and_reuse_window():
    import pandas as pd

    # two layers over 5 steps: layer 0 settles above 0.9 from step 1, layer 1 only from step 3
    sims = {0: [np.nan, 0.95, 0.96, 0.97, 0.98], 1: [np.nan, 0.5, 0.8, 0.95, 0.99]}
    T = pd.DataFrame([{"model": "m", "part": "joint", "layer": li, "step": s, "sim": v, "out_sim_img": 1.0}
                      for li, c in sims.items() for s, v in enumerate(c)])
    K = G.knee_table(T, (0.7, 0.9))
    assert K.loc[("m", "joint", 0), "knee (maps) @0.9"] == 1 and K.loc[("m", "joint", 1), "knee (maps) @0.9"] == 3
    assert K.loc[("m", "joint", 1), "knee (maps) @0.7"] == 2 and K.loc[("m", "joint", 1), "min sim"] == pytest.approx(0.5)
    w = G.reuse_window(K["knee (maps) @0.9"], 5)
    assert w == {"start": 3, "reusable": 1, "head": 0.6}  # the latest layer decides; the last step is computed
    assert G.reuse_window([1, np.nan], 5)["start"] is None  # a layer that never settles: no window to reuse whole steps unchanged
    with pytest.raises(ValueError, match="one knee per layer"):
        G.reuse_window([], 5)
    with pytest.raises(ValueError, match="n_steps"):
        G.reuse_window([1], 1)


def _one_step_records(tr, kw, stride: int) -> list:
    """The records of one forward of ``tr`` captured in stats mode with ``stats_stride=stride`` (sample id "s")."""
    import warnings

    from unicache_lib.capture.diffusion import DiffusionCapture

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with DiffusionCapture(tr, ["s"], mode="stats", stats_stride=stride) as cap:
            tr(**kw)
    return list(cap.result)


def test_sampled_statistics_are_refused_where_they_would_mislead():
    """Records of a stats_stride capture: step_table says their stride; a mix of exact and sampled records is
    refused (and the filter the error suggests works); word_maps says why there are none, and the capture the
    error suggests (stats_stride=1) has them."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.zoo.builders.tiny_random import forward_inputs, tiny_transformer

    tr = tiny_transformer("sd3")
    capture = functools.partial(_one_step_records, tr, forward_inputs("sd3", tr, batch=1))
    exact, sampled = capture(1), capture(4)
    assert set(G.step_table(sampled).stats_stride) == {4} and set(G.step_table(exact).stats_stride) == {1}
    mixed = exact + sampled
    with pytest.raises(InputError, match=r"mix statistics captured with stats_stride \[1, 4\]"):
        G.step_table(mixed)
    with pytest.raises(InputError, match="stats_stride"):
        G.head_redundancy(mixed)
    kept = [r for r in mixed if r.meta.get('stats_stride', 1) == 1]  # the filter the error suggests
    assert len(G.step_table(kept)) == len(exact)
    with pytest.raises(InputError, match="captured with stats_stride=4.*capture again with stats_stride=1"):
        G.word_maps(sampled, "s")
    assert G.word_maps(capture(1), "s").shape[1] == exact[0].meta["n_image"]  # the suggested fix


def test_sampled_rows_are_taken_per_kind_and_weighted_to_the_whole_map():
    """sample_rows: every k-th row of each kind, from k // 2 rows in (at least one row of every kind), weighted by the
    rows it stands for; with the weights the four-block
    shares of a map whose rows are alike within a kind are exact although the sample's kind mix is not."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.stats import sample_rows

    q = np.array([IMAGE] * 7 + [TEXT] * 3)
    rows, w = sample_rows(q, 3)
    assert rows.tolist() == [1, 4, 8] and w.tolist() == [3.5, 3.5, 3.0]
    assert sample_rows(np.array([IMAGE] * 20 + [TEXT] * 2), 13)[0].tolist() == [6, 19, 20]  # a short kind keeps a row
    with pytest.raises(InputError, match="stride"):
        sample_rows(q, 0)
    # image rows: 0.8 on image keys, text rows: 0.4 on image keys (every row alike within its kind)
    k = [IMAGE, IMAGE, TEXT, TEXT]
    P = torch.tensor([[0.4, 0.4, 0.1, 0.1] if x == IMAGE else [0.2, 0.2, 0.3, 0.3] for x in q])[None]
    exact = step_statistics(P, q, k)["blocks"]
    weighted = step_statistics(P[:, rows], q[rows], k, q_weights=w)["blocks"]
    plain = step_statistics(P[:, rows], q[rows], k)["blocks"]
    assert torch.allclose(weighted, exact, atol=1e-6) and not torch.allclose(plain, exact, atol=1e-2)
    with pytest.raises(InputError, match="q_weights"):
        step_statistics(P[:, rows], q[rows], k, q_weights=[1.0, 1.0])


def test_head_analyses_refuse_sampled_records_where_they_would_mislead():
    """head_roles refuses a mix of sampled and exact records; the attention-statistics pruning scorers refuse sampled
    records (head similarity from a sample of rows is the least reliable estimate) and score the exact ones."""
    from unicache_lib.analysis.architectures import head_roles
    from unicache_lib.core.errors import InputError
    from unicache_lib.pruning.heads import HeadSpace
    from unicache_lib.pruning.scorers import SCORERS, ScoringContext
    from unicache_lib.zoo.builders.tiny_random import forward_inputs, tiny_transformer

    tr = tiny_transformer("sd3")
    capture = functools.partial(_one_step_records, tr, forward_inputs("sd3", tr, batch=1))
    exact, sampled = capture(1), capture(4)
    assert len(head_roles(exact, "m")) and len(head_roles(sampled, "m"))
    with pytest.raises(InputError, match="mix statistics captured with stats_stride"):
        head_roles(exact + sampled, "m")
    space = HeadSpace.of(tr)
    for name in ("redundancy", "low_variance", "high_entropy", "attention_combined"):
        with pytest.raises(InputError, match="capture with stats_stride=1"):
            SCORERS[name]()(ScoringContext(space, sampled))
        assert np.isfinite(SCORERS[name]()(ScoringContext(space, exact))).any()  # the suggested capture scores
