"""A unified model (Janus) drawing an image, with attention captured at every generated image token.

Janus draws an image as ``n`` VQ tokens, one per step, with classifier-free guidance: a conditional row (the
prompt) and an unconditional row (every prompt token but ``<s>`` and ``<begin_of_image>`` replaced by the pad
token) run side by side and the generation head's scores are mixed as ``uncond + g * (cond - uncond)``.
:func:`generate_image_with_capture` runs exactly that loop (the tokens equal ``model.generate(...,
generation_mode="image")``'s, tested) and records the conditional row of every step as sample
``"{sample_id}/t{k}"`` (``k = 0`` is the prompt; step ``k`` is the forward whose single query is image token
``k - 1``). Spans: the prompt is text, the generated image tokens so far are the image span — so a step's
``image_share`` is how much the token being drawn reads the image drawn so far, against the prompt.
"""
from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import torch

from ..core.errors import InputError
from ..core.hooks import forward_hooks
from ..core.modality import IMAGE, TEXT, Spans
from ..families import family_of
from .record import CaptureResult
from .vlm import AttentionCapture, CaptureError


def _check(model):
    fam = family_of(model)
    if fam.name != "Janus":
        raise CaptureError(f"image generation capture needs a Janus model (generation_head, generation_embeddings); "
                           f"got {fam.name}")
    kw = getattr(model.generation_config, "generation_kwargs", None) or {}
    if "boi_token_id" not in kw:
        raise CaptureError("the model's generation_config has no generation_kwargs['boi_token_id'] (the "
                           "<begin_of_image> token id): set it, as Janus checkpoints do, before generating images")
    return kw["boi_token_id"]


@torch.no_grad()
def generate_image_with_capture(model, input_ids: torch.Tensor, guidance: float = 3.0, sample_id: str = "0",
                                mode: str = "stats", layers=None, capture: bool = True):
    """Greedy, guided image generation for ONE prompt (``input_ids [1, P]`` ending with ``<begin_of_image>``,
    e.g. ``processor(text=[prompt], generation_mode="image")["input_ids"]``), capturing the language model.

    Returns ``(tokens [n_image_tokens], result)``: the VQ token ids (decode with ``model.decode_image_tokens``)
    and one record per step and layer of the conditional row (``result`` is empty with ``capture=False``).
    """
    boi = _check(model)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise InputError(f"pass one prompt: input_ids of shape [1, P], got {tuple(input_ids.shape)}")
    if int(input_ids[0, -1]) != boi:
        raise InputError(f"the prompt must end with <begin_of_image> (id {boi}): encode it with "
                         f"processor(text=[prompt], generation_mode='image')")
    gc = model.generation_config
    n = int(model.config.vision_config.num_image_tokens)
    dev = next(model.parameters()).device
    ids = input_ids.to(dev)
    uncond = ids.clone()
    uncond[(uncond != gc.bos_token_id) & (uncond != boi)] = gc.pad_token_id
    emb = model.get_input_embeddings()(torch.cat([ids, uncond]))
    P = ids.shape[1]
    hidden = {}
    cap = AttentionCapture(model, mode, layers=layers, spans=Spans((TEXT,) * P), sample_ids=[f"{sample_id}/t0", "uncond"]) \
        if capture else None
    tokens = torch.zeros(n, dtype=torch.long, device=dev)
    with ExitStack() as stack:  # the hook and the capture are removed on exit, also on error
        stack.enter_context(forward_hooks([(model.model.language_model, "forward",
                                            lambda m, a, k, out: hidden.__setitem__("h", out.last_hidden_state))]))
        if cap is not None:
            stack.enter_context(cap)
        cache = None
        for k in range(n):
            L = P + k
            out = model(inputs_embeds=emb, attention_mask=torch.ones(2, L, dtype=torch.long, device=dev),
                        past_key_values=cache, use_cache=True, cache_position=torch.arange(L - emb.shape[1], L, device=dev),
                        logits_to_keep=1)
            cache = out.past_key_values
            scores = model.model.generation_head(hidden["h"][:, -1]).float()
            tokens[k] = (scores[1] + guidance * (scores[0] - scores[1])).argmax()  # uncond + g * (cond - uncond)
            emb = model.prepare_embeddings_for_image_generation(tokens[k].repeat(2)[:, None])
            if cap is not None:
                cap.spans = Spans((TEXT,) * P + (IMAGE,) * (k + 1))
                cap.sample_ids = iter([f"{sample_id}/t{k + 1}", "uncond"])
    # the unconditional row is guidance machinery, not the drawing: keep the conditional row only;
    # the last step's forward (after the last token) never ran, so steps are t0 .. t{n-1}
    return tokens.cpu(), CaptureResult.from_records([r for r in cap.result.records if r.sample != "uncond"]
                                                    if cap is not None else [])


def signed_to_uint8(decoded: torch.Tensor) -> np.ndarray:
    """Channels-last ``[B, H, W, 3]`` in [-1, 1] (``model.decode_image_tokens`` output, the processor's range) -> uint8
    ``[B, H, W, 3]``; for a sampler's channels-first [0, 1] images, :func:`unicache_lib.runtime.sampling.to_uint8`."""
    return ((decoded.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
