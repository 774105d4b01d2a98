"""The downsampled image, a control: the picture encoded at a coarser resolution by the family's own vision tower.

VTC-Bench (arXiv 2510.07143) found that simply feeding a smaller image beats many published visual-token pruning
methods. Where :class:`~.pooling.ImagePooling` averages the image *features* over windows, this control resizes the
*picture* to an ``a x b`` patch grid (``a = floor(sqrt(k))``, ``b = floor(k / a)``, as pooling lays it out: at most
``k`` tokens) and runs the vision tower and projector on it (position embeddings interpolated), so the tower itself
sees less. Each token takes the position of its window's centre patch (``renumber=False``, as pooling). Families
whose tower runs at one resolution only, or whose image tokens are no single grid, are skipped with the reason
(:meth:`~unicache_lib.families.base.VLMFamily.image_features_at`). A prefill-stage policy.
"""
from dataclasses import dataclass

from ...core.errors import ContractError, PrefillPruningUnsupported
from .base import PrefillStagePolicy, register
from .pooling import grid_side, pooled_grid, window_positions


@register
@dataclass(eq=False)
class DownsampledImage(PrefillStagePolicy):
    name, exact_budget = "downsample", False
    description = "control: the picture resized to at most the budget's patches, through the vision tower, before the prefill"

    renumber: bool = False

    def choose(self, ctx, k):
        side = grid_side(ctx, PrefillPruningUnsupported("the downsampled-image control needs the image tokens as one "
                                                        "square grid over the picture; this family's are not (tiles, "
                                                        "newline tokens)"))
        if ctx.encode is None:
            raise ContractError("the downsampled-image control re-encodes the picture: build the context with "
                                "prefill(...).context(), which carries the model's encoder")
        a, b = pooled_grid(side, k)
        feats = ctx.encode(a, b)  # [a * b, D], row-major
        if feats.shape[0] != a * b:
            raise ContractError(f"the family's image_features_at returned {feats.shape[0]} tokens for a {a} x {b} grid")
        return [(window_positions(ctx, side, a, b), feats)]
