"""Round 16 of #60: the store and capture cases (LN5, SN20, SN24, SN26, SN22, SN21)."""
import os

import pytest

from unicache_lib.store import Store

from .test_store_faults import rec


def test_a_set_aside_index_is_never_advised_over_a_live_one(tmp_path):
    """Round 16's LN5: with an index set aside and a newer capture's index live, verify() advised "move its index back
    as index-rank00000.jsonl" (which overwrites the newer index), and once the newer index was itself set aside,
    repair() deleted its chunks as interrupted writes. Now the advice names the free .jsonl.bad and never a move over
    the live index, and repair() keeps the chunks any set-aside index names."""
    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    Store(p).write([rec(1, 0)])
    os.rename(p / "index-rank00000.jsonl", p / "index-rank00000.jsonl.bak")
    Store(p).write([rec(2, 0)])
    Store(p).write([rec(3, 0)])  # a newer capture: its own index, chunks 2 and 3
    advice = [x for x in Store(p).verify() if "not named by any index" in x]
    assert len(advice) == 2 and all("move its index back" not in x and "never move" in x and ".jsonl.bad" in x
                                    for x in advice), advice
    os.rename(p / "index-rank00000.jsonl", p / "index-rank00000.jsonl.new")  # the newer index set aside in turn
    os.rename(p / "index-rank00000.jsonl.bak", p / "index-rank00000.jsonl")  # and the older one back
    advice = [x for x in Store(p).verify() if "not named by any index" in x]
    assert [x.split()[1] for x in advice] == ["rank00000/chunk000002", "rank00000/chunk000003"], advice
    assert all("never move another over it" in x for x in advice) and not any("orphan" in x for x in advice)
    Store(p).repair()
    assert sorted(q.name for q in (p / "rank00000").iterdir()) == [f"chunk{i:06d}" for i in range(4)]
    assert {r.sample for r in Store(p).read()} == {"0", "1"}


def test_a_store_reopened_with_its_own_meta_refuses_another_model(llava, samples, tmp_path):
    """Round 16's SN20: Store(p, meta=Store(p).read_meta()) kept the caller's model_config (capture_samples used
    setdefault), so another model's records went in under the first model's fingerprint. The capture's own
    fingerprint is what is compared now: a caller's meta naming another is refused; the named fix (leave it out) works."""
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.core.errors import StoreError
    from unicache_lib.runtime.loaders import load_understanding

    p = tmp_path / "s"
    capture_samples(*llava, samples[:1], Store(p), layers=[0], progress=False)
    other, proc = load_understanding("tiny-llava", attn_implementation="eager")  # same class, other weights
    meta = {**Store(p).read_meta(), "notes": "run 2"}
    with pytest.raises(StoreError, match=r"the meta given to Store\(.*\) names model_config='LlavaForConditionalGenera"
                                         r"tion:\w+', this model is model_config='LlavaForConditionalGeneration:\w+': "
                                         r"leave model_config out of meta"):
        capture_samples(other, proc, samples[1:2], Store(p, meta=meta), layers=[0], progress=False)
    assert {r.sample for r in Store(p).read()} == {samples[0].id}
    mine = {k: v for k, v in meta.items() if k != "model_config"}
    with pytest.raises(StoreError, match="one store holds one model_config"):  # the fix: the store's check then refuses
        capture_samples(other, proc, samples[1:2], Store(p, meta=mine), layers=[0], progress=False)
    assert len(capture_samples(*llava, samples[1:2], Store(p, meta=mine), layers=[0], progress=False).records) == 1


def test_two_samples_of_one_id_in_one_call_are_refused(llava, tmp_path):
    """Round 16's SN24: two folders merged (both holding img0.png) stored the first picture's records under the second's
    digest and dropped the second's. Refused now, naming the ids, before anything is written."""
    from unicache_lib.capture.runner import capture_samples
    from unicache_lib.core.errors import InputError

    from .test_capture_round15 import _folder

    jan, feb = _folder(tmp_path / "jan", 40), _folder(tmp_path / "feb", 90)
    for store in (Store(tmp_path / "s"), None):
        with pytest.raises(InputError, match=r"sample ids \['img0', 'img1'\] are given twice: each sample needs its own "
                                             r"id \(e.g. prefix them with their folder's name\)"):
            capture_samples(*llava, jan + feb, store, layers=[0], progress=False)
    assert not (tmp_path / "s").exists()


def test_generation_store_of_another_generator_or_text_encoder_is_refused(tmp_path):
    """Round 16's SN26 and SN22: generation_store_or_capture returned a store of tiny-pixart as tiny-mmdit's (it checked
    nothing), and a capture with the same transformer but another text encoder went into a store (the fingerprint
    covered the transformer only). The store's model and model_config (transformer and text encoders) are compared
    now; the generator's own store passes and a missing path captures afresh."""
    import torch

    from unicache_lib.capture.gen_runner import capture_generation, generation_store_or_capture
    from unicache_lib.core.errors import InputError, StoreError
    from unicache_lib.runtime.loaders import load_generator

    mmdit, pixart = load_generator("tiny-mmdit"), load_generator("tiny-pixart")

    def cap(gen, run, store):
        return len(capture_generation(gen, ["a red circle"], run, store, steps=2, progress=False).result.records)

    cap(pixart, "short", Store(tmp_path / "pixart", meta={"model": "tiny-pixart"}))
    cap(pixart, "short", Store(tmp_path / "plain"))
    for p in ("pixart", "plain"):
        with pytest.raises(InputError, match=r"holds '(tiny-pixart|\?)' \(PixArtTransformer2DModel:\w+, transformer "
                                             r"torch.float32\), not 'tiny-mmdit' \(SD3Transformer2DModel:\w+, "
                                             r"transformer torch.float32, text encoders \['torch.float32'\]\): point "
                                             r"to that generator's"):
            generation_store_or_capture(tmp_path / p, tmp_path / "fb", mmdit, "tiny-mmdit", steps=2)
    assert generation_store_or_capture(tmp_path / "pixart", tmp_path / "fb", pixart, "tiny-pixart") == (
        tmp_path / "pixart", False)
    cap(mmdit, "short", Store(tmp_path / "g", meta={"model": "tiny-mmdit"}))
    other = load_generator("tiny-mmdit")
    with torch.no_grad():
        next(other.text_encoder.parameters()).add_(1e-3)  # the same transformer, another text encoder
    with pytest.raises(StoreError, match=r"holds model_config='SD3Transformer2DModel:\w+', this capture is "
                                         r"model_config='SD3Transformer2DModel:\w+'"):
        cap(other, "more", Store(tmp_path / "g"))
    with pytest.raises(InputError, match="not 'tiny-mmdit'"):
        generation_store_or_capture(tmp_path / "g", tmp_path / "fb", other, "tiny-mmdit")
    assert cap(load_generator("tiny-mmdit"), "again", Store(tmp_path / "g")) > 0
    assert generation_store_or_capture(tmp_path / "missing", tmp_path / "fb", mmdit, "tiny-mmdit", 1, 2)[1] is True


def test_stats_store_of_another_checkpoint_of_the_same_class_is_refused(llava, samples, tmp_path):
    """Round 16's SN21: stats_store_or_capture compared only the class of a Store(p) store's model_config, so a capture
    of another checkpoint of the same class (tiny-llava-576, a fine-tune) was read as tiny-llava's. The whole
    fingerprint is compared (in another dtype: tests/test_round17.py)."""
    from unicache_lib.capture.runner import capture_samples, stats_store_or_capture
    from unicache_lib.core.errors import InputError

    p = tmp_path / "s"
    capture_samples(*llava, samples[:1], Store(p), layers=[0], progress=False)  # random weights, tiny-llava's class
    with pytest.raises(InputError, match=r"holds a capture of 'LlavaForConditionalGeneration:\w+', not of 'tiny-llava' "
                                         r"\(LlavaForConditionalGeneration\), whose capture is 'LlavaForConditionalGen"
                                         r"eration:\w+'.*: point to that model's store"):
        stats_store_or_capture(p, tmp_path / "fb", "tiny-llava")
    assert stats_store_or_capture(p, tmp_path / "fb", model=llava[0], processor=llava[1]) == (p, False)


def test_an_offloaded_model_is_refused_in_one_line_before_any_forward():
    """A model offloaded by accelerate (its weights on the ``meta`` device: cpu_offload, a device_map with 'cpu' or
    'disk' parts, init_empty_weights) failed deep inside: the fingerprint with "Cannot copy out of meta tensor", a
    capture with "Tensor.item() cannot be called on meta tensors". Both now refuse it with one InputError naming the
    fix (load the model whole onto one device), and the same model, loaded as advised, fingerprints as before."""
    import torch

    accelerate = pytest.importorskip("accelerate")
    from unicache_lib.capture.runner import capture_samples, model_fingerprint
    from unicache_lib.core.errors import InputError
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.world.samples import load

    model, processor = load_understanding("tiny-llava", attn_implementation="eager")
    before = model_fingerprint(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    for call in (lambda: model_fingerprint(model), lambda: capture_samples(model, processor, load()[:1], progress=False)):
        with pytest.raises(InputError, match=r"meta device .* load the model whole onto one device"):
            call()
    again, _ = load_understanding("tiny-llava", attn_implementation="eager")  # the advice: loaded onto one device
    assert model_fingerprint(again) == before
