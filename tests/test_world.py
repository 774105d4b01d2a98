import numpy as np
import pytest

from unicache_lib.world import samples as sample_set
from unicache_lib.world.scenes import COLOURS, SCENE_TYPES, make_scene, patch_grid_masks
from unicache_lib.world.segment import classify_shape, score_object
from unicache_lib.world.text import ANSWERS, QUESTION_TYPES, caption, long_prompt, make_qa, short_prompt, vocabulary


def test_scenes_are_deterministic_and_masks_match_pixels():
    a = make_scene(np.random.default_rng(3), "clutter")
    b = make_scene(np.random.default_rng(3), "clutter")
    assert np.array_equal(a.image, b.image) and a.describe() == b.describe()
    for o, m in zip(a.objects, a.masks):
        assert m.any()
        assert np.allclose(a.image[m], COLOURS[o.colour])
    assert len({o.colour for o in a.objects}) == len(a.objects)  # colours distinct
    assert len({o.position for o in a.objects}) == len(a.objects)  # positions distinct
    with pytest.raises(ValueError, match="unknown scene type"):
        make_scene(np.random.default_rng(0), "forest")


@pytest.mark.parametrize("scene_type", SCENE_TYPES)
def test_every_scene_type_renders(scene_type):
    sc = make_scene(np.random.default_rng(1), scene_type)
    assert sc.image.shape == (64, 64, 3) and sc.image.min() >= 0 and sc.image.max() <= 1
    assert patch_grid_masks(sc.masks, 8).shape == (64,)


@pytest.mark.parametrize("qtype", QUESTION_TYPES)
def test_answers_balanced_and_true(qtype):
    rng = np.random.default_rng(0)
    qas = [make_qa(rng, qtype) for _ in range(600)]
    counts = {a: sum(q.answer == a for q in qas) for a in ANSWERS[qtype]}
    # balanced: no answer more than 1.6x the uniform share (text prior ~ 1/k)
    assert max(counts.values()) < 1.6 * len(qas) / len(counts), counts
    for q in qas[:100]:
        objs = q.scene.objects
        if qtype == "colour":
            shape = q.question.split()[-2]
            assert [o.colour for o in objs if o.shape == shape] == [q.answer]
        elif qtype == "shape":
            colour = q.question.split()[-3]
            assert [o.shape for o in objs if o.colour == colour] == [q.answer]
        elif qtype == "position":
            c, s = q.question.split()[-3:-1]
            assert [o.position for o in objs if (o.colour, o.shape) == (c, s)] == [q.answer]
        elif qtype == "exists":
            c, s = q.question.split()[-3:-1]
            assert (q.answer == "yes") == any((o.colour, o.shape) == (c, s) for o in objs)
        else:
            shape = q.question.split()[-2][:-1]
            assert sum(o.shape == shape for o in objs) == ["zero", "one", "two", "three"].index(q.answer)


def test_exists_negatives_hard_by_default_random_on_request():
    """Held-out "is there a ...?" negatives share a colour or a shape with a present object; the training
    curriculum's ``exists_negatives="random"`` asks for any absent colour x shape, mostly of a colour the scene lacks."""
    def negatives(kind):
        rng = np.random.default_rng(3)
        qas = [make_qa(rng, "exists", **({"exists_negatives": kind} if kind else {})) for _ in range(400)]
        return [q for q in qas if q.answer == "no"]

    hard, random_ = negatives(None), negatives("random")
    for qs in (hard, random_):
        for q in qs:
            c, s = q.question.split()[-3:-1]
            assert (c, s) not in {(o.colour, o.shape) for o in q.scene.objects}
    shares = lambda q: any(o.colour == q.question.split()[-3] or o.shape == q.question.split()[-2]
                           for o in q.scene.objects)
    assert all(shares(q) for q in hard)
    colour_absent = np.mean([q.question.split()[-3] not in {o.colour for o in q.scene.objects} for q in random_])
    assert colour_absent > 0.4, colour_absent
    assert [q.question for q in negatives("hard")] == [q.question for q in hard]  # the default is "hard"
    with pytest.raises(ValueError, match="exists_negatives"):
        make_qa(np.random.default_rng(0), "exists", exists_negatives="easy", scene_type="single")


def test_text_uses_only_the_vocabulary():
    rng = np.random.default_rng(0)
    vocab = set(vocabulary())
    for _ in range(200):
        q = make_qa(rng)
        objs = q.scene.describe()
        lp = long_prompt(objs, rng)
        assert len(lp.split()) >= 30
        for text in (q.question, q.answer, caption(q.scene), short_prompt(objs), lp):
            assert set(text.split()) <= vocab, text


def test_standard_set_is_committed_and_reproducible(tmp_path):
    committed = sample_set.load()
    assert len(committed) == 20 and {s.scene_type for s in committed} == set(SCENE_TYPES)
    sample_set.save(sample_set.build(), tmp_path)
    again = sample_set.load(tmp_path)
    for a, b in zip(committed, again):
        assert a.id == b.id and a.question == b.question and a.long_prompt == b.long_prompt
        assert np.array_equal(a.image, b.image) and np.array_equal(a.masks, b.masks)
    assert [s.id for s in sample_set.load(per_type=1)] == [f"{t}-0" for t in SCENE_TYPES]
    with pytest.raises(KeyError, match="unknown sample ids"):
        sample_set.load(ids=["nope"])


def test_sample_seed_regenerates_another_standard_set():
    shipped = sample_set.load(per_type=2)
    same = sample_set.load(per_type=2, seed=sample_set.SEED)  # the default seed is the committed files
    assert all(np.array_equal(a.image, b.image) and a.question == b.question for a, b in zip(shipped, same))
    other = sample_set.load(per_type=2, seed=7)
    assert [s.id for s in other] == [s.id for s in shipped]  # same recipe: ids, scene types, question types
    assert [s.qtype for s in other] == [s.qtype for s in shipped]
    assert sum(np.array_equal(a.image, b.image) for a, b in zip(shipped, other)) == 0  # disjoint images
    again = sample_set.load(per_type=2, seed=7)
    assert all(np.array_equal(a.image, b.image) for a, b in zip(other, again))


def test_segmentation_reads_back_rendered_objects():
    rng = np.random.default_rng(5)
    ok = []
    for _ in range(150):
        sc = make_scene(rng, "single", 32, n_objects=1, radius_range=(0.16, 0.2))
        ok.append(score_object(sc.uint8(), sc.describe()[0]))
    for k in ("colour", "position", "shape"):
        assert np.mean([o[k] for o in ok]) > 0.97, k
    blank = np.zeros((32, 32, 3), np.uint8)
    assert score_object(blank, {"colour": "red", "shape": "circle", "position": "left"}) == {
        "colour": False, "position": False, "shape": False}
    assert classify_shape(np.zeros((32, 32), bool)) is None


def test_scenes_are_drawn_at_the_towers_input_size():
    """Notebook 05 and `make evaluate` draw their questions at the model's own input size (tiny-llava-576: 96 px), so no
    picture is resized on the way in; a tower without a fixed size gets the default."""
    from types import SimpleNamespace

    from unicache_lib.world.questions import heldout_set, scene_size

    assert scene_size(SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(image_size=96)))) == 96
    assert scene_size(SimpleNamespace(config=SimpleNamespace())) == 64
    qs = heldout_set(4, size=96)
    assert qs[0].scene.uint8().shape == (96, 96, 3) and [q.qtype for q in qs] == [q.qtype for q in heldout_set(4)]


def test_a_decisive_run_on_another_model_keeps_its_own_files(tmp_path):
    from unicache_lib.analysis.caching_claims import decisive_file

    assert decisive_file("eviction", "tiny-llava", tmp_path).name == "evaluate_eviction.csv"
    assert decisive_file("eviction", "tiny-llava-576", tmp_path).name == "evaluate_eviction_tiny-llava-576.csv"
    assert decisive_file("controls", "org/My Model", tmp_path).name == "evaluate_controls_org-My-Model.csv"
