"""KV-cache eviction for the understanding model: real cache surgery, an own decode loop, policies.

    split = split_prompt(processor, image, question)          # context (image) | question
    pre = prefill(model, split)                               # cache + the context's attention
    keep = POLICIES["h2o"]().select(pre.context(), budget=0.25)
    out = answer(model, evict(pre.cache, keep), split)        # question fed on the compressed cache

    done = POLICIES["key_coverage_merge"]().apply(model, pre, pre.context(), 0.25)   # the policy acts itself:
    out = answer(model, done.cache, done.split, bias=done.bias)                      # drop, merge or prune first
"""
from .cache import Compressed, Prefill, evict, kv_bytes, prefill
from .decode import answer
from .policies import POLICIES, EvictionContext, EvictionPolicy, PrefillStagePolicy
from .prompt import PromptSplit, split_prompt

__all__ = ["POLICIES", "Compressed", "EvictionContext", "EvictionPolicy", "Prefill", "PrefillStagePolicy", "PromptSplit",
           "answer", "evict", "kv_bytes", "prefill", "split_prompt"]
