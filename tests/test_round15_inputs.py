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


def test_a_pruning_sweep_refuses_two_fractions_that_prune_one_head_count(tiny):
    """Round 15's SN17: on tiny-llava's 32 heads (4 units) fractions 0.12 and 0.14 both prune 4 heads, and 0.9 and
    0.99 both prune the floor's 28: both sweeps measured the one mask twice under two labels (and labelled 28 pruned
    heads 0.99). Refused before the reference runs, naming both fractions and the count; the advice works."""
    import numpy as np

    from unicache_lib.pruning.evaluate import sweep_generation, sweep_understanding
    from unicache_lib.pruning.heads import HeadSpace
    from unicache_lib.world.questions import heldout_set

    import warnings

    space = HeadSpace.of(tiny[0])
    warnings.simplefilter("error", UserWarning)  # the warning stops the call before the reference runs
    scores = {"draw": np.random.default_rng(0).random(space.shape)}
    with pytest.raises(UserWarning, match=r"fractions 0\.12 and 0\.14 both prune 4 of 32 heads: .*drop one"):
        sweep_understanding(None, None, space, scores, [0.0, 0.12, 0.14], None)  # None: the reference never ran
    with pytest.raises(UserWarning, match=r"at most 28 of 32 heads can be pruned \(one per unit stays\): fraction 0\.99 "
                                         r"asks for 32; its row prunes 28; the largest fraction is 0\.875"):
        sweep_generation(None, space, scores, [0.0, 0.99], None, None)
    with pytest.raises(UserWarning, match=r"fractions 0\.86 and 0\.875 both prune 28 of 32"):
        sweep_understanding(None, None, space, scores, [0.0, 0.86, 0.875], None)
    with pytest.raises(UserWarning, match=r"fractions 0 and 0\.01 both prune 0 of 32"):
        sweep_understanding(None, None, space, scores, [0, 0.01], None)
    warnings.simplefilter("default", UserWarning)  # the fixes run without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        df = sweep_understanding(*tiny, space, scores, [0.0, 0.12, 0.875], heldout_set(1, seed=2024), progress=False)
    assert df.pruned.tolist() == [0, 4, 28] and df.fraction.tolist() == [0.0, 0.12, 0.875]


def test_the_explorer_refuses_a_token_list_longer_than_the_sequence_or_shifted():
    """Round 15's SN16: a token list one longer than the sequence (a doubled '<s>' in front) or shifted by one was
    taken, and every word label read the position beside it ("triangle" over the row of "the"); both are refused
    naming the count or the first misplaced position, one short still is, and the captured tokens are taken."""
    from tests.test_explorer import lesson_02
    from unicache_lib.explorer import attention_explorer

    res, imgs, toks, grids, qs = lesson_02(n_samples=2, layers=2, heads=2, seed=5)
    s0, n = "single-0", len(toks["single-0"])
    advice = r"give one token per position, tokenizer\.convert_ids_to_tokens of the captured input_ids"
    with pytest.raises(InputError, match=rf"sample 'single-0' has {n + 1} tokens for a sequence of {n}: {advice}"):
        attention_explorer(res, imgs, {**toks, s0: ["<s>"] + toks[s0]})
    with pytest.raises(InputError, match=rf"has {n - 1} tokens for a sequence of {n}: {advice}"):
        attention_explorer(res, imgs, {**toks, s0: toks[s0][:-1]})
    first = toks[s0].index("<image>")
    with pytest.raises(InputError, match=rf"has {n} tokens for a sequence of {n}, and position {first} holds "
                                         rf"{toks[s0][first - 1]!r} where the image positions \({first}\.\.\d+\) hold "
                                         rf"'<image>' and no other does \(shifted\): {advice}"):
        attention_explorer(res, imgs, {**toks, s0: ["x"] + toks[s0][:-1]})
    words = attention_explorer(res, imgs, toks).data.spec["models"][0]["panels"][0]["words"]
    assert f"{first + 64} {toks[s0][first + 64]!r}" in words  # the first word after the picture, under its own label


def test_a_markerless_copy_with_an_edited_mask_object_prompt_or_a_subset_is_your_own_folder(tmp_path):
    """Round 15's SN10: a generated set copied without its marker stayed "standard" after its masks, objects or
    prompts were edited, or once trimmed to one scene type (only questions, answers and pictures were compared), so
    SAMPLE_SEED=5 measured a synthetic set in place of the user's. Each is now your own folder: seed 5 refused, the
    advised seed (its manifest's) loads the user's edit, and an unedited copy still draws seed 5's set."""
    import json
    import shutil

    import numpy as np

    from unicache_lib.world import samples as S

    gen = tmp_path / "gen"
    S.main(["--out", str(gen)])

    def copy(name):  # `cp gen/* name/`: the marker (a dot file) stays behind
        d = tmp_path / name
        d.mkdir()
        for f in gen.iterdir():
            if not f.name.startswith("."):
                shutil.copy(f, d / f.name)
        return d, json.loads((d / "manifest.json").read_text())

    plain, _ = copy("plain")
    assert len(S.load(plain, seed=5)) == 20 and S.seed_refusal(plain, 5) is None  # unedited: still a standard set
    masked, _ = copy("masked")
    z = dict(np.load(masked / "masks.npz"))
    z["single-0"] = np.zeros_like(z["single-0"])
    z["single-0"][0, :10, :10] = True
    np.savez_compressed(masked / "masks.npz", **z)
    objects, m = copy("objects")
    m["samples"][0]["objects"][0]["colour"] = "purple"
    (objects / "manifest.json").write_text(json.dumps(m))
    prompt, m = copy("prompt")
    m["samples"][0]["long_prompt"] = "my own prompt"
    (prompt / "manifest.json").write_text(json.dumps(m))
    trimmed, m = copy("trimmed")
    m["samples"] = [e for e in m["samples"] if e["scene_type"] == "single"]
    (trimmed / "manifest.json").write_text(json.dumps(m))
    np.savez_compressed(trimmed / "masks.npz", **{k: v for k, v in z.items() if k.startswith("single")})
    for d in (masked, objects, prompt, trimmed):
        with pytest.raises(InputError, match=rf"{d.name} is your own sample folder: .*SAMPLE_SEED=5 would measure a "
                                             r"synthetic standard set .*pass SAMPLE_SEED=2024 \(its manifest's\)"):
            S.load(d, seed=5)
        assert S.seed_refusal(d, 5) is not None
    assert int(S.load(masked, seed=2024, ids=["single-0"])[0].masks.sum()) == 100  # the advice: the user's mask
    assert S.load(objects, seed=None, ids=["single-0"])[0].objects[0]["colour"] == "purple"
    assert {s.scene_type for s in S.load(trimmed, seed=2024)} == {"single"}
