"""Claim G4's suggestion: reuse only the text side, from the second step on (joint attention:
the text stream's output; cross-attention: the text keys and values, which do not change)."""
from .base import ReusePolicy, register


@register
class TextSide(ReusePolicy):
    name, description = "text_side", "reuse the text side every step after the first; compute the image side"

    def decide(self, step, n_steps, similarity, key=None):
        return "reuse_text" if step > 0 else "compute"
