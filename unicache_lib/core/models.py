"""Model plumbing every layer needs: strip wrappers, read and switch the attention implementation of each
sub-model (restored on exit, also on error)."""
import logging
import warnings
from contextlib import contextmanager

import torch

from .compat import compiled_original, config_attn_implementation, diffusers, transformers
from .errors import InputError


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DataParallel / DistributedDataParallel / ``torch.compile`` wrappers."""
    for _ in range(8):
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif compiled_original(model) is not None:
            model = compiled_original(model)
        else:
            break
    return model


def loaded(p: torch.Tensor) -> torch.Tensor:
    """``p``, a parameter whose values are in memory; one on the ``meta`` device (a model offloaded by accelerate, or
    built under ``init_empty_weights``) is refused: its values cannot be read nor its device given to the inputs."""
    if p.is_meta:
        raise InputError("the model's weights sit on the meta device (offloaded by accelerate: a device_map with 'cpu' "
                         "or 'disk' parts, cpu_offload, or init_empty_weights): the library reads the weights and "
                         "runs the inputs on their device; load the model whole onto one device (device_map={'': 0}, "
                         "or .to(device)), in a lower dtype or capturing fewer layers (layers=) if memory is short")
    return p


def placement(model) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of ``model``'s parameters (refused for an offloaded model: :func:`loaded`)."""
    p = loaded(next(model.parameters()))
    return p.device, p.dtype


def to_model(inputs: dict, device=None, dtype=None) -> dict:
    """Tensors of ``inputs`` on ``device``, floating ones (pixel values) in ``dtype``; the rest unchanged."""
    return {k: v.to(device=device, dtype=dtype if (dtype is not None and v.is_floating_point()) else v.dtype)
            if torch.is_tensor(v) else v for k, v in inputs.items()}


def first_token_logits(model, inputs_of, questions, images, batch: int = 100) -> torch.Tensor:
    """``[N, vocab]`` float32 logits of the first answer token for (question, image) pairs, ``batch`` pairs a forward
    (gradients flow when enabled): ``inputs_of(questions, images)`` makes a slice's model inputs, which go to the
    model's device (floating ones in its weight dtype). The one loop behind every ``answer_logits``."""
    dev, dtype = placement(model)
    return torch.cat([model(**to_model(inputs_of(questions[s : s + batch], images[s : s + batch]), dev, dtype))
                      .logits[:, -1].float() for s in range(0, len(questions), batch)])


def attn_implementations(model) -> dict | str:
    """The attention implementation of each sub-model (``{"text_config": "eager", "vision_config":
    "sdpa"}``), or one name for a model without sub-configs; :func:`set_attn_implementations` restores it."""
    cfg = unwrap(model).config
    subs = {n: getattr(cfg, n) for n in getattr(cfg, "sub_configs", {}) if getattr(cfg, n, None) is not None}
    return {n: config_attn_implementation(c) for n, c in subs.items()} or config_attn_implementation(cfg)


def set_attn_implementations(model, impls: dict | str) -> None:
    unwrap(model).set_attn_implementation(impls)


def language_attn_implementation(model) -> str:
    """The attention implementation of the language model (what capture of its layers meets)."""
    impls = attn_implementations(model)
    return impls.get("text_config", next(iter(impls.values()))) if isinstance(impls, dict) else impls


@contextmanager
def language_attention(model, impl: str):
    """Run the language model under attention implementation ``impl`` inside the block (e.g. ``"sdpa"``
    to compare with the fast kernel without loading the model twice); every sub-model's
    implementation is restored on exit, also on error."""
    old = attn_implementations(model)
    set_attn_implementations(model, {**old, "text_config": impl} if isinstance(old, dict) else impl)
    try:
        yield model
    finally:
        set_attn_implementations(model, old)


@contextmanager
def quiet(loggers: tuple[str, ...] = (), warning_messages: tuple[str, ...] = (), loading_bars: bool = False):
    """Inside the block only: the named loggers at ERROR, warnings whose message starts with one of
    ``warning_messages`` ignored, and (``loading_bars``) transformers' and diffusers' weight-loading bars hidden.
    Everything is put back on exit, also on error: importing or calling the workbench changes no global setting."""
    levels = {name: logging.getLogger(name).level for name in loggers}
    bars = [transformers.utils.logging, diffusers.utils.logging] if loading_bars else []
    shown = [b.is_progress_bar_enabled() for b in bars]
    try:
        with warnings.catch_warnings():
            for msg in warning_messages:
                warnings.filterwarnings("ignore", message=msg)
            for name in loggers:
                logging.getLogger(name).setLevel(logging.ERROR)
            for b in bars:
                b.disable_progress_bar()
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for b, on in zip(bars, shown):
            if on:
                b.enable_progress_bar()
