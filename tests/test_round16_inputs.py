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

    space = HeadSpace.of(tiny[0])
    scores = {"draw": np.random.default_rng(0).random(space.shape)}
    for f in (0.01, 0.015625):
        with pytest.raises(InputError, match=rf"fraction {f:g} prunes round\({f:g} x 32\) = 0 heads \(its row would be "
                                             r"the unpruned model\): a fraction prunes a head from above 0\.015625; "
                                             r"1/32 = 0\.03125 prunes one"):
            sweep_understanding(None, None, space, scores, [f, 0.25], None)  # None: the reference never ran
    with pytest.raises(InputError, match=r"fraction 0\.01 prunes round\(0\.01 x 32\) = 0 heads"):
        sweep_generation(None, space, scores, [0.01], None, None)
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
