"""KV-cache eviction for the understanding model: real cache surgery, an own decode loop, policies.

    split = split_prompt(processor, image, question)          # context (image) | question
    pre = prefill(model, split)                               # cache + the context's attention
    keep = POLICIES["h2o"]().select(pre.context(), budget=0.25)
    out = answer(model, evict(pre.cache, keep), split)        # question fed on the compressed cache
"""
from .cache import Prefill, PromptSplit, answer, evict, kv_bytes, prefill, split_prompt
from .policies import POLICIES, EvictionContext, EvictionPolicy

__all__ = ["POLICIES", "EvictionContext", "EvictionPolicy", "Prefill", "PromptSplit", "answer", "evict", "kv_bytes",
           "prefill", "split_prompt"]
