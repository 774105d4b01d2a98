"""Lesson 04's rule against random (a scorer's Wilson interval against random's band over seeds), the band's error
for too few seeds, and the attention-share timer, on made-up sweeps and a tiny model."""
import numpy as np
import pandas as pd
import pytest
import torch

from unicache_lib.analysis import pruning_claims as PC
from unicache_lib.core.errors import InputError


def sweep(random_acc, scorer_correct, fraction=0.1):
    rows = [{"family": "random", "scorer": f"random#{i}", "fraction": fraction, "accuracy": a, "correct_q": None}
            for i, a in enumerate(random_acc)]
    rows.append({"family": "s", "scorer": "s", "fraction": fraction, "accuracy": float(np.mean(scorer_correct)),
                 "correct_q": np.asarray(scorer_correct, bool)})
    return pd.DataFrame(rows)


def test_random_band_is_the_t_interval_and_refuses_one_seed():
    lo, hi = PC.random_band([0.6, 0.8, 1.0])
    assert lo == pytest.approx(0.8 - 4.3027 * 0.2 / np.sqrt(3), abs=1e-3) and hi == pytest.approx(1.6 - lo)
    with pytest.raises(InputError, match="RANDOM_SEEDS"):
        PC.random_band([0.9])


def test_a_scorer_is_ahead_only_when_its_interval_clears_the_band():
    good = [1] * 970 + [0] * 30  # 0.97 on 1000 questions: Wilson [0.957, 0.979]
    wide = PC.against_random(sweep([0.85, 0.95, 0.60], good))  # three spread seeds: a band reaching past 1
    assert wide.verdict.tolist() == ["inconclusive"]
    narrow = PC.against_random(sweep([0.85, 0.95, 0.60, 0.90, 0.80, 0.70, 0.88, 0.75, 0.92, 0.83], good))
    assert narrow.verdict.tolist() == ["ahead of random"] and narrow.band_hi.iloc[0] < narrow.lo.iloc[0]
    behind = PC.against_random(sweep([0.99, 0.995, 0.992, 0.998], good))
    assert behind.verdict.tolist() == ["behind random"]


def test_attention_share_times_the_units_and_restores_threads():
    class Space:  # what attention_share reads of a HeadSpace
        def __init__(self):
            self.model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
            self.modules = [self.model[0]]

    sp, before = Space(), torch.get_num_threads()
    x = torch.randn(64, 256)
    r = PC.attention_share(sp, lambda: sp.model(x), repeats=3)
    assert 0 < r["share"] < 1 and len(r["shares"]) == 3 and torch.get_num_threads() == before
    assert r["cap"](0.5) == pytest.approx(1 / (1 - 0.5 * r["share"]))
    assert not sp.model[0]._forward_hooks and not sp.model[0]._forward_pre_hooks  # hooks removed
