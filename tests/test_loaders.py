"""Loaders on tiny *random* configs (nothing is downloaded). Every understanding family is covered by
tests/test_families.py; here: errors, generators, device and dtype."""
import json

import pytest
import torch

from unicache_lib.runtime.loaders import (UnsupportedModelError, load_generator, load_transformer, load_understanding,
                                      resolve, understanding_family)


def test_unsupported_family_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnsupportedModelError, match=r"LLaVA-1\.5 \(llava\).*Mllama \(mllama\).*To add one"):
        load_understanding(str(tmp_path))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    with pytest.raises(UnsupportedModelError, match="SD3Transformer2DModel"):
        load_transformer(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        understanding_family(tmp_path / "empty")


@pytest.mark.parametrize("family", ["sd3", "pixart"])
def test_generator_families_load_by_class(tmp_path, tokenizer, family):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from unicache_lib.gen_families import GEN_FAMILIES
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.runtime.tiny_layouts import Generator
    from unicache_lib.zoo import tiny_generators as tg

    adapter = next(f for f in GEN_FAMILIES.values() if f.key == family)
    torch.manual_seed(0)
    gen = Generator(adapter, tg.build_transformer(adapter, layers=2), tg.build_text_encoder(tokenizer, layers=1),
                       tokenizer, FlowMatchEulerDiscreteScheduler())
    gen.save_pretrained(tmp_path)
    tr, fam = load_transformer(str(tmp_path))
    assert fam == family
    loaded = load_generator(str(tmp_path))
    a = sample(loaded, ["a red circle on the left"], steps=3, guidance=2.0, seed=7)
    b = sample(loaded, ["a red circle on the left", "a blue square at the top"], steps=3, guidance=2.0, seed=[7, 8])
    assert a.shape == (1, 3, 32, 32) and torch.allclose(a[0], b[0], atol=1e-5)  # per-sample noise
    with pytest.raises(ValueError, match="prompts is empty"):
        sample(loaded, [], steps=2)


def test_dit_family_is_recognised(tmp_path):
    from diffusers import DiTTransformer2DModel

    DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3, num_layers=1,
                          sample_size=8, patch_size=2, norm_num_groups=1).save_pretrained(tmp_path / "transformer")
    assert load_transformer(str(tmp_path))[1] == "dit"


def test_device_and_dtype_parameters(random_llava_dir):
    from unicache_lib.runtime.loaders import resolve_device, resolve_dtype

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("bf16") == torch.bfloat16
    assert resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="DTYPE must be"):
        resolve_dtype("half-ish")
    with pytest.raises(ValueError, match="DEVICE must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use DEVICE='cpu' or 'auto'"):
            resolve_device("cuda")
    model, _ = load_understanding(str(random_llava_dir), dtype="bfloat16", device="auto")
    p = next(model.parameters())
    assert p.dtype == torch.bfloat16 and p.device.type == resolve_device("auto").type


# --- names fail at once, without the network ---------------------------------------------------------------------

@pytest.fixture()
def online(monkeypatch):
    """Offline mode unset, and any network attempt recorded and refused (so a regression fails, not hangs)."""
    import socket

    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network attempted in a test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def test_a_typo_fails_at_once_listing_the_shipped_models_and_families(online):
    import time

    from unicache_lib.runtime.loaders import SHIPPED, ModelNotFoundError

    for load, typo, meant in [(load_understanding, "tiny-lava", "tiny-llava"), (load_generator, "tiny-mdit", "tiny-mmdit")]:
        t0 = time.perf_counter()
        with pytest.raises(ModelNotFoundError, match=f"Did you mean '{meant}'") as e:
            load(typo)
        assert time.perf_counter() - t0 < 5
        msg = str(e.value)
        assert all(name in msg for name in SHIPPED)
        assert "LLaVA-1.5 (llava)" in msg and "Qwen2-VL" in msg and "sd3 (SD3Transformer2DModel)" in msg
    assert online == []  # no network attempt at all


def test_a_missing_folder_says_no_such_folder(tmp_path, online):
    from unicache_lib.runtime.loaders import ModelNotFoundError

    for missing in [str(tmp_path / "nope"), "./no/such/folder", "~/no-such-model-folder", tmp_path / "nope"]:
        with pytest.raises(ModelNotFoundError, match="no such folder"):
            load_understanding(missing)
    assert online == []


def test_a_hub_id_offline_must_be_in_the_cache(tmp_path, monkeypatch):
    import time

    import huggingface_hub.constants

    from unicache_lib.runtime.loaders import ModelNotFoundError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache while offline mode is on"):
        load_understanding("llava-hf/llava-1.5-7b-hf")
    assert time.perf_counter() - t0 < 5
    snap = tmp_path / "hub" / "models--llava-hf--llava-1.5-7b-hf"  # a cached snapshot passes through
    (snap / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (snap / "refs").mkdir()
    (snap / "refs" / "main").write_text("a" * 40)
    assert resolve("llava-hf/llava-1.5-7b-hf") == "llava-hf/llava-1.5-7b-hf"


def test_a_hub_id_passes_through_when_online(online, monkeypatch):
    from unicache_lib.runtime import loaders

    monkeypatch.setattr(loaders, "_hub_reachable", lambda timeout=3.0: True)
    assert resolve("llava-hf/llava-1.5-7b-hf") == "llava-hf/llava-1.5-7b-hf"  # from_pretrained downloads it
    assert online == []


def test_a_hub_id_fails_at_once_when_the_hub_cannot_be_reached(online, tmp_path, monkeypatch):
    """Offline mode unset and no network: one refused connection and a message with the fix, not ~23 s of retries."""
    import time

    import huggingface_hub.constants

    from unicache_lib.runtime.loaders import ModelNotFoundError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"cannot be reached from this machine: download it where there is "
                                                 r"network \(`hf download llava-hf/llava-1.5-7b-hf --local-dir DIR`\)"):
        load_understanding("llava-hf/llava-1.5-7b-hf")
    assert time.perf_counter() - t0 < 5 and len(online) == 1


def test_a_near_typo_suggests_the_model_of_the_same_length_first(online):
    from unicache_lib.runtime.loaders import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="Did you mean 'tiny-llava' or 'tiny-mllama'"):
        load_understanding("tiny-llama")  # the README's typo


def test_the_wrong_kind_of_model_names_the_right_loader():
    from unicache_lib.inputs import InputError

    with pytest.raises(InputError, match="text-to-image generator .* load it with load_generator"):
        load_understanding("tiny-mmdit")
    with pytest.raises(InputError, match="vision-language model \\(model_type 'llava'\\), not a generator: load it with "
                                         "load_understanding"):
        load_generator("tiny-llava")
    assert load_generator("tiny-mmdit").family == "sd3"  # the loader the message names works


@pytest.mark.parametrize("name", ["config.json", "model_card.json"])
def test_a_truncated_json_names_the_file_and_copying_it_again_fixes_it(tmp_path, name):
    import shutil

    from unicache_lib.inputs import InputError

    d = tmp_path / "llava"
    shutil.copytree(resolve("tiny-llava"), d)
    good = (d / name).read_text()
    (d / name).write_text(good[: len(good) // 3])
    with pytest.raises(InputError, match=f"{name} is not valid JSON .* copy it again from the original checkpoint"):
        load_understanding(d, verify=name == "model_card.json")  # the card is read to check the weights
    (d / name).write_text(good)  # the fix: copy the file again
    assert load_understanding(d)[0].config.model_type == "llava"


@pytest.mark.parametrize("model", ["tiny-llava", "tiny-pixart"])
def test_missing_tokenizer_files_are_named_and_copying_them_fixes_it(tmp_path, model):
    import shutil

    from unicache_lib.inputs import InputError

    d = tmp_path / model
    shutil.copytree(resolve(model), d)
    tok = d if model == "tiny-llava" else d / "tokenizer"
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in [f for f in tok.iterdir() if f.name.startswith(("tokenizer", "vocab", "spiece", "merges", "special"))]:
        shutil.move(str(f), moved / f.name)
    load = load_understanding if model == "tiny-llava" else load_generator
    with pytest.raises(InputError, match=f"no tokenizer files in {tok}.*copy the tokenizer files"):
        load(d)
    for f in moved.iterdir():  # the fix: copy them back
        shutil.move(str(f), tok / f.name)
    assert load(d) is not None


# --- weight checksums ---------------------------------------------------------------------------------------------

def _flip_4kb(f):
    b = bytearray(f.read_bytes())
    mid = len(b) // 2
    b[mid:mid + 4096] = bytes(x ^ 0xFF for x in b[mid:mid + 4096])
    f.write_bytes(bytes(b))


def _suggested_command(msg: str, starts: str) -> list[str]:
    import re
    import shlex

    (cmd,) = [c for c in re.findall(r"`([^`]+)`", msg) if c.startswith(starts)]
    return shlex.split(cmd)


def test_corrupted_weights_are_named_and_the_suggested_fixes_work(tmp_path):
    import hashlib
    import shutil
    import subprocess
    import sys

    from unicache_lib.runtime.loaders import MODELS_DIR, ChecksumError

    d = tmp_path / "llava"
    shutil.copytree(MODELS_DIR / "tiny-llava", d)
    expected = json.loads((d / "model_card.json").read_text())["checksums"]["model.safetensors"]
    _flip_4kb(d / "model.safetensors")
    actual = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    with pytest.raises(ChecksumError) as e:
        load_understanding(str(d))
    msg = str(e.value)
    assert str(d / "model.safetensors") in msg and expected in msg and actual in msg and "verify=False" in msg
    load_understanding(str(d), verify=False)  # loading an edited model on purpose
    cmd = _suggested_command(msg, "python -m unicache_lib.runtime.checksums")  # or recording its new weights
    subprocess.run([sys.executable, *cmd[1:]], check=True, capture_output=True)
    load_understanding(str(d))
    (d / "extra.bin").write_bytes(b"x")  # a weight file the card does not record
    with pytest.raises(ChecksumError, match="extra.bin is not recorded"):
        load_understanding(str(d))


def test_recording_checksums_never_writes_through_a_link_and_a_card_names_no_file_outside(tmp_path):
    """Round 15's UN1: on a `cp -rs` copy (every file a link) the ChecksumError's command rewrote the original's card
    through the link, and the original stopped loading; a `cp -al` copy (one inode) the same. UN2: a card naming
    '../secret.txt' or an absolute path made the loader hash a file outside the model folder and print its digest."""
    import hashlib
    import os
    import shutil
    import subprocess
    import sys

    from unicache_lib.runtime.loaders import MODELS_DIR, ChecksumError

    orig, soft, hard = tmp_path / "orig", tmp_path / "soft", tmp_path / "hard"
    shutil.copytree(MODELS_DIR / "tiny-llava", orig)
    card = (orig / "model_card.json").read_bytes()
    for d, link in ((soft, os.symlink), (hard, os.link)):
        d.mkdir()
        for f in orig.iterdir():
            link(f, d / f.name)
        (d / "model.safetensors").unlink()  # the fine-tune's own weights, a regular file
        shutil.copy(orig / "model.safetensors", d / "model.safetensors")
        _flip_4kb(d / "model.safetensors")
        with pytest.raises(ChecksumError) as e:
            load_understanding(str(d))
        cmd = [sys.executable, *_suggested_command(str(e.value), "python -m unicache_lib.runtime.checksums")[1:]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if link is os.symlink:
            assert r.returncode != 0 and "cp --remove-destination" in r.stderr and "Traceback" not in r.stderr
            (d / "model_card.json").unlink()  # the fix it names: a copy of the file in place of the link
            shutil.copy(orig / "model_card.json", d / "model_card.json")
            r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        load_understanding(str(d))  # the fine-tune loads with its new checksums ...
        assert (orig / "model_card.json").read_bytes() == card  # ... and the original's card is untouched
    load_understanding(str(orig))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not a weight")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    for name in ("../secret.txt", str(secret)):
        d = tmp_path / f"named{len(name)}"
        shutil.copytree(orig, d)
        c = json.loads((d / "model_card.json").read_text())
        c["checksums"][name] = "0" * 64
        (d / "model_card.json").write_text(json.dumps(c))
        with pytest.raises(ChecksumError, match="outside the model folder: re-copy the model") as e:
            load_understanding(str(d))
        assert digest not in str(e.value)


def test_a_damaged_generator_names_its_file(tmp_path):
    import shutil

    from unicache_lib.runtime.loaders import MODELS_DIR, ChecksumError

    d = tmp_path / "mmdit"
    shutil.copytree(MODELS_DIR / "tiny-mmdit", d)
    _flip_4kb(d / "text_encoder" / "model.safetensors")
    with pytest.raises(ChecksumError, match="text_encoder/model.safetensors is corrupted"):
        load_generator(str(d))
    with pytest.raises(ChecksumError, match="text_encoder/model.safetensors"):
        load_transformer(str(d))
    assert load_generator(str(d), verify=False).family == "sd3"
    shutil.copy(MODELS_DIR / "tiny-mmdit" / "text_encoder" / "model.safetensors", d / "text_encoder")
    (d / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ChecksumError, match="diffusion_pytorch_model.safetensors is missing"):
        load_transformer(str(d))


def test_a_damaged_shipped_model_is_restored_by_the_suggested_git_command(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from unicache_lib.runtime import loaders

    repo = tmp_path / "repo"  # a clone of its own, so the real data/models is never touched
    shutil.copytree(loaders.MODELS_DIR / "tiny-llava", repo / "data" / "models" / "tiny-llava")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "models"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    monkeypatch.setattr(loaders, "MODELS_DIR", repo / "data" / "models")
    _flip_4kb(repo / "data" / "models" / "tiny-llava" / "model.safetensors")
    with pytest.raises(loaders.ChecksumError, match="restore the shipped copy with `git -C ") as e:
        load_understanding("tiny-llava")
    subprocess.run(_suggested_command(str(e.value), "git "), check=True, capture_output=True)
    load_understanding("tiny-llava")
    card = repo / "data" / "models" / "tiny-llava" / "model_card.json"  # a shipped card must record checksums
    card.write_text(json.dumps({k: v for k, v in json.loads(card.read_text()).items() if k != "checksums"}, indent=1))
    with pytest.raises(loaders.ChecksumError, match="records no weight checksums"):
        load_understanding("tiny-llava")


def test_an_in_place_edit_with_size_and_mtime_restored_is_still_caught(tmp_path):
    """The digest cache must not hide an edit: the weights verified once (cached), then 4 KB flipped in place with the
    size unchanged and the modification time put back, must fail the next load."""
    import os
    import shutil

    from unicache_lib.runtime.loaders import MODELS_DIR, ChecksumError

    d = tmp_path / "llava"
    shutil.copytree(MODELS_DIR / "tiny-llava", d)
    load_understanding(str(d))  # verified, digest cached
    f = d / "model.safetensors"
    st = f.stat()
    _flip_4kb(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(ChecksumError, match="model.safetensors"):
        load_understanding(str(d))
