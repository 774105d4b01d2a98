import numpy as np
import pytest
import torch

from unicache_lib.analysis.anchors import anchor_placement, group_stability, layer_persistence, patch_kinds
from unicache_lib.analysis.localisation import selectivity
from unicache_lib.analysis.token_classes import classify_ids, token_class


def test_layer_persistence_and_group_stability():
    reads = torch.tensor([[5.0, 4, 0, 0, 1], [5.0, 4, 0, 1, 0], [0.0, 0, 5, 4, 1]])
    J = layer_persistence(reads, 2)
    assert J[0, 1] == 1.0 and J[0, 2] == 0.0 and np.allclose(np.diag(J), 1)
    g = group_stability({"a": [0, 1], "b": [0, 1], "c": [2, 3]}, {"a": "x", "b": "x", "c": "y"})
    assert g == {"within": 1.0, "across": 0.0, "n_within": 1, "n_across": 2}


def test_patch_kinds_and_anchor_placement():
    masks = np.zeros((1, 16, 16), bool)
    masks[0, :8, :8] = True  # exactly the top-left patch of size 8
    masks[0, 8:12, 8:16] = True  # half of the bottom-right patch
    kinds = patch_kinds(masks, 8)
    assert list(kinds) == [0, 2, 2, 1]
    p = anchor_placement([0, 3], kinds)
    assert p["object"] == 0.5 and p["edge"] == 0.5 and p["background"] == 0.0
    assert p["object_chance"] == 0.25 and p["background_chance"] == 0.5


def test_selectivity_hand_cases():
    po = np.array([0, 0, 1, 1, -1, -1])
    assert selectivity([0.4, 0.4, 0.1, 0.1, 0, 0], po, 0) == pytest.approx(4.0)
    assert selectivity([0.1, 0.1, 0.1, 0.1, 0.3, 0.3], po, 1) == pytest.approx(1.0)
    assert np.isnan(selectivity([1, 1, 1, 1, 1, 1], np.array([0, 0, -1, -1, -1, -1]), 0))  # no other object
    with pytest.raises(ValueError, match="weights for"):
        selectivity([1, 2], po, 0)


def test_token_classes(tokenizer):
    assert [token_class(t) for t in ["red", "▁circle", "Ġleft", "?", "the"]] == \
        ["attribute", "object", "position", "punctuation", "function"]
    ids = tokenizer("where is the red circle ?")["input_ids"]
    assert classify_ids(tokenizer, ids) == ["special", "function", "function", "function", "attribute", "object",
                                            "punctuation"]


def test_a_layer_subset_must_cover_every_band_and_the_suggested_fix_does():
    from unicache_lib.analysis.layers import band_layers, require_bands

    assert require_bands([0, 2, 3], 4) == {"shallow": [0], "middle": [2], "deep": [3]}
    assert require_bands([0, 15, -1], 32) == {"shallow": [0], "middle": [15], "deep": [31]}
    with pytest.raises(ValueError, match=r"deep \(layers 3-3\).*LAYERS = \[0, 2, 3\]"):
        require_bands([0, 2], 4)
    for layers, n in (([0, 2], 4), ([31], 32), ([0, 1], 24)):
        with pytest.raises(ValueError) as e:
            require_bands(layers, n)
        fix = eval(str(e.value).rsplit("LAYERS = ", 1)[1])
        assert set(layers) <= set(fix) and all(require_bands(fix, n)[b] for b in band_layers(n))
    with pytest.raises(ValueError, match="outside"):
        require_bands([4], 4)
