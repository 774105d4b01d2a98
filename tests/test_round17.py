"""Round 17 of #60's adversarial testing (/work/team/adversarial_60_round17.md): each lost or silent case it found,
as a test that fails on the code it was found in."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seeds", [["3"], ["1"], ["2", "1", "4"]], ids=["another", "one-of-them", "more"])
def test_replicate_at_other_seeds_never_replaces_the_committed_table(monkeypatch, capsys, tmp_path, seeds):
    """LN7: `python -m unicache_lib.replicate --seeds 3` replaced data/replicate/verdicts.csv and docs/VERDICTS.md's
    table (only --quick wrote aside). Other seeds than the committed [1, 2] write under --out and say so."""
    import unicache_lib.replicate as R

    boards = {nb: json.loads((ROOT / "data" / "results" / f"{nb}.json").read_text()) for nb in R.NOTEBOOKS}
    monkeypatch.setattr(R, "run_seed", lambda *a, **k: boards)  # the committed scoreboards for hours of notebooks
    files = [R.VERDICTS_CSV, ROOT / "docs" / "VERDICTS.md"]
    before = [f.read_bytes() for f in files]
    R.main(["--seeds", *seeds, "--out", str(tmp_path / "r")])
    said = capsys.readouterr().out
    assert f"not the committed run (seeds [1, 2], or --csv and --readme both or neither): writing what is not named " \
        f"under {tmp_path / 'r'}" in said
    assert [f.read_bytes() for f in files] == before
    assert (tmp_path / "r" / "verdicts.csv").is_file() and (tmp_path / "r" / "README-section.md").is_file()


def test_a_stats_store_is_compared_by_its_whole_fingerprint_in_any_dtype_and_under_any_name(samples, tmp_path):
    """SN27: a store of another checkpoint of the same class captured in bf16 (tiny-llava-576's) was read as
    tiny-llava's: in another dtype only the class was compared. SN28: a store whose meta names the model (as 01 and 02
    write it) was never compared by weights, so a new fine-tune saved into the same folder read the old one's
    statistics. Now the fingerprint is always compared, the weights sampled in the store's dtype (a bf16 capture of
    these float32 weights matches); a half-precision model against a store of another dtype is refused naming the
    dtype to load it in, and loading it so (the advice) is accepted."""
    import torch

    from unicache_lib.capture.runner import capture_samples, stats_store_or_capture
    from unicache_lib.core.errors import InputError
    from unicache_lib.runtime.loaders import load_understanding
    from unicache_lib.store import Store

    llava = load_understanding("tiny-llava", attn_implementation="eager")
    half = load_understanding("tiny-llava", attn_implementation="eager", dtype=torch.bfloat16)
    own, other = tmp_path / "own-bf16", tmp_path / "576-bf16"
    capture_samples(*half, samples[:1], Store(own), layers=[0], progress=False)
    capture_samples(*load_understanding("tiny-llava-576", attn_implementation="eager", dtype=torch.bfloat16),
                    samples[:1], Store(other), layers=[0], progress=False)
    assert stats_store_or_capture(own, tmp_path / "fb", "tiny-llava", model=llava[0], processor=llava[1]) == (own, False)
    with pytest.raises(InputError, match=r"holds a capture of 'LlavaForConditionalGeneration:\w+', not of 'tiny-llava'"):
        stats_store_or_capture(other, tmp_path / "fb", "tiny-llava", model=llava[0], processor=llava[1])  # SN27
    named = tmp_path / "named"  # SN28: 01/02's meta names the model; the weights behind the name changed since
    Store(named, meta={**Store(other).read_meta(), "model": "tiny-llava", "sample_seed": 2024}).write(Store(other).read())
    with pytest.raises(InputError, match=r"holds a capture of .* not of 'tiny-llava'"):
        stats_store_or_capture(named, tmp_path / "fb", "tiny-llava", model=llava[0], processor=llava[1])
    fp32 = tmp_path / "fp32"
    capture_samples(*llava, samples[:1], Store(fp32), layers=[0], progress=False)
    with pytest.raises(InputError, match=r"captured in 'torch.float32', the model is loaded in 'torch.bfloat16'.*load "
                                         r"the model in float32 or in the store's dtype"):
        stats_store_or_capture(fp32, tmp_path / "fb", "tiny-llava", model=half[0], processor=half[1])
    assert stats_store_or_capture(fp32, tmp_path / "fb", "tiny-llava", model=llava[0], processor=llava[1])[1] is False


def test_a_generator_capture_into_a_store_needs_its_text_encoders(tmp_path):
    """SN30: docs/CAPTURE.md's form, DiffusionCapture(gen.transformer, ids, store=store), fingerprinted the transformer
    alone, so a second run with another text encoder went into the same store, and generation_store_or_capture refused
    that store as another generator's. A store capture now needs encoders= (the refusal names text_encoders(gen));
    given them, the store is the generator's (generation_store_or_capture takes it) and another encoder is refused."""
    import torch

    from unicache_lib.capture.diffusion import DiffusionCapture
    from unicache_lib.capture.gen_runner import generation_store_or_capture, text_encoders
    from unicache_lib.core.errors import InputError, StoreError
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.store import Store

    gen = load_generator("tiny-mmdit")
    with pytest.raises(InputError, match=r"pass encoders=text_encoders\(gen\)"):
        with DiffusionCapture(gen.transformer, ["p0"], store=Store(tmp_path / "s"), layers=[0]):
            pass
    assert not (tmp_path / "s" / "meta.json").exists()
    with DiffusionCapture(gen.transformer, ["p0"], store=Store(tmp_path / "s"), layers=[0],
                          encoders=text_encoders(gen)) as cap:  # the advice
        sample(gen, ["a red circle"], steps=2, callbacks=[cap])
    assert generation_store_or_capture(tmp_path / "s", tmp_path / "fb", gen, "tiny-mmdit") == (tmp_path / "s", False)
    other = load_generator("tiny-mmdit")
    with torch.no_grad():
        next(other.text_encoder.parameters()).mul_(1.01)  # the same transformer beside another text encoder
    with pytest.raises(StoreError, match="one store holds one model_config"):
        with DiffusionCapture(other.transformer, ["p1"], store=Store(tmp_path / "s"), layers=[0],
                              encoders=text_encoders(other)):
            pass


def test_a_generator_store_refused_for_a_text_encoder_in_another_dtype_names_each_dtype(tmp_path):
    """G5 (round 21, poor): a store captured with the text encoder in float32 was refused for the same generator with
    its text encoder in bfloat16 naming only the transformer's dtype (float32 on both sides): the message now names
    each text encoder's dtype, and the generator loaded as captured is taken."""
    import torch

    from unicache_lib.capture.diffusion import DiffusionCapture
    from unicache_lib.capture.gen_runner import generation_store_or_capture, text_encoders
    from unicache_lib.core.errors import InputError
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.store import Store

    gen = load_generator("tiny-mmdit")
    with DiffusionCapture(gen.transformer, ["p0"], store=Store(tmp_path / "s"), layers=[0],
                          encoders=text_encoders(gen)) as cap:
        sample(gen, ["a red circle"], steps=2, callbacks=[cap])
    gen.text_encoder.to(torch.bfloat16)
    with pytest.raises(InputError, match=r"text encoders \['torch.bfloat16'\].*every text encoder in the dtypes"):
        generation_store_or_capture(tmp_path / "s", tmp_path / "fb", gen, "tiny-mmdit")
    gen = load_generator("tiny-mmdit")  # loaded as captured (the fix the message names)
    assert generation_store_or_capture(tmp_path / "s", tmp_path / "fb", gen, "tiny-mmdit") == (tmp_path / "s", False)


def test_the_step_explorer_puts_each_word_on_its_own_text_key_when_padding_sits_between(tmp_path):
    """SN29: on an SD3 pipeline (CLIP's 77 positions, padding, then T5's) the step explorer put word i at text key i,
    so every T5 word showed a CLIP padding key's attention. The capture now records the real tokens' positions where
    padding sits among them (text_positions), and the explorer reads each word's row and column there; records of a
    padded prompt without them are refused, naming the recapture."""
    from unicache_lib.capture.gen_runner import capture_generation, prompt_tokens
    from unicache_lib.core.errors import InputError
    from unicache_lib.explorer.payload import step_panels
    from unicache_lib.runtime.loaders import load_generator
    from unicache_lib.zoo.builders.tiny_pipelines import build_tiny

    build_tiny("sd3", tmp_path / "sd3")
    g = load_generator(str(tmp_path / "sd3"))
    prompts = ["a green triangle at the top"]
    names = prompt_tokens(g, prompts)[0]
    real = [i for i, t in enumerate(names) if t is not None]
    assert real != list(range(len(real)))  # the case: padding between CLIP's tokens and T5's
    run = capture_generation(g, prompts, "m", steps=2, mode="full", layers=[0], progress=False)
    r0 = run.result.records[0]
    assert r0.meta["text_positions"] == real
    p = step_panels(run.result, dict(zip(run.sample_ids, run.images)), dict(zip(run.sample_ids, run.tokens)))[0]
    n_img = r0.meta["n_image"]
    assert [int(c) - n_img for c in p.i2t_cols] == real and [int(c) - n_img for c in p.t2i_rows] == real
    assert [names[i] for i in real] == run.tokens[0]  # each label's key holds its token
    for r in run.result.records:
        del r.meta["text_positions"]  # a capture from before this version
    with pytest.raises(InputError, match="do not say which of their .* text keys hold its .* real tokens.*capture it "
                                         "again"):
        step_panels(run.result, dict(zip(run.sample_ids, run.images)), dict(zip(run.sample_ids, run.tokens)))


def test_a_model_folder_named_through_dotdot_lists_what_its_plain_path_lists(tmp_path):
    """Round 17's poor case 1: `x/../m` (a path with `..` in the middle) never matched a linked component folder, so
    that folder's sub-folders were walked and the card recorded a file its plain path's load then called missing."""
    from unicache_lib.runtime.checksums import weight_files

    (tmp_path / "base" / "te" / "old").mkdir(parents=True)
    for f in ("te/model.safetensors", "te/old/model.safetensors"):
        (tmp_path / "base" / f).write_bytes(b"w")
    (tmp_path / "m" / "transformer").mkdir(parents=True)
    (tmp_path / "m" / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"w")
    (tmp_path / "m" / "text_encoder").symlink_to(tmp_path / "base" / "te")
    (tmp_path / "x").mkdir()
    plain = weight_files(tmp_path / "m")
    assert plain == ["text_encoder/model.safetensors", "transformer/diffusion_pytorch_model.safetensors"]
    assert weight_files(f"{tmp_path}/x/../m") == weight_files(f"{tmp_path}/m/") == plain


@pytest.mark.parametrize("back", ["older", "newer"])
def test_repair_never_removes_a_chunk_whose_records_no_index_names(tmp_path, back):
    """LN8: two indexes moved out of the store, then verify's advice followed for one ("move its index back as
    index-rank00000.jsonl"): with the older one back, repair() deleted the newer one's complete chunks as interrupted
    writes (numbered above a named chunk). repair() now removes an unnamed chunk only when every record it holds is
    one the live index names (a write cut off, then written again); these chunks hold records no index names, so they
    are kept, verify says which, and moving the other index back as .jsonl.bad reads nothing twice."""
    import os

    from unicache_lib.store import Store

    from .test_store_faults import rec

    p = tmp_path / "s"
    Store(p, meta={"model": "m"}).write([rec(0, 0)])
    Store(p).write([rec(1, 0)])
    os.rename(p / "index-rank00000.jsonl", tmp_path / "older.jsonl")
    Store(p).write([rec(2, 0)])
    Store(p).write([rec(3, 0)])
    os.rename(p / "index-rank00000.jsonl", tmp_path / "newer.jsonl")
    os.rename(tmp_path / f"{back}.jsonl", p / "index-rank00000.jsonl")  # verify's advice, for one of them
    kept = [x for x in Store(p).verify() if "not named by any index" in x]
    assert len(kept) == 2 and all("is live, never move another over it" in x for x in kept), kept
    Store(p).repair()
    assert sorted(q.name for q in (p / "rank00000").iterdir()) == [f"chunk{i:06d}" for i in range(4)]
    other = "newer" if back == "older" else "older"
    os.rename(tmp_path / f"{other}.jsonl", p / "index-rank00000.jsonl.bad")  # the advice's other half
    assert Store(p).verify() == [] and {r.sample for r in Store(p).read()} == ({"0", "1"} if back == "older" else
                                                                               {"2", "3"})
