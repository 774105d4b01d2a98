"""Every user input is checked here, once, before it reaches a processor or a model.

Entry points (:func:`~unicache_lib.capture.runner.model_inputs` / ``inputs_for``, ``answer_logits``,
:func:`~unicache_lib.kv.cache.split_prompt`, :class:`~unicache_lib.capture.vlm.AttentionCapture`,
``capture_samples``, :class:`~unicache_lib.capture.diffusion.DiffusionCapture`, the eviction and pruning
sweeps) call these functions instead of checking on their own, so a bad input gets the same error,
naming what to do, wherever it enters:

* images (:func:`prepare_image`): ``(H, W, 3)`` uint8 RGB is what processors expect; grayscale
  ``(H, W)`` / ``(H, W, 1)``, RGBA ``(H, W, 4)``, channels-first ``(C, H, W)``, float images in
  ``[0, 1]``, other integer types holding 0..255, PIL images of any mode and torch tensors are
  converted exactly (RGBA loses its alpha channel, as transformers' ``convert_to_rgb`` does, with a
  warning when some pixels are transparent); anything else is refused with the expected shape.
* prompts (:func:`check_question`, :func:`check_prompt`): the family's image marker (e.g. ``<image>``)
  exactly once, where the image goes.
* layer indices (:func:`resolve_layers`), modality spans (:func:`check_spans`), image tokens of a
  forward (:func:`check_image_tokens`) and budgets / fractions (:func:`check_fraction`).

Every refusal is an :class:`InputError` (a ``ValueError``) or, for a value of the wrong type, a
``TypeError``.
"""
import itertools
import numbers
import operator
import re
import warnings

import numpy as np
import torch

from .core.errors import ImageError, InputError, InputTypeError, LayerError, PromptError, UnsupportedModelError
from .core.modality import SpanError, Spans
from .families import FAMILIES

MIN_IMAGE_SIDE = 2
MIN_SHARE = 1e-4  # the smallest budget share: below it a budget keeps no token of any image under 10,000 tokens
MAX_IMAGE_TOKENS = 100_000  # the most image tokens a token-count budget may name before the model says its own
EXPECTED_IMAGE = ("an (H, W, 3) uint8 RGB array (also accepted: (H, W) grayscale, (H, W, 4) RGBA, channels-first "
                  "(3, H, W), float values in [0, 1], a PIL image or a torch tensor)")


# ---- images ---------------------------------------------------------------------------------------
def prepare_image(image) -> np.ndarray:
    """``image`` as an ``(H, W, 3)`` uint8 RGB array, converted exactly, or :class:`ImageError`.

    Accepted: numpy arrays and torch tensors of shape ``(H, W)`` / ``(H, W, 1)`` (grayscale: the
    value is repeated over R, G, B), ``(H, W, 3)``, ``(H, W, 4)`` (RGBA: the alpha channel is dropped,
    as PIL's ``convert("RGB")`` and transformers' ``convert_to_rgb`` do; a warning when some pixels
    are transparent) or channels-first ``(1|3|4, H, W)`` (channels last wins when both ends could be
    channels); uint8, other integer types holding 0..255, floats in ``[0, 1]`` (rounded to the
    nearest of 0..255: exact for images that were uint8 / 255); PIL images of any mode. Both sides
    must be at least :data:`MIN_IMAGE_SIDE` pixels. Floats in ``[0, 255]``, normalised images (negative
    values), NaN, booleans, batches (4-D) and file paths are refused, each with what to pass.
    """
    if isinstance(image, (str, bytes)) or hasattr(image, "__fspath__"):
        raise ImageError(f"got a path ({image!r}), not an image: open it first, e.g. PIL.Image.open(path), "
                         f"and pass the image")
    if image is None:
        raise ImageError(f"the image is None: pass {EXPECTED_IMAGE}")
    from PIL import Image  # local: loaded at the first image, not at import (pillow is a dependency)

    if isinstance(image, Image.Image):
        if image.mode not in ("L", "RGB", "RGBA"):
            image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
        arr = np.asarray(image)
    elif torch.is_tensor(image):
        arr = image.detach().cpu().numpy()
    elif isinstance(image, np.ndarray):
        arr = image
    elif isinstance(image, (list, tuple)):
        try:
            arr = np.asarray(image)
        except ValueError as e:  # numpy >= 1.24 refuses ragged nesting (images of different sizes) outright
            raise ImageError(f"got a ragged {type(image).__name__} (images of different sizes?): pass one image, "
                             f"{EXPECTED_IMAGE}; for several images, one call per image") from e
        if arr.dtype == object:
            raise ImageError(f"got a ragged {type(image).__name__}: pass one image, {EXPECTED_IMAGE}")
    else:
        raise ImageError(f"cannot read an image from a {type(image).__name__}: pass {EXPECTED_IMAGE}")
    return _to_rgb_uint8(_channels_last(arr))


def _channels_last(arr: np.ndarray) -> np.ndarray:
    """``(H, W, C)`` with C in 1, 3, 4 (a 2-D array gets C = 1)."""
    if arr.ndim == 4:
        raise ImageError(f"got a 4-D array of shape {arr.shape} (a batch?): pass one image at a time, e.g. images[0]")
    if arr.ndim == 2:
        arr = arr[..., None]
    elif arr.ndim == 3:
        if arr.shape[-1] not in (1, 3, 4):
            if arr.shape[0] in (1, 3, 4):
                arr = np.moveaxis(arr, 0, -1)  # channels first (a torchvision tensor)
            else:
                raise ImageError(f"an image of shape {arr.shape} has no channel axis of 1, 3 or 4: pass {EXPECTED_IMAGE}")
    else:
        raise ImageError(f"an image of shape {arr.shape} ({arr.ndim}-D): pass {EXPECTED_IMAGE}")
    h, w = arr.shape[:2]
    if min(h, w) < MIN_IMAGE_SIDE:
        raise ImageError(
            f"the image is {h}x{w} pixels (shape {arr.shape}): an image needs at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} "
            f"pixels (a 1-pixel side is usually a mis-shaped array: a scalar colour, a single row, or a batch axis). "
            f"Pass {EXPECTED_IMAGE}; the processor resizes it to the model's input size")
    return arr


def _to_rgb_uint8(arr: np.ndarray) -> np.ndarray:
    """Values to uint8 exactly (or refuse), then channels to RGB."""
    if arr.dtype == np.bool_:
        raise ImageError("a boolean image (a mask?): convert it to a picture first, e.g. mask.astype(np.uint8) * 255")
    if np.issubdtype(arr.dtype, np.floating):
        x = arr.astype(np.float64)
        if not np.isfinite(x).all():
            raise ImageError("the image holds NaN or infinite values")
        lo, hi = float(x.min()), float(x.max())
        tol = 1e-3
        if lo < -tol:
            raise ImageError(
                f"a float image with values down to {lo:.3g} looks normalised (mean / std already applied): pass the "
                f"raw picture (uint8 0..255, or floats in [0, 1]); the processor normalises it itself")
        if hi > 1 + tol:
            raise ImageError(
                f"a float image with values up to {hi:.4g}: float images must be in [0, 1]. For 0..255 values pass "
                f"uint8, e.g. np.clip(image, 0, 255).round().astype(np.uint8)")
        arr = np.rint(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
    elif np.issubdtype(arr.dtype, np.integer):
        if arr.dtype != np.uint8:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi > 255:
                raise ImageError(
                    f"an integer image ({arr.dtype}) with values {lo}..{hi}: images are 0..255. Scale it first, e.g. "
                    f"(image / image.max() * 255).round().astype(np.uint8) for a 16-bit image")
            arr = arr.astype(np.uint8)
    else:
        raise ImageError(f"an image of dtype {arr.dtype}: pass {EXPECTED_IMAGE}")
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    elif arr.shape[-1] == 4:
        if (arr[..., 3] < 255).any():
            warnings.warn("the RGBA image has transparent pixels: its alpha channel is dropped (as PIL's convert('RGB') and "
                          "transformers' convert_to_rgb do), so transparent pixels show their stored colour. To put them "
                          "on a background, composite first, e.g. PIL.Image.alpha_composite(PIL.Image.new('RGBA', "
                          "img.size, 'white'), img).convert('RGB')", UserWarning, stacklevel=3)
        arr = arr[..., :3]
    return np.ascontiguousarray(arr)


# ---- prompts --------------------------------------------------------------------------------------
def default_family(family=None):
    """``family``, or the LLaVA-1.5 family (the shipped tiny model's) when None."""
    return FAMILIES["LLaVA-1.5"] if family is None else family


def check_question(question, family=None) -> str:
    """The question as a string; :class:`PromptError` when it holds the image marker (the family's
    prompt adds the marker once; a second one asks the model for a second image)."""
    fam = default_family(family)
    if not isinstance(question, str):
        raise InputTypeError(f"the question must be a string, got {type(question).__name__}")
    if fam.image_marker and fam.image_marker in question:  # encoder families (ViLT, CLIP) have no marker
        raise PromptError(
            f"the question contains the image marker {fam.image_marker!r}: pass the question alone (the {fam.name} prompt "
            f"template adds the marker once), or pass a whole prompt of your own as prompt=...")
    return question


def check_prompt(prompt, family=None, n_images: int = 1) -> str:
    """``prompt`` when it holds the family's image marker once per image; else :class:`PromptError`
    naming the marker and the template helper (``build_prompt`` / ``family.prompt``)."""
    fam = default_family(family)
    if not isinstance(prompt, str):
        raise InputTypeError(f"the prompt must be a string, got {type(prompt).__name__}")
    if not fam.image_marker:  # the image is not in the text (ViLT, CLIP): any text will do
        return prompt
    n = prompt.count(fam.image_marker)
    helper = ("or pass the question alone and let the family lay out the prompt: "
              "unicache_lib.capture.runner.build_prompt(processor, question, family) "
              f"({fam.name}: the processor's chat template, or without one "
              f"{fam.layout.format(image=fam.image_marker, question='...')!r})")
    if n == 0:
        raise PromptError(
            f"the prompt has no image token: put the processor's image token {fam.image_marker!r} where the image goes "
            f"(once per image; the processor expands it into the image's tokens), {helper}. Prompt: {prompt[:200]!r}")
    if n != n_images:
        raise PromptError(f"the prompt has {n} image tokens {fam.image_marker!r} for {n_images} image(s): keep one per "
                          f"image, {helper}")
    return prompt


def encode(processor, image, question: str | None = None, family=None, prompt: str | None = None):
    """Processor output for one (image, question) or one (image, prompt), batch size 1, with the
    image checked and converted (:func:`prepare_image`) and the prompt checked (the family's
    template when only a question is given). The one place images and prompts enter a processor."""
    fam = default_family(family)
    img = prepare_image(image)
    if prompt is None:
        if question is None:
            raise InputTypeError("pass a question (laid out with the family's prompt template) or a whole prompt=")
        text = _templated(processor, question, fam)
    else:
        text = check_prompt(prompt, fam)
    # channels are last after prepare_image: say so, or small images (a side of 1 or 3) are read channels-first
    return processor(images=[img], text=[text], return_tensors="pt", input_data_format="channels_last")


def _templated(processor, question: str, fam) -> str:
    """The family's prompt template around a checked question, checked to lay out the image as the family expects."""
    text = fam.prompt(processor, check_question(question, fam))
    try:
        check_prompt(text, fam)
    except PromptError as e:
        raise PromptError(f"the processor's chat template did not lay out the image as {fam.name} expects: {e}") from None
    return text


def encode_batch(processor, images, questions, family=None) -> list[dict]:
    """:func:`encode` for many (image, question) pairs in one processor call (the call's own overhead is paid once):
    each image and question checked as :func:`encode` checks them, the batch padded by the processor, then each
    sample's row cut back to its own tokens, so every dict equals :func:`encode`'s for that pair (``input_ids [1, S_i]``
    and per-token fields unpadded, the image inputs of that sample alone)."""
    fam = default_family(family)
    images, questions = list(images), list(questions)
    if len(images) != len(questions) or not images:
        raise InputError(f"{len(images)} images for {len(questions)} questions: pass one question per image")
    texts = [_templated(processor, q, fam) for q in questions]
    enc = processor(images=[prepare_image(im) for im in images], text=texts, return_tensors="pt",
                    input_data_format="channels_last", padding=True)
    ids, mask, n = enc["input_ids"], enc.get("attention_mask"), len(images)
    per_token = {k for k, v in enc.items() if torch.is_tensor(v) and v.dim() >= 2 and v.shape[:2] == ids.shape}
    per_sample = {k for k, v in enc.items() if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == n}
    if (odd := [k for k in enc if k not in per_token | per_sample]):
        raise InputError(f"{type(processor).__name__} returned {odd[0]!r} with a layout encode_batch cannot cut per "
                         f"sample ({tuple(getattr(enc[odd[0]], 'shape', ()))}): encode the samples one at a time")
    keep = [mask[b].bool() if mask is not None else torch.ones(ids.shape[1], dtype=torch.bool) for b in range(n)]
    return [{k: v[b:b + 1][:, keep[b]] if k in per_token else v[b:b + 1] for k, v in enc.items()} for b in range(n)]


# ---- layers ---------------------------------------------------------------------------------------
def resolve_layers(layers, have, what: str = "the model") -> list[int]:
    """Layer numbers for user ``layers`` given the layers ``have`` (sorted numbers, not necessarily
    contiguous): a non-negative index must be one of them, a negative one counts from the last
    (``-1`` is ``have[-1]``, ``-len(have)`` is ``have[0]``). Order kept, duplicates dropped.

    Raises:
        LayerError: a non-integer index, or one that does not exist (the message gives the valid range).
    """
    have = sorted(set(int(h) for h in have))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [layers]
    try:
        asked = list(layers)
    except TypeError:
        raise LayerError(f"layers must be a list of integers, got {layers!r}") from None
    if (bad_type := [i for i in asked if isinstance(i, (bool, np.bool_)) or not isinstance(i, (numbers.Integral, np.integer))]):
        raise LayerError(f"layers must be integers, got {bad_type!r}")
    if not (asked := [operator.index(i) for i in asked]):
        raise LayerError(f"layers=[] selects no layer of {what}: pass layers=None for every layer, or a non-empty list")
    n = len(have)
    if (missing := [i for i in asked if (i < 0 and i < -n) or (i >= 0 and i not in have)]):
        if n == 0:
            raise LayerError(f"layers {missing} do not exist: {what} has no layers")
        neg = (f"negative indices -{n}..-1 count from the last (-1 = layer {have[-1]}, -{n} = layer {have[0]})"
               if n > 1 else f"-1 is layer {have[0]}")
        raise LayerError(f"layers {missing} do not exist: {what} has {n} layer{'s' if n > 1 else ''} "
                         f"{_ranges(have)}; valid indices: those, or {neg}")
    return list(dict.fromkeys(have[i] if i < 0 else i for i in asked))


def _ranges(xs) -> str:
    """``[0..3]`` for a contiguous run, else the list."""
    xs = list(xs)
    return f"[{xs[0]}..{xs[-1]}]" if xs and xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2 else str(xs)


# ---- spans and image tokens of a forward ----------------------------------------------------------
def _runs(idx) -> str:
    """``3..66`` style description of sorted positions."""
    idx = [int(i) for i in idx]
    if not idx:
        return "nowhere"
    # runs of consecutive positions: i - k fixed along each
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in
                     ([i for _, i in run] for _, run in itertools.groupby(enumerate(idx), lambda t: t[1] - t[0]))) \
        + f" ({len(idx)} positions)"


def check_spans(spans: Spans, family, config, input_ids, inputs: dict | None = None) -> None:
    """Refuse user ``spans`` whose image positions are not where the image tokens of ``input_ids``
    are (the family's own spans). Spans of another length are left to the capture's length check;
    when the family cannot derive spans (the reason a user may pass their own) nothing is checked.

    Raises:
        SpanError: naming both placements and how to get correct spans.
    """
    ids = torch.as_tensor(input_ids)
    ids = ids[:1] if ids.dim() == 2 else ids
    if len(spans) != ids.shape[-1]:
        return
    try:
        true = family.spans(config, ids, inputs or {})
    except (KeyError, TypeError, ValueError):  # SpanError and UnsupportedModelError are ValueErrors
        return
    if len(true) != len(spans) or true.kinds == spans.kinds:
        return
    raise SpanError(
        f"the spans mark image positions {_runs(spans.image_index)}, but the image tokens of input_ids are at "
        f"{_runs(true.image_index)} ({family.name}): these spans belong to another prompt layout. Use spans='auto' "
        f"(the default: the family finds the image tokens), or build them from the input ids: "
        f"unicache_lib.capture.runner.spans_fn(model)(inputs['input_ids'], inputs)")


def check_image_tokens(family, config, input_ids, inputs: dict) -> None:
    """Refuse a forward that brings an image (``pixel_values``) but whose ``input_ids`` hold none of
    the model's image tokens (the prompt lacked the image marker): the model would fail with
    "Image features and image tokens do not match"; this says which marker to add."""
    if inputs.get("pixel_values") is None or input_ids is None:
        return
    try:
        tid = family.image_token_id(config)
    except UnsupportedModelError:  # a config without an image token: nothing to check
        return
    ids = torch.as_tensor(input_ids)
    rows = ids if ids.dim() == 2 else ids[None]
    if (empty := [b for b in range(rows.shape[0]) if not bool((rows[b] == tid).any())]):
        raise PromptError(
            f"the prompt has no image token (id {tid}) but the forward gets an image (pixel_values)"
            f"{f' (batch rows {empty})' if rows.shape[0] > 1 else ''}: "
            f"put the processor's image token {family.image_marker!r} in the prompt where the image goes, or let the "
            f"family lay out the prompt: unicache_lib.capture.runner.build_prompt(processor, question, family) / "
            f"model_inputs(processor, image, question, family=family)")


# ---- budgets and fractions ------------------------------------------------------------------------
def check_fraction(value, what: str = "budget", upper_inclusive: bool = True, meaning: str = "") -> float:
    """``value`` as a float fraction in ``[0, 1]`` (``[0, 1)`` without ``upper_inclusive``).

    Raises:
        TypeError: not a real number (a string such as ``"25%"`` or ``"0.25"``, None, a bool).
        InputError: a number outside the range (e.g. a token count where a fraction is meant).
    """
    desc = f"a fraction in [0, {'1]' if upper_inclusive else '1)'}" + (f" ({meaning})" if meaning else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        hint = ""
        if isinstance(value, str):
            s = value.strip()
            try:
                num = float(s[:-1]) / 100 if s.endswith("%") else float(s)
                hint = f": pass {what}={num:g}, not the string {value!r}"
            except ValueError:
                hint = f", not the string {value!r}"
        raise InputTypeError(f"{what} must be a number, {desc}{hint or f'; got {type(value).__name__} {value!r}'}")
    v = float(value)
    if not (0 <= v <= 1) or (not upper_inclusive and v == 1) or v != v:
        extra = f" ({what} is a fraction, not a count or a percentage: e.g. 0.25 for a quarter)" if v > 1 else ""
        raise InputError(f"{what} must be {desc}, got {value}{extra}")
    return v


def check_count(value, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an int ``>= minimum`` (and ``<= maximum`` when given); a bool, float or string is refused naming
    ``what`` (for a digit string the message names the number to pass)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        hint = f": pass {what}={value.strip()}, not the string {value!r}" if isinstance(value, str) and \
            value.strip().isdigit() else f"; got {type(value).__name__} {value!r}"
        raise InputTypeError(f"{what} must be a whole number >= {minimum}{hint}")
    if int(value) < minimum:
        raise InputError(f"{what} must be >= {minimum}, got {value}")
    if maximum is not None and int(value) > maximum:
        raise InputError(f"{what}={value} is more than {maximum:,}, the most it may be: pass a number in "
                         f"{minimum}..{maximum}")
    return int(value)


def check_number(value, what: str, lo: float, hi: float) -> float:
    """``value`` as a finite float in ``[lo, hi]``; NaN, infinities, strings and bools are refused naming ``what``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise InputTypeError(f"{what} must be a number in [{lo:g}, {hi:g}]; got {type(value).__name__} {value!r}")
    v = float(value)
    if not (lo <= v <= hi):  # (NaN fails every comparison)
        raise InputError(f"{what} must be a finite number in [{lo:g}, {hi:g}], got {value}")
    return v


def _token_count(v: str, what: str) -> int:
    """The token count a string budget spells (``"64t"``), or a refusal that names what is wrong with it: a space, a
    sign, an upper-case ``T``, a number without ``t``, or no whole number before the ``t``."""
    problems = ((not v.strip(), f"{what} {v!r} is empty: give a share such as 0.25 or a token count such as '64t'"),
                (any(c.isspace() for c in v), f"{what} {v!r} holds a space: write the count and the 't' together, "
                                              f"e.g. {''.join(v.split())!r}"),
                (v[:1] in ("+", "-"), f"{what} {v!r} has a sign: a token count is a plain whole number of image tokens "
                                      f"kept, e.g. {v[1:] if v[:1] == '+' else '64t'!r}"),
                (v.endswith("T"), f"{what} {v!r} ends in 'T': token counts end in a lower-case 't', e.g. "
                                  f"{v[:-1] + 't'!r}"))
    if (why := next((m for bad, m in problems if bad), None)):  # the first that applies, in this order
        raise InputError(why)
    if not v.endswith("t"):
        try:
            num = float(v[:-1]) / 100 if v.endswith("%") else float(v)
        except ValueError:
            raise InputError(f"{what} {v!r}: a string budget counts image tokens and ends in 't', e.g. '64t'; a share "
                             f"is a number, e.g. 0.25") from None
        raise InputError(f"{what} {v!r}: a share is a number, not a string: pass {num:g}; a token count ends in 't', "
                         f"e.g. '64t'")
    if not re.fullmatch(r"[0-9]+", v[:-1]):
        raise InputError(f"{what} {v!r}: a token count is a whole number of image tokens before the 't', e.g. '64t'")
    return int(v[:-1])


def budget_shares(values, n_image: int | None, what: str = "budget", tokens_known: bool = True) -> list[float]:
    """Budgets as shares of the image tokens: a number is a share (checked in (0, 1]); a string ``"64t"`` counts
    tokens and becomes ``64 / n_image`` (64 of LLaVA-1.5's 576: 0.111), refused when ``n_image`` is unknown or the
    count is outside 1..``n_image``. A zero budget (``0``, ``0.0``, ``'0t'``) keeps no image token and is refused, and
    so is a share that rounds to no token of the model's ``n_image`` (``1e-6`` of 576: the eviction keeps
    ``round(share * n_image)`` tokens) unless ``tokens_known`` is False (the check cell, before the model is loaded,
    passes :data:`MAX_IMAGE_TOKENS` for ``n_image``); a share below :data:`MIN_SHARE` (1/10,000: no token of any image
    under 10,000 tokens) is refused always, so ``[1e-9]`` stops in the check cell; two budgets that come to one share (``["16t", 0.25]`` on 64 tokens, or one value
    twice) are refused naming both, since each budget is a row of the sweep and a repeat would count its questions
    twice."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InputTypeError(f"{what}s must be a list of shares or token counts, got {values!r}; e.g. [0.1, '64t']")
    if iter(values) is values:
        raise InputTypeError(f"{what}s must be a list (or tuple), not a one-shot iterator: pass list({what}s)")
    out, given = [], []
    for v in values:
        if isinstance(v, str):
            if (k := _token_count(v, what)) == 0:
                raise InputError(f"{what} {v!r} keeps no image token: the smallest budget is '1t' (or a share > 0, "
                                 f"e.g. 0.05)")
            if not n_image:
                raise InputError(f"{what} {v!r} counts tokens, but this model does not say how many image tokens it has "
                                 "(config.image_seq_length): give the budget as a share, e.g. 0.1")
            if k > n_image:
                raise InputError(f"{what} {v!r}: the model has {n_image} image tokens; keep between 1 and {n_image}"
                                 if tokens_known else f"{what} {v!r} counts more than {n_image:,} image tokens, more "
                                 f"than any model has: give a count such as '64t', or a share such as 0.25")
            share = k / n_image
        else:
            if (share := check_fraction(v, what, True, "of the image tokens kept")) == 0:
                raise InputError(f"{what} {v!r} keeps no image token: a budget is a share in (0, 1], e.g. 0.05 (or a "
                                 f"token count such as '1t')")
            if tokens_known and n_image and round(share * n_image) == 0:
                raise InputError(f"{what} {v!r} keeps no image token of this model's {n_image}: round({v!r} x {n_image}) "
                                 f"= 0; the smallest budget that keeps one is 1/{n_image} = {1 / n_image:.3g}, or '1t'")
            if share < MIN_SHARE:
                raise InputError(f"{what} {v!r} is below {MIN_SHARE:g} (1/10,000) of the image tokens, which keeps no "
                                 f"token of any image under 10,000 tokens: give a share >= {MIN_SHARE:g}, e.g. 0.05, "
                                 f"or a token count such as '1t'")
        for u, s in zip(given, out):  # a count and a share meet only once the model says its tokens
            if abs(s - share) <= 1e-12 and (tokens_known or isinstance(u, str) == isinstance(v, str)):
                said = (f"{what} {v!r} is given twice" if u == v else f"{what}s {u!r} and {v!r} are one share "
                        f"({share:g}" + (f" of {n_image} image tokens)" if n_image else ")"))
                raise InputError(f"{said}: each budget is one row of the sweep, and a repeat would write its rows twice "
                                 f"and double its n; drop one")
            if tokens_known and n_image and round(s * n_image) == round(share * n_image):
                raise InputError(f"{what}s {u!r} and {v!r} keep the same {round(share * n_image)} of this model's "
                                 f"{n_image} image tokens (the eviction keeps round(share x {n_image})): one row of the "
                                 f"sweep would be measured twice and its n doubled; drop one, or give budgets as token "
                                 f"counts ('64t')")
        given.append(v)
        out.append(share)
    return out


def check_fractions(values, what: str = "budget", upper_inclusive: bool = True, meaning: str = "") -> list[float]:
    """:func:`check_fraction` for each of ``values`` (a single number is refused: pass a list); one value twice
    (``[0.5, 0.5]``) is refused with its own message: each is one row of a sweep, a repeat would count it twice."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InputTypeError(f"{what}s must be a list of numbers (fractions in [0, 1]), got {values!r}; e.g. [0.25, 0.5]")
    if iter(values) is values:
        raise InputTypeError(f"{what}s must be a list (or tuple / array), not a one-shot iterator: pass list({what}s)")
    out = []
    for v in values:
        x = check_fraction(v, what, upper_inclusive, meaning)
        if any(abs(x - o) <= 1e-9 for o in out):  # 0.1 and 0.1 + 1e-17 (one float apart) are one fraction
            raise InputError(f"{what} {v!r} is given twice: each {what} is one row of the sweep, and a repeat would "
                             f"write its rows twice and double its n; drop one")
        out.append(x)
    return out
