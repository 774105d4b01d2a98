"""Round 15 of issue #60: inputs that were measured silently wrong (SN18, SN17, SN16, SN10)."""
from __future__ import annotations

import pytest

from unicache_lib.core.errors import InputError


@pytest.fixture(scope="module")
def tiny():
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding("tiny-llava", attn_implementation="eager")


def test_run_eviction_refuses_two_budgets_that_keep_one_token_count(tiny):
    """Round 15's SN18: run_eviction([0.25, 0.255]) on tiny-llava's 64 image tokens measured 16 tokens twice under
    two labels (the refusal lived in budget_shares only); it is refused before any question runs, and the advice
    (token counts) works."""
    from unicache_lib.kv import POLICIES
    from unicache_lib.kv.evaluate import run_eviction
    from unicache_lib.world.questions import heldout_set

    qas = heldout_set(1, seed=2024)
    pols = {"key_coverage": POLICIES["key_coverage"]()}
    with pytest.raises(InputError, match=r"budgets 0\.25 and 0\.255 keep the same 16 of this model's 64 image tokens"):
        run_eviction(*tiny, qas, [0.25, 0.255], pols, progress=False)
    with pytest.raises(InputError, match=r"budgets 0\.01 and 0\.02 keep the same 1 of this model's 64"):
        run_eviction(*tiny, qas, [0.01, 0.02], pols, progress=False)
    R = run_eviction(*tiny, qas, [0.25, 0.27], pols, progress=False)  # 16 and 17 tokens: two rows
    assert sorted(R.budget.unique()) == [0.25, 0.27]
