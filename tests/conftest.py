import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str):
    """The script benchmarks/NAME.py as a module, imported as the scripts import each other (their folder on sys.path
    meanwhile, then taken off again)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="session")
def tokenizer():
    from unicache_lib.zoo import tiny_llava as tl

    return tl.build_tokenizer()


@pytest.fixture(scope="session")
def random_llava_dir(tmp_path_factory, tokenizer):
    """A randomly initialised tiny LLaVA saved with save_pretrained (processor included)."""
    from transformers import LlavaForConditionalGeneration

    from unicache_lib.zoo import tiny_llava as tl

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("random-llava")
    LlavaForConditionalGeneration(tl.build_config(tokenizer, lm_layers=3, lm_heads=4, kv_heads=2)).save_pretrained(d)
    tl.build_processor(tokenizer).save_pretrained(d)
    return d


@pytest.fixture()
def llava(random_llava_dir):
    """(model, processor) in eager mode, fp32."""
    from unicache_lib.runtime.loaders import load_understanding

    return load_understanding(str(random_llava_dir), attn_implementation="eager")


@pytest.fixture(scope="session")
def samples():
    from unicache_lib.world import samples as s

    return s.load()


@pytest.fixture()
def one_input(llava, samples):
    from unicache_lib.capture.runner import model_inputs, spans_fn

    model, processor = llava
    inputs = model_inputs(processor, samples[0].image, samples[0].question)
    return inputs, spans_fn(model)(inputs["input_ids"])


def random_probs(rng: np.random.Generator, shape, causal=True, zeros=0.0):
    """Valid attention probabilities [..., S, S] (rows sum to 1 over visible keys)."""
    logits = torch.from_numpy(rng.normal(0, 2, shape)).float()
    S = shape[-1]
    if causal:
        logits = logits.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(logits, -1)
