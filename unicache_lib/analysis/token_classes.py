"""Classes of text tokens for the text->image analyses (claim U5).

Works on the tiny models' word-level tokens and on sub-word tokens of real tokenizers (the
SentencePiece ``▁`` and byte-level ``Ġ`` markers are stripped, case is ignored).
"""
from __future__ import annotations

from ..core.errors import InputError
from ..world.text import ATTRIBUTE_WORDS, OBJECT_WORDS, POSITION_WORDS

CLASSES: tuple[str, ...] = ("object", "attribute", "position", "function", "punctuation", "special")


def token_class(token: str, special: set[str] | frozenset = frozenset()) -> str:
    """The class of one token string."""
    if token in special:
        return "special"
    t = token.replace("▁", "").replace("Ġ", "").strip().lower()
    if not any(c.isalnum() for c in t):  # punctuation, or a bare space marker
        return "punctuation"
    return ("object" if t in OBJECT_WORDS else "attribute" if t in ATTRIBUTE_WORDS or t in {"color", "colour"}
            else "position" if t in POSITION_WORDS else "function")


def classify_ids(tokenizer, input_ids) -> list[str]:
    """Class of every position of a ``[S]`` id sequence (image placeholders come out as 'special')."""
    ids = [int(i) for i in (input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids)]
    special = set(tokenizer.all_special_tokens)
    return [token_class(t, special) for t in tokenizer.convert_ids_to_tokens(ids)]


def content_position(tokens: list[str], positions) -> int:
    """The position a first look should query: the last of ``positions`` whose token names an object or a colour
    (then: any word; then: the last position), never punctuation such as the ``:`` that ends a prompt."""
    positions = [int(p) for p in positions]
    if not positions:
        raise InputError("content_position needs at least one position")
    for wanted in (("object", "attribute"), ("object", "attribute", "position", "function")):
        hits = [p for p in positions if token_class(tokens[p]) in wanted]
        if hits:
            return hits[-1]
    return positions[-1]
