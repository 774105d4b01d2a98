"""Your own samples (#28): the imagefolder layout (metadata.jsonl) and LLaVA-style conversations JSON, read by
``samples.load(path)`` exactly as the shipped set is; the shipped set exported in that layout reads back identically
and through ``datasets``; a bad folder gets one error naming the file and the fix, before any model loads."""
import json

import numpy as np
import pytest
from PIL import Image

from unicache_lib.core.errors import UnicacheError
from unicache_lib.world import samples as S


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return S.export_folder(S.load(), tmp_path_factory.mktemp("mine"))


def test_the_shipped_set_exported_reads_back_identically(folder):
    a, b = S.load(), S.load(folder)
    assert [s.id for s in a] == [s.id for s in b]
    for x, y in zip(a, b):
        assert np.array_equal(x.image, y.image) and np.array_equal(x.masks, y.masks)
        assert (x.question, x.answer, x.objects, x.qtype, x.scene_type) == (y.question, y.answer, y.objects, y.qtype, y.scene_type)
    assert [s.id for s in S.load(folder, per_type=1)] == [s.id for s in S.load(per_type=1)]


def test_datasets_reads_the_exported_folder(folder):
    import datasets

    ds = datasets.load_dataset("imagefolder", data_dir=str(folder), split="train")
    assert len(ds) == 20 and {"image", "question", "answer"} <= set(ds.column_names)


def test_a_folder_without_answers_or_masks_reads_with_them_empty(tmp_path):
    Image.fromarray(np.zeros((32, 48, 3), np.uint8)).save(tmp_path / "cat.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "cat.png", "question": "what is it ?"}) + "\n")
    (s,) = S.load(tmp_path)
    assert (s.id, s.answer, s.objects, s.masks.shape) == ("cat", None, [], (0, 32, 48))


def test_a_llava_style_conversations_json(tmp_path):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "questions.json").write_text(json.dumps([{"id": "q1", "image": "a.png", "conversations": [
        {"from": "human", "value": "<image>\nwhat colour is it ?"}, {"from": "gpt", "value": "black"}]}]))
    (s,) = S.load(tmp_path)
    assert (s.id, s.question, s.answer) == ("q1", "what colour is it ?", "black")


def test_bad_folders_are_refused_naming_the_file_and_the_fix(tmp_path, folder):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    meta = tmp_path / "metadata.jsonl"
    cases = [('{"file_name": "a.png", "question": "q"', r"line 1: not JSON"),
             ('{"file_name": "a.png"}', r"line 1: no 'question'.*needs file_name, question"),
             ('{"file_name": "b.png", "question": "q"}', r"metadata.jsonl, line 1: .*b.png is listed but not there")]
    for line, msg in cases:
        meta.write_text(line + "\n")
        with pytest.raises(UnicacheError, match=msg):
            S.load(tmp_path)
    (tmp_path / "c.png").write_text("not an image")
    meta.write_text('{"file_name": "c.png", "question": "q"}\n')
    with pytest.raises(UnicacheError, match=r"c.png is not a readable image.*re-save it"):
        S.load(tmp_path)
    meta.write_text('{"file_name": "a.png", "question": "q"}\n')  # the fixes the messages name: the folder reads
    np.savez(tmp_path / "masks.npz", **{"a.png": np.zeros((1, 4, 4), bool)})
    with pytest.raises(UnicacheError, match=r"masks.npz\['a.png'\] is \(1, 4, 4\), not \[n_objects, 8, 8\]"):
        S.load(tmp_path)
    np.savez(tmp_path / "masks.npz", **{"a.png": np.zeros((1, 8, 8), bool)})
    assert S.load(tmp_path)[0].masks.shape == (1, 8, 8)
    with pytest.raises(UnicacheError, match="pass SAMPLE_SEED=2024 \\(the default\\)"):
        S.load(folder, seed=7)
    assert len(S.load(folder, seed=S.SEED)) == len(S.load(folder, seed=None)) == 20  # the fix: the default seed
    with pytest.raises(UnicacheError, match="imagefolder layout"):
        S.load(tmp_path / "nothing-here")


def test_prompts_jsonl_round_trip_and_refusals(tmp_path):
    from unicache_lib.world.text import export_prompts, prompt_set, read_prompts

    ps = prompt_set(6, 0, 0)
    back = read_prompts(export_prompts(ps, tmp_path / "prompts.jsonl"))
    assert [(p["short"], p["long"], p["objects"]) for p in back] == [(p["short"], p["long"], p["objects"]) for p in ps]
    (tmp_path / "mine.jsonl").write_text('{"prompt": "a cat"}\n')
    assert read_prompts(tmp_path / "mine.jsonl")[0]["objects"] == []  # nothing to check prompt-following against
    (tmp_path / "bad.jsonl").write_text('{"text": "a cat"}\n')
    with pytest.raises(UnicacheError, match=r"line 1: no 'prompt' text"):
        read_prompts(tmp_path / "bad.jsonl")


def test_your_prompts_file_reads_back_as_the_prompt_set(tmp_path):
    """The synthetic prompts exported as prompts.jsonl (make samples) load as exactly the dicts prompt_set makes
    (pairs and their kinds recovered from the objects), so a notebook run on the file is the built-in run; too few
    prompts of a kind, or malformed objects, are refused naming the fix; an object the detector does not know is
    scored NaN, not wrong."""
    import numpy as np

    from unicache_lib.core.errors import InputError
    from unicache_lib.world.segment import score_object
    from unicache_lib.world.text import export_prompts, load_prompts, prompt_set

    want = prompt_set(5, 4, 3)
    path = export_prompts(want, tmp_path / "prompts.jsonl")
    assert load_prompts(path, 5, 4) == want
    assert load_prompts(None, 5, 4, 3) == want
    with pytest.raises(InputError, match="5 prompts that are not two-object pairs and 4 two-object pairs; 6 and 4"):
        load_prompts(path, 6, 4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a cat", "objects": "cat"}\n')
    with pytest.raises(InputError, match="line 1: 'objects' must be a list"):
        load_prompts(bad, 1)
    img = np.zeros((32, 32, 3), np.uint8)
    assert all(np.isnan(v) for v in score_object(img, {"colour": "orange", "shape": "fox", "position": "left"}).values())
    assert all(np.isnan(v) for v in score_object(img, None).values())


def test_your_folder_as_eviction_questions(tmp_path):
    """Notebook 05's SAMPLES: an exported folder gives the questions, answers and pictures of the shipped set; a
    folder without answers is refused before any model loads, naming the fix (eviction is scored on answers)."""
    import numpy as np

    from unicache_lib.core.errors import InputError
    from unicache_lib.world import samples as S

    shipped = S.load(per_type=1)
    qas = S.as_questions(S.load(S.export_folder(shipped, tmp_path / "mine")))
    assert [(q.question, q.answer, q.qtype) for q in qas] == [(s.question, s.answer, s.qtype) for s in shipped]
    assert all(np.array_equal(q.scene.uint8(), s.image) and q.scene.scene_type == s.scene_type for q, s in zip(qas, shipped))
    shipped[0].answer = ""
    with pytest.raises(InputError, match="1 of 5 samples have no answer .* add an 'answer'"):
        S.as_questions(shipped)


def test_more_samples_per_type_than_the_committed_set(tmp_path):
    """PER_TYPE above the committed set's 4 is refused on the shipped seed (never silently fewer), and the fix the
    message names (another SAMPLE_SEED) builds that many per type."""
    from unicache_lib.core.errors import InputError
    from unicache_lib.world import samples as S

    with pytest.raises(InputError, match="4 samples per scene type, 6 were asked for: pass another SAMPLE_SEED"):
        S.load(per_type=6)
    big = S.load(per_type=6, seed=11)
    assert len(big) == 30 and len({s.id for s in big}) == 30


def test_answers_and_pairs_of_your_own_data_are_read_as_scored(tmp_path):
    """A real tokenizer's first token ('▁Red', 'ĠRed') matches the answer 'red'; a multi-word answer is refused (the
    first token cannot match it); only two objects of different shapes, left then right, are a G9 pair (the layout
    the pixel split assumes), and only a one-object prompt is scored for prompt following."""
    import json

    from unicache_lib.core.errors import InputError
    from unicache_lib.core.scoring import same_answer
    from unicache_lib.world import samples as S
    from unicache_lib.world.text import read_prompts, single_object

    assert same_answer("\u2581Red", "red") and same_answer("\u0120red", " Red ") and same_answer("2", 2)
    assert not same_answer("\u2581blue", "red")
    shipped = S.load(per_type=1)
    shipped[1].answer = "a red circle"
    with pytest.raises(InputError, match="1 of 5 answers are not one word .* give a one-word 'answer'"):
        S.as_questions(shipped)
    o = {"colour": "red", "shape": "circle", "position": "left"}
    rows = [{"prompt": "p", "objects": [o, {**o, "shape": "square", "position": "right"}]},
            {"prompt": "q", "objects": [o, {**o, "shape": "square", "position": "top"}]},
            {"prompt": "r", "objects": [o, {**o, "position": "right"}]}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_prompts(tmp_path)
    assert [p["pair"] for p in got] == ["same", "", ""]
    assert single_object(got[1]) is None and single_object({"objects": [o]}) == o
