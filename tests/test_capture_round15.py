"""Round 15 of #60: the capture cases (SN8, SN12, SN13, SN14, SN15)."""
import json

import numpy as np
import pytest
from PIL import Image

from unicache_lib.capture.runner import capture_samples
from unicache_lib.core.errors import StoreError
from unicache_lib.store import Store, remove_store
from unicache_lib.world import samples as S


def _folder(d, value):
    d.mkdir()
    for i in range(2):
        Image.fromarray(np.full((64, 64, 3), value + i, np.uint8)).save(d / f"img{i}.png")
    (d / "metadata.jsonl").write_text("".join(json.dumps({"file_name": f"img{i}.png", "question": "what is it?"}) + "\n"
                                              for i in range(2)))
    return S.load(d)


def test_resume_with_another_sample_set_of_the_same_ids_is_refused(llava, tmp_path):
    """Round 15's SN14: a Store(p) capture resumed with another seed's standard set, or another folder of the same
    file names, captured 0 samples and kept the first set's records; now refused, and both fixes it names work."""
    model, proc = llava
    a, b = S.load(ids=["single-0", "text-0"]), S.load(ids=["single-0", "text-0"], seed=5)
    assert [s.id for s in a] == [s.id for s in b]
    p = tmp_path / "st"
    capture_samples(model, proc, a, Store(p), layers=[0], progress=False)
    assert len(capture_samples(model, proc, a, Store(p), layers=[0], progress=False)) == 0  # the same set resumes
    with pytest.raises(StoreError, match=r"sample 'single-0' \(2 in all\) is stored in .* from another picture.*"
                                         r"capture into a new folder, or remove_store"):
        capture_samples(model, proc, b, Store(p, meta={"sample_seed": 5}), layers=[0], progress=False)
    assert len(capture_samples(model, proc, b, Store(tmp_path / "new"), layers=[0], progress=False).samples) == 2
    remove_store(p)  # the other fix the message names
    assert len(capture_samples(model, proc, b, Store(p), layers=[0], progress=False).samples) == 2
    jan, feb = _folder(tmp_path / "jan", 40), _folder(tmp_path / "feb", 200)
    capture_samples(model, proc, jan, Store(tmp_path / "r2"), layers=[0], progress=False)
    with pytest.raises(StoreError, match="sample 'img0' .* from another picture"):
        capture_samples(model, proc, feb, Store(tmp_path / "r2"), layers=[0], progress=False)
    assert {r.meta["sample_digest"] for r in Store(tmp_path / "r2").read()} == \
        {r.meta["sample_digest"] for r in capture_samples(model, proc, jan, None, layers=[0], progress=False)}


def test_fingerprint_sees_a_fine_tune_of_one_projection_or_one_embedding_row(llava, random_llava_dir):
    """Round 15's SN8: the weight sample read the first 256 values of every eighth tensor, so a LoRA merged into q_proj
    alone or a textual-inversion row (the image token's embedding) kept the fingerprint; every tensor is sampled now."""
    import torch

    from unicache_lib.capture.runner import model_fingerprint
    from unicache_lib.runtime.loaders import load_understanding

    base = model_fingerprint(llava[0])
    for what in ("q_proj", "embed_row", "bias"):
        m, _ = load_understanding(str(random_llava_dir), attn_implementation="eager")
        assert model_fingerprint(m) == base  # the same weights loaded again: the same fingerprint
        with torch.no_grad():
            if what == "q_proj":
                next(p for n, p in m.named_parameters() if "language_model" in n and "q_proj" in n).add_(1e-3)
            elif what == "embed_row":
                m.get_input_embeddings().weight[m.config.image_token_id].add_(0.5)
            else:  # one value of a vector past a 256 stride's reach
                v = next(p for p in m.parameters() if p.dim() == 1 and p.numel() > 256)
                v[v.numel() // 2 + 1] += 0.1
        assert model_fingerprint(m) != base, what


def test_layer_batch_below_one_is_refused(llava, samples, tmp_path, capsys):
    """Round 15's SN12: layer_batch=-1 (and unicache-capture --layer-batch -1) made no layer group, so every sample
    ran no forward: nothing captured, nothing stored, no error. Refused now; the fixes it names capture."""
    from unicache_lib.capture import distributed
    from unicache_lib.core.errors import InputError, InputTypeError

    model, proc = llava
    for bad, err in ((-1, InputError), (0, InputError), (1.5, InputTypeError)):
        with pytest.raises(err, match=r"layer_batch \(None: all layers in one forward\) must be"):
            capture_samples(model, proc, samples[:1], Store(tmp_path / "s"), layer_batch=bad, progress=False)
    assert not (tmp_path / "s").exists()
    assert capture_samples(model, proc, samples[:1], None, layer_batch=None, progress=False).layers == [0, 1, 2]
    with pytest.raises(SystemExit) as e:
        distributed.main(["--out", str(tmp_path / "c"), "--n-samples", "1", "--layer-batch", "-1"])
    assert e.value.code == 2 and "--layer-batch must be >= 1 (0, the default: all layers" in capsys.readouterr().err
    distributed.main(["--out", str(tmp_path / "c"), "--n-samples", "1", "--layer-batch", "0"])
    assert "captured 1 samples" in capsys.readouterr().out


def test_stats_store_of_your_folder_or_of_another_model_is_refused(llava, samples, tmp_path):
    """Round 15's SN13: stats_store_or_capture took a store 02 captured on the user's own folder (its meta records
    the default seed) as the standard set's, and a Store(p) store of another model (meta with model_config only) as
    this model's. Both refused now; the standard set's own store passes, and a missing path captures afresh."""
    from unicache_lib.capture.runner import stats_store_or_capture
    from unicache_lib.core.errors import InputError

    model, proc = llava
    meta = {"model": "tiny-llava", "dtype": "torch.float32", "sample_seed": 2024}  # what 02 writes
    mine = _folder(tmp_path / "mine", 40)
    capture_samples(model, proc, mine, Store(tmp_path / "own", meta=meta), layers=[0], progress=False)
    with pytest.raises(InputError, match=r"holds samples that are not the standard set's of sample seed 2024 \('img0', "
                                         r"2 in all.*or to a missing path to capture afresh"):
        stats_store_or_capture(tmp_path / "own", tmp_path / "fb", model=model, processor=proc)
    capture_samples(model, proc, samples[:2], Store(tmp_path / "std", meta=meta), layers=[0], progress=False)
    assert stats_store_or_capture(tmp_path / "std", tmp_path / "fb", model=model, processor=proc) == (tmp_path / "std",
                                                                                                      False)
    recs = Store(tmp_path / "std").read()
    Store(tmp_path / "janus", meta={"dtype": "torch.float32", "model_config": "JanusForConditionalGeneration:d700"}
          ).write(recs)
    for kw in ({}, {"model": model, "processor": proc}):
        with pytest.raises(InputError, match=r"holds a capture of 'JanusForConditionalGeneration:d700', not of "
                                             r"'tiny-llava' \(LlavaForConditionalGeneration\).*missing path"):
            stats_store_or_capture(tmp_path / "janus", tmp_path / "fb", "tiny-llava", **kw)
    from unicache_lib.capture.runner import model_fingerprint
    from unicache_lib.runtime.loaders import load_understanding

    shipped = model_fingerprint(load_understanding("tiny-llava")[0])  # the name the call below defaults to
    Store(tmp_path / "llava", meta={"dtype": "torch.float32", "model_config": shipped}).write(recs)
    assert stats_store_or_capture(tmp_path / "llava", tmp_path / "fb")[1] is False  # tiny-llava's own store
    path, fresh = stats_store_or_capture(tmp_path / "missing", tmp_path / "fb", model=model, processor=proc)
    assert fresh and path == tmp_path / "fb" and len(Store(path).read(layer=0)) == len(S.load())


def test_a_second_generator_into_a_generator_store_is_refused(tmp_path):
    """Round 15's SN15: capture_generation recorded only the dtype in a store's meta, so tiny-pixart's run went into a
    Store(p) store of tiny-mmdit (and into one whose meta names tiny-mmdit) and the report drew both as tiny-mmdit's.
    The transformer's fingerprint is recorded now: refused; the same generator adds a run; both named fixes work."""
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.runtime.loaders import load_generator

    a, b = load_generator("tiny-mmdit"), load_generator("tiny-pixart")

    def cap(gen, run, store):
        return len(capture_generation(gen, ["a red circle"], run, store, steps=2, progress=False).result.records)

    for p, meta in ((tmp_path / "g", None), (tmp_path / "m", {"model": "tiny-mmdit"})):
        assert cap(a, "short", Store(p, meta=meta)) > 0
        with pytest.raises(StoreError, match=r"holds model_config='SD3Transformer2DModel:\w+', this capture is "
                                             r"model_config='PixArtTransformer2DModel:\w+'.*Write to a new folder, or "
                                             r"remove_store"):
            cap(b, "more", Store(p))
    assert cap(load_generator("tiny-mmdit"), "again", Store(tmp_path / "g")) > 0  # the same generator, loaded anew
    assert cap(b, "more", Store(tmp_path / "new")) > 0
    remove_store(tmp_path / "g")
    assert cap(b, "more", Store(tmp_path / "g")) > 0 and Store(tmp_path / "g").read_meta()["model_config"].startswith(
        "PixArt")
