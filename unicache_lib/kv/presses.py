"""The workbench's designed eviction policy as a drop-in kvpress press: take ``key_coverage`` out of the notebook into
the stack you run (and DivPrune's rule on the cached keys beside it, :class:`DivPruneKeysPress`).

    from unicache_lib.kv.presses import KeyCoveragePress

    press = KeyCoveragePress(compression_ratio=0.7)      # kvpress's meaning: the share of the prompt's KV removed
    with press(model):                                     # a vision-language model loaded with attn_implementation="eager"
        model(**inputs)                                    # the prefill: every language layer's cache is compressed

**What it compresses.** Only image positions: text positions (the system prompt, the question, special tokens) are
always kept, and the prompt keeps as many positions as any kvpress press would at that ratio
(``kvpress.utils.compute_n_kept``), the removed ones all image positions (at most all of them but one). The image
positions are found from the ``input_ids`` of the forward it wraps, by the image token id the model's family adapter
reads from its config; pass ``image_token_id`` for a model whose config names it otherwise. A cross-attention VLM
(Mllama), whose image KV is not in the self-attention cache, is refused.

**What it keeps.** In every layer, exactly what :class:`~unicache_lib.kv.policies.key_coverage.KeyCoverage` keeps in
the workbench's harness, because the press calls that policy's own ``choose`` on the layer's cache
(:class:`PolicyPress`; tested with ``torch.equal``): a k-center cover of that layer's cached image keys (after the
rotary embedding, all key heads side by side), started at the image position the prompt reads most in that layer.
The start needs that layer's attention weights, which kvpress hands to a press only under eager attention; under
sdpa or flash attention the press refuses with the fix, rather than choosing a different start silently.

**Which families.** Every self-attention family the adapters support (LLaVA-1.5/NeXT/OneVision, Qwen2-VL,
Qwen2.5-VL, Gemma 3, Idefics3/SmolVLM, InternVL, PaliGemma, Janus; ``tests/test_families.py`` checks each with
``torch.equal`` against ``run_eviction``'s policy): the hooks go on the language model's self-attention layers that
the family adapter names (kvpress itself looks for ``model.model.language_model.layers`` and skips Gemma 3's
sliding layers; this press compresses every layer, as the workbench does). A sliding-window layer shorter than the
prompt holds only the last keys, so its positions would not line up: refused, naming the fix.

One prompt at a time (batch 1), as the workbench's harness; kvpress's own pipeline runs one prompt per call too.
"""
import contextlib
import numbers
from dataclasses import dataclass, field

import torch

from ..core.errors import ContractError, InputError, UnsupportedModelError
from ..core.hooks import forward_hooks
from ..families import family_of
from ..inputs import check_fraction
from .cache import EvictionContext
from .decode import layer_masks
from .policies.ablations import DivPruneKeys
from .policies.base import EvictionPolicy
from .policies.key_coverage import KeyCoverage

try:  # kvpress is a dependency of the project; the import error, if any, names the install
    from kvpress.presses.base_press import BasePress, is_prefilling
    from kvpress.utils import compute_n_kept
except ImportError as e:  # pragma: no cover - environment without kvpress
    raise ImportError("KeyCoveragePress needs NVIDIA kvpress (`pip install kvpress`, transformers<5.3)") from e


@dataclass
class PolicyPress(BasePress):
    """A workbench eviction policy (a cache-stage one: it chooses from each layer's cache after the prefill) run by
    kvpress's hook: ``PolicyPress(compression_ratio=0.7, policy=POLICIES["key_coverage"]())``. The press finds the
    image positions and applies kvpress's rounding; which positions stay is the policy's own ``choose``, so the
    harness and the press keep the same positions by construction (tested with ``torch.equal``).

    ``compression_ratio``: the share of the prompt's KV pairs removed, all from image positions (kvpress's meaning
    of the ratio, so it drops into code written for other presses); ``image_token_id``: None to read it from the
    model config; ``policy``: the policy (default ``key_coverage``)."""

    compression_ratio: float = 0.0
    image_token_id: int | None = None
    policy: EvictionPolicy = field(default_factory=KeyCoverage, repr=False)  # a cache-stage workbench policy
    _image: torch.Tensor | None = field(default=None, init=False, repr=False)
    _bias: dict = field(default_factory=dict, init=False, repr=False)  # a merging policy's log(size) per layer
    _prompt_len: int | None = field(default=None, init=False, repr=False)
    _layers: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        """Every field checked when the press is made, and again at each forward (kvpress's own loops set a
        press's ``compression_ratio`` by assignment, which no ``__init__`` sees)."""
        if not isinstance(self.policy, EvictionPolicy):
            raise InputError(f"policy must be a cache-stage eviction policy (e.g. POLICIES['key_coverage']()), got "
                             f"{self.policy!r}")
        self.policy.__post_init__()  # its own fields too (press.policy.alpha = -1)
        self.policy.require_cache("a press")  # the policy says whether it can choose from one layer at a time
        check_fraction(self.compression_ratio, "compression_ratio", upper_inclusive=False,
                       meaning="the share of the prompt's KV removed")
        if self.image_token_id is not None and (isinstance(self.image_token_id, bool) or  # numpy's ints too
                                                not isinstance(self.image_token_id, numbers.Integral) or self.image_token_id < 0):
            raise InputError(f"image_token_id must be a token id (an int >= 0) or None, got {self.image_token_id!r}")
        self.image_token_id = None if self.image_token_id is None else int(self.image_token_id)

    def post_init_from_model(self, model):
        fam = family_of(model)  # an unsupported model is refused here, with the supported families listed
        if fam.cross_attention:
            raise InputError(f"{fam.name}: the image KV lives in cross-attention layers, which kvpress presses do not "
                             "touch; evict it with the workbench's policies (run_eviction) instead")
        if self.image_token_id is None:
            try:
                self.image_token_id = fam.image_token_id(model.config)  # the family adapter knows its image token
            except UnsupportedModelError as e:
                raise InputError(f"{e}: pass KeyCoveragePress(image_token_id=...) with the id your processor puts at "
                                 "image positions") from e

    def _read_input_ids(self, module, args, kwargs):
        self.__post_init__()  # once a forward: a field set since (press.compression_ratio = 70, press.policy = ...)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise InputError(f"{type(self).__name__} finds the image positions from input_ids; this forward got "
                             "inputs_embeds only: pass input_ids (with the image placeholder tokens) to the model")
        if ids.shape[0] != 1:
            raise InputError(f"{type(self).__name__} compresses one prompt at a time, got a batch of {ids.shape[0]}: loop "
                             "over the prompts")
        self._image, self._prompt_len = (ids[0] == self.image_token_id).nonzero().flatten(), ids.shape[1]
        cache = kwargs.get("past_key_values")
        held = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        if held and len(self._image):  # kvpress compresses only a prefill from an empty cache: it would do nothing
            raise InputError(f"{type(self).__name__}: the cache already holds {int(held)} positions, and kvpress compresses "
                             "only a prefill from an empty cache, so the image would stay uncompressed: prefill the image "
                             "prompt with an empty cache (past_key_values=None or a new DynamicCache())")

    @contextlib.contextmanager
    def __call__(self, model):
        """kvpress's own hook (``BasePress.forward_hook``) on every self-attention layer of the language model that the
        family adapter names (not kvpress's own search: see the module docstring); removed on exit, even on error."""
        active = getattr(model, "_unicache_press", None)
        if active is not None:  # a second press would compress what the first already compressed
            raise InputError(f"{type(active).__name__} is already applied to this model (a `with press(model):` inside "
                             f"another): apply one press at a time (a workbench press finds the image positions in its "
                             f"own `with`, so kvpress's ComposedPress cannot carry one either)")
        given = self.image_token_id  # None: this model's own, read now and forgotten on exit (a press on two models)
        model._unicache_press = self
        try:
            self.post_init_from_model(model)
            fam = family_of(model)
            sites = [s.module for s in fam.sites(model, ("language",))]
            # module -> its place among the compressed layers
            self._bias, self._layers = {}, {id(m): i for i, m in enumerate(sites)}
            # the terms a layer's compress_layer returns (a merge's log(size)), read by every later forward; with a
            # depth schedule the cache is ragged, so every later forward needs one mask per layer
            masks = layer_masks(model, fam, self._bias, every_layer=self.policy.depth is not None)
            # the pre-hook first, before the layers' hooks fire: the image positions of this forward
            with forward_hooks([(model, "forward_pre", self._read_input_ids)] +
                               [(m, "forward", self.forward_hook) for m in sites]), masks:
                yield
        finally:
            self._image, self._prompt_len, self._bias, self.image_token_id = None, None, {}, given
            del model._unicache_press

    def forward_hook(self, module, input, kwargs, output):
        """kvpress's hook, then what a sliding-window cache layer counts (``cumulative_length``, Gemma 3) set to what
        it now holds, as the workbench's ``evict`` does: without it the next forward builds its mask for the
        uncompressed length and fails."""
        out = super().forward_hook(module, input, kwargs, output)
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        if getattr(layer, "is_sliding", False) and hasattr(layer, "cumulative_length") and \
                is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
            layer.cumulative_length = layer.keys.shape[-2]
        return out

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """``keys`` / ``values`` ``[1, H_kv, S, D]`` -> the same with the dropped image positions removed."""
        img = self._image
        S = keys.shape[2]
        if img is None:
            raise ContractError(f"{type(self).__name__} was called outside `with press(model):` (inside kvpress's "
                                f"ComposedPress, say), so it never saw the prompt's image positions: apply it alone, "
                                f"`with press(model):`")
        if S != self._prompt_len:  # the cache's positions would not line up with the prompt's
            why = ("a sliding-window layer shorter than the prompt, which holds only the last keys; use a model without "
                   "sliding windows shorter than the prompt") if getattr(kwargs["past_key_values"].layers[module.layer_idx],
                                                                         "is_sliding", False) and S < self._prompt_len \
                else ("a pre-allocated cache (StaticCache, generate(cache_implementation='static')); use a DynamicCache, "
                      "the default")
            raise InputError(f"{type(self).__name__}: cache layer {module.layer_idx} holds {S} positions after a prefill of "
                             f"{self._prompt_len}, so the image positions would not line up with its keys: {why}")
        n = len(img)
        if n == 0:  # a wrong id would otherwise compress nothing without a word
            raise InputError(f"{type(self).__name__}: the prompt has no token of id {self.image_token_id}, so there is no "
                             "image position to compress: pass image_token_id= the id your processor puts at image "
                             "positions (e.g. processor.tokenizer.convert_tokens_to_ids('<image>')), or run a text-only "
                             "prompt without the press")
        kept = min(n, max(1, compute_n_kept(S, self.compression_ratio) - (S - n)))  # kvpress's rounding, image only
        # this layer's count (a depth schedule's, the same total as `kept` per layer; else `kept`)
        kept = self.policy.counts(len(self._layers), n, kept)[self._layers[id(module)]]
        if kept == n:
            return keys, values
        img = img.to(keys.device)
        # drop, or merge (policies/merge.py)
        keys, values, bias = self.policy.compress_layer(keys, values, img, self.choose(keys, values, kept, attentions, img))
        if bias is not None:
            self._bias[module.layer_idx] = bias
        return keys, values

    def choose(self, keys: torch.Tensor, values: torch.Tensor, k: int, attentions, img: torch.Tensor) -> list[int]:
        """``k`` of the layer's image positions to keep (indices into ``img``), chosen by the press's ``policy`` itself
        on a one-layer :class:`~unicache_lib.kv.cache.EvictionContext` of this layer's cache (``keys`` /
        ``values`` ``[1, H_kv, S, D]``, ``attentions [1, H, S, S]`` or None): the press adds no rule of its own."""
        ctx = EvictionContext(seq_len=keys.shape[2], image_positions=img, n_layers=1,
                              attentions=[] if attentions is None else [attentions[0].float()],
                              kv=[lambda: (keys[0], values[0])])
        try:
            (chosen,) = self.policy.choose(ctx, k)
        except InputError as e:
            if attentions is not None:
                raise
            raise InputError(f"{type(self).__name__} runs {self.policy.name!r}, which reads the attention weights of the "
                             "prompt (each layer's cover starts at the image position read most); kvpress hands them to "
                             "a press only under eager attention: load the model with attn_implementation='eager' (or "
                             "switch the language model to eager for the prefill)") from e
        return [int(i) for i in chosen]


@dataclass
class KeyCoveragePress(PolicyPress):
    """``key_coverage`` as a press: :class:`PolicyPress` with its default policy (the name code written for it uses)."""


@dataclass
class DivPruneKeysPress(PolicyPress):
    """DivPrune's selection (greedy max-min under cosine distance, started at the key whose nearest neighbour is
    farthest) run on each layer's cached image keys, as a press: the workbench's ``divprune_keys`` policy run by the
    press (tested with ``torch.equal``). DivPrune itself prunes the projected image features before the language
    model (``POLICIES["divprune"]``, a prefill-stage policy); a press only sees the cache, so this is the rule in the
    cache's place — the ablation notebook 05 runs. Needs no attention weights (any attention implementation)."""

    policy: EvictionPolicy = field(default_factory=DivPruneKeys, repr=False)
