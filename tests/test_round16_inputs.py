"""Round 16 of issue #60: inputs that were measured silently wrong or files replaced (SN23, SN19, SN25, LN6)."""
from __future__ import annotations

import pytest

from unicache_lib.core.errors import InputError


@pytest.fixture(scope="module")
def tiny():
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding("tiny-llava", attn_implementation="eager")


def test_a_pruning_sweep_refuses_a_nonzero_fraction_that_prunes_no_head(tiny):
    """Round 16's SN23: on tiny-llava's 32 heads FRACTIONS=[0.01, 0.25] (and 0.015625, half a head) pruned 0 heads, and
    the row 'fraction 0.01' was the unpruned model (accuracy 1.00, KL 0). Refused before the reference runs, naming
    the smallest fraction that prunes one; that advice (1/32) works."""
    import numpy as np

    from unicache_lib.pruning.evaluate import sweep_generation, sweep_understanding
    from unicache_lib.pruning.heads import HeadSpace
    from unicache_lib.world.questions import heldout_set

    import warnings

    space = HeadSpace.of(tiny[0])
    warnings.simplefilter("error", UserWarning)  # the warning stops the call before the reference runs
    scores = {"draw": np.random.default_rng(0).random(space.shape)}
    for f in (0.01, 0.015625):
        with pytest.raises(UserWarning, match=rf"fraction {f:g} prunes round\({f:g} x 32\) = 0 heads \(its row is "
                                             r"the unpruned model\): a fraction prunes a head from above 0\.015625; "
                                             r"1/32 = 0\.03125 prunes one"):
            sweep_understanding(None, None, space, scores, [f, 0.25], None)  # None: the reference never ran
    with pytest.raises(UserWarning, match=r"fraction 0\.01 prunes round\(0\.01 x 32\) = 0 heads"):
        sweep_generation(None, space, scores, [0.01], None, None)
    warnings.simplefilter("default", UserWarning)  # the fixes run without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        df = sweep_understanding(*tiny, space, scores, [0.03125, 0.25], heldout_set(1, seed=2024), progress=False)
    assert df.pruned.tolist() == [1, 8] and df.fraction.tolist() == [0.03125, 0.25]


def test_a_model_folder_with_a_linked_sub_folder_has_its_linked_weights_recorded_and_checked(tmp_path, capsys):
    """Round 16's SN19: a generator folder sharing its text encoder through a folder link (`ln -s`): the listing did
    not descend into the link, so the loader called the linked weights "missing", its advised command recorded a card
    without them, and a byte flipped in the shared text encoder then loaded with no word. The card now covers the
    linked weights and the corruption is refused."""
    import json
    import shutil

    from unicache_lib.core.errors import ChecksumError
    from unicache_lib.runtime.checksums import CARD, main, verify_checksums
    from unicache_lib.runtime.loaders import load_generator

    src = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "models" / "tiny-mmdit"
    shared, mine = tmp_path / "shared_text_encoder", tmp_path / "mine"
    shutil.copytree(src / "text_encoder", shared)
    shutil.copytree(src, mine, ignore=shutil.ignore_patterns("text_encoder"))
    (mine / "text_encoder").symlink_to(shared, target_is_directory=True)
    assert verify_checksums(mine) == 2  # the shipped card records both files; both are seen
    main([str(mine)])  # the advised command
    assert "2 weight files recorded" in capsys.readouterr().out
    assert sorted(json.loads((mine / CARD).read_text())["checksums"]) == [
        "text_encoder/model.safetensors", "transformer/diffusion_pytorch_model.safetensors"]
    b = bytearray((shared / "model.safetensors").read_bytes())
    b[len(b) // 2] ^= 0xFF
    (shared / "model.safetensors").write_bytes(bytes(b))
    with pytest.raises(ChecksumError, match=r"weight file .*/mine/text_encoder/model\.safetensors is corrupted"):
        load_generator(str(mine))


def test_the_step_explorer_refuses_a_token_list_that_is_not_the_prompts_real_tokens():
    """Round 16's SN25: the step explorer took any token list up to the padded text length (48), so a doubled '<s>'
    (or one added and the last dropped) labelled the picture reading 'green' as 'a'. The records hold the real count
    (n_text_real) and the captured tokens: both wrong lists are refused, and the capture's own tokens are taken."""
    from tests.test_explorer import lesson_03
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.explorer import step_explorer
    from unicache_lib.runtime.loaders import load_generator

    run = capture_generation(load_generator("tiny-mmdit"), ["a green triangle at the top"], "m", None, steps=2,
                             mode="full", layers=[0], progress=False)
    s, t = run.sample_ids[0], list(run.tokens[0])
    imgs = dict(zip(run.sample_ids, run.images))
    advice = r"give one token per real text key, the tokens capture_generation returned \(its \.tokens; a doubled"
    for bad in (["<s>"] + t, ["<s>"] + t[:-1]):
        with pytest.raises(InputError, match=rf"prompt 'm/0' has {len(bad)} tokens \['<s>', '<s>', 'a'\]\.\.\. but its "
                                             rf"maps \d+ text keys, {len(t)} of them real, captured as \['<s>', 'a', "
                                             rf"'green'\]\.\.\.: {advice}"):
            step_explorer(run.result, imgs, {s: bad})
    assert step_explorer(run.result, imgs, {s: t}).select(word=2).settings()["word"] == "2 'green'"
    res, im3, tk3 = lesson_03(n_prompts=1, steps=2, layers=1, heads=2)  # records without tokens: the count alone
    with pytest.raises(InputError, match=rf"has 9 tokens .* 8 of them real: {advice}"):
        step_explorer(res, im3, {k: ["<s>"] + v for k, v in tk3.items()})


def test_a_rehearsal_subset_never_replaces_the_committed_result(monkeypatch, capsys, tmp_path):
    """Round 16's LN6 neighbour: `python -m unicache_lib.rehearsal` on a subset wrote benchmarks/results/rehearsal.csv
    and docs/REHEARSAL.md; a subset now implies --no-readme and says so, and the committed run still writes them.
    (prefill_parts.py's smoke run: tests/test_benchmarks.py::test_a_smoke_run_never_replaces_the_committed_result.)"""
    from pathlib import Path

    import unicache_lib.rehearsal as rehearsal

    root = Path(__file__).resolve().parents[1]

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(rehearsal, "rehearse", stop)
    files = [root / "benchmarks" / "results" / "rehearsal.csv", root / "docs" / "REHEARSAL.md"]
    before = [f.read_bytes() for f in files]
    with pytest.raises(Stop):
        rehearsal.main(["--models", "qwen2-vl-2b", "--notebooks", "01_capture", "--out", str(tmp_path / "r")])
    assert f"writing the CSV under {tmp_path / 'r'}, not {files[0]} nor {files[1]} (--no-readme)" in \
        capsys.readouterr().out
    assert [f.read_bytes() for f in files] == before
    with pytest.raises(Stop):  # the committed run (make rehearsal) still writes them
        rehearsal.main(["--out", str(tmp_path / "r")])
    assert "writing" not in capsys.readouterr().out

def test_a_model_folder_lists_a_linked_component_folder_but_follows_no_other_link(tmp_path):
    """SN19's fix follows a linked component folder (text_encoder -> a shared copy); a link to `/`, or back up, deeper
    in the folder, is not followed (it would walk the disk, or loop), and a linked component's own sub-folders are not
    walked."""
    import os

    from unicache_lib.runtime.checksums import weight_files

    shared, m = tmp_path / "shared", tmp_path / "m"
    (shared / "deep").mkdir(parents=True)
    (shared / "model.safetensors").write_bytes(b"x")
    (shared / "deep" / "z.bin").write_bytes(b"z")
    (m / "transformer").mkdir(parents=True)
    (m / "transformer" / "a.safetensors").write_bytes(b"a")
    os.symlink(shared, m / "text_encoder")
    os.symlink("/", m / "transformer" / "root")
    os.symlink("..", m / "transformer" / "up")
    os.symlink(tmp_path, m / "outer")
    assert weight_files(m) == ["text_encoder/model.safetensors", "transformer/a.safetensors"]
