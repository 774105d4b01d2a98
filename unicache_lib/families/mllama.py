"""Mllama (Llama-3.2-Vision): the image never enters the token sequence. The vision encoder's
tokens (every tile: a class token plus a patch grid; padded tiles masked) are read by
*cross-attention* layers inserted among the text self-attention layers (every 5th layer in the
11B/90B checkpoints). The single ``<|image|>`` token only marks where the image was; text before it
cannot read the image (its cross-attention output is zeroed).

Captured parts: ``language`` (text self-attention, all positions text) and ``cross`` (text queries
over the vision-token keys, the vision tokens being the image span). For KV eviction the image KV
is the cross-attention layers' cache: evicting image entries means dropping vision-token keys and
values there, while the self-attention cache holds only text.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..core.compat import transformers
from ..core.errors import InputError
from ..core.modality import IMAGE, TEXT, Spans
from .base import ImageKV, Site, VLMFamily, chat_template, module_names, patch_grid, register, vit_dims


@register
class Mllama(VLMFamily):
    name = "Mllama"
    model_types = ("mllama",)
    model_class = "MllamaForConditionalGeneration"
    image_marker = "<|image|>"
    special_tokens = ("<|image|>", "<|python_tag|>")
    token_fields = ("cross_attention_mask",)
    cross_attention = True
    image_part = "cross"
    layout = "{image} user : {question} assistant :"
    grid_offset = 1  # the grid tokens: the first tile's, after its class token

    def sites(self, model, parts=("language",)):
        out = super().sites(model, tuple(p for p in parts if p != "vision"))
        if "vision" in parts:  # local layers, then the global ones numbered after them
            vis, names = self.vision_model(model), module_names(model)
            for i, layer in enumerate(list(vis.transformer.layers) + list(vis.global_transformer.layers)):
                out.append(Site(names[id(layer.self_attn)], i, "vision", layer.self_attn))
        return out

    def spans(self, config, input_ids, inputs=None):
        """Self-attention sequence: text only (``<|image|>`` is a marker, not image content)."""
        return Spans((TEXT,) * torch.as_tensor(input_ids).shape[-1])

    def cross_spans(self, n_keys: int) -> Spans:
        """The cross-attention keys as captured: the vision tokens of the real tiles (capture drops padded
        tiles' keys, which the mask hides from every query)."""
        return Spans((IMAGE,) * n_keys)

    def row_gates(self, model) -> dict:
        """``{cross site name: (decoder layer, kwarg)}``: rows whose gate is 0 never reach the output
        (text before the image), so their cross-attention rows are not read."""
        names = module_names(model)
        return {names[id(layer.cross_attn)]: (layer, "full_text_row_masked_out_mask")
                for layer in self.language_model(model).layers if hasattr(layer, "cross_attn")}

    def cross_keys(self, config, inputs):
        """Vision tokens of the real tiles (``aspect_ratio_mask``): the keys capture keeps (padded tiles,
        masked for every query, are dropped)."""
        arm = inputs.get("aspect_ratio_mask")
        if arm is not None:
            return int(arm.sum()) * self.tokens_per_tile(config)
        pv = inputs.get("pixel_values")
        images = int(pv.shape[1]) if pv is not None else 1
        return images * config.vision_config.max_num_tiles * self.tokens_per_tile(config)

    def tokens_per_tile(self, config) -> int:
        rows, cols = patch_grid(config.vision_config)
        return rows * cols + 1

    def image_grid(self, config, inputs):
        ids = inputs.get("aspect_ratio_ids")
        one_tile = ids is not None and int(ids.flatten()[0]) == 1  # aspect ratio id 1 = one tile (1 x 1 canvas)
        return patch_grid(config.vision_config) if one_tile else None

    def activate(self, model) -> None:
        """Open the cross-attention gates: they are initialised at 0 (tanh(0) = 0), so a random model's
        cross-attention layers would change nothing and every image path would go untested."""
        with torch.no_grad():
            for layer in self.language_model(model).layers:
                for name in ("cross_attn_attn_gate", "cross_attn_mlp_gate"):
                    if hasattr(layer, name):
                        getattr(layer, name).fill_(1.0)

    # ---- eviction: the image KV is the cross-attention layers' cache -----------------------------
    def cross_layers(self, model) -> list[int]:
        return list(model.config.text_config.cross_attention_layers)

    def image_kv(self, model, cache, split):
        """Trim the cross-attention caches to the vision tokens of real tiles (padded tiles are masked,
        so dropping them is exact) and say where the image KV is: every position of those layers."""
        arm = split.extra.get("aspect_ratio_mask")
        per_tile = self.tokens_per_tile(model.config)
        tiles = arm.reshape(-1).nonzero().flatten() if arm is not None else torch.arange(0)
        valid = (tiles[:, None] * per_tile + torch.arange(per_tile)[None, :]).reshape(-1)
        layers = self.cross_layers(model)
        for li in layers:
            layer = cache.layers[li]
            if layer.keys.shape[-2] <= int(valid.max()):
                raise InputError(f"cross-attention cache layer {li} holds {layer.keys.shape[-2]} vision tokens, "
                                 f"fewer than the {int(valid.max()) + 1} the tiles imply")
            idx = valid.to(layer.keys.device)
            layer.keys, layer.values = layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)
        n = len(valid)
        return ImageKV(layers, torch.arange(n), torch.empty(0, dtype=torch.long), n, key_index=valid)

    def forward_text(self, model, ids, cache, positions):
        """Text tokens after the image on a (possibly evicted) cache: self-attention continues the text
        cache; every cross-attention layer reads all vision tokens its cache still holds."""
        cross = self.cross_layers(model)
        held = cache.get_seq_length(next(i for i in range(len(cache.layers)) if i not in cross))
        n = ids.shape[1]
        K = cache.layers[cross[0]].keys.shape[-2]
        dev, dtype = ids.device, next(model.parameters()).dtype
        out = model.model.language_model(
            input_ids=ids, attention_mask=torch.ones(1, held + n, dtype=torch.long, device=dev), position_ids=positions,
            cross_attention_mask=torch.zeros(1, 1, n, K, dtype=dtype, device=dev),
            full_text_row_masked_out_mask=torch.ones(1, 1, n, 1, dtype=dtype, device=dev),
            past_key_values=cache, use_cache=True, cache_position=torch.arange(held, held + n, device=dev))
        return SimpleNamespace(logits=model.lm_head(out.last_hidden_state))

    def config(self, tok, shape):
        every = shape.extra.get("cross_every", 2)  # Llama-3.2-Vision: 5 (layers 3, 8, 13, ...)
        cross = [i for i in range(shape.layers) if i % every == 3 % every]
        inter = shape.extra.get("intermediate_layers_indices", [0])
        text = dict(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=4 * shape.hidden,
                    num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                    num_key_value_heads=shape.kv_heads, cross_attention_layers=cross, pad_token_id=tok.pad_token_id,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
                    max_position_embeddings=4096)
        vision = vit_dims(shape, num_global_layers=shape.extra.get("global_layers", 1), intermediate_layers_indices=inter,
                          vision_output_dim=shape.vision_hidden * (len(inter) + 1),
                          max_num_tiles=shape.extra.get("max_tiles", 4))
        if vision["max_num_tiles"] != 4:  # one tile: the only canvas is 1 x 1
            vision["supported_aspect_ratios"] = [[1, 1]]
        return transformers.MllamaConfig(vision_config=vision, text_config=text,
                                         image_token_index=tok.convert_tokens_to_ids("<|image|>"))

    def processor(self, tok, shape):
        s = shape.image_size
        ip = transformers.MllamaImageProcessor(size={"height": s, "width": s},
                                               max_image_tiles=shape.extra.get("max_tiles", 4))
        return transformers.MllamaProcessor(image_processor=ip, tokenizer=tok,
                                            chat_template=chat_template(self.layout, self.image_marker))
