"""Stage (a) of every shipped vision tower: linear heads that classify each image patch.

A tower trained from scratch together with a language model collapses to the text prior on this world
(see ../shared/PITFALLS.md and the tiny-llava card); a tower first taught to tell, patch by patch, the
colour x shape x position of the object covering it (plus the patch's row and column) does not. The
same heads serve as an auxiliary loss for towers trained jointly with their task (ViLT, CLIP).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...core.errors import InputError
from ...world.questions import TRAIN_QTYPES
from ...world.scenes import COLOURS, POSITIONS, SHAPES, patch_grid_masks
from .loop import Stage, fit, warmup
from ...world.text import make_qa

N_CLASSES = 1 + len(COLOURS) * len(SHAPES) * len(POSITIONS)


def patch_labels(scene, patch: int) -> np.ndarray:
    """``[n_patches]`` class per patch (row-major): 0 background, else 1 + colour*15 + shape*5 + position."""
    idx = patch_grid_masks(scene.masks, patch)
    out = np.zeros_like(idx)
    cols, shps, poss = list(COLOURS), list(SHAPES), list(POSITIONS)
    for i, o in enumerate(scene.objects):
        out[idx == i] = 1 + cols.index(o.colour) * 15 + shps.index(o.shape) * 5 + poss.index(o.position)
    return out


class PatchHeads(torch.nn.Module):
    """Class, row and column heads over patch features ``[B, n_patches, d]`` of a ``grid x grid`` layout."""

    def __init__(self, d: int, grid: int):
        super().__init__()
        self.grid = grid
        self.cls = torch.nn.Linear(d, N_CLASSES)
        self.row = torch.nn.Linear(d, grid)
        self.col = torch.nn.Linear(d, grid)

    def loss(self, feats: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``feats [B, grid*grid, d]``, ``labels [B, grid*grid]`` -> (loss, patch accuracy)."""
        B, n = labels.shape
        if feats.shape[1] != n or n != self.grid ** 2:
            raise InputError(f"patch features {tuple(feats.shape)} do not match {n} labels of a {self.grid}x{self.grid} grid")
        pos = torch.arange(n)
        logits = self.cls(feats)
        F = torch.nn.functional
        loss = (F.cross_entropy(logits.flatten(0, 1), labels.flatten())
                + 0.5 * F.cross_entropy(self.row(feats).flatten(0, 1), (pos // self.grid).repeat(B))
                + 0.5 * F.cross_entropy(self.col(feats).flatten(0, 1), (pos % self.grid).repeat(B)))
        return loss, (logits.argmax(-1) == labels).float().mean().item()


def train_patch_heads(features: Callable, params: list, d: int, grid: int, patch: int, rng, steps: int, batch: int,
                      lr: float, log: list, desc: str = "stage a: vision tower", size: int = 64) -> float:
    """Train ``params`` (a tower's) so that ``features(images_uint8 [B, H, W, 3]) -> [B, grid*grid, d]``
    classify every patch. Warmup then cosine; returns the last patch accuracy (on the training batch)."""
    heads = PatchHeads(d, grid)

    def step_loss(step):
        scenes = [make_qa(rng, qtypes=TRAIN_QTYPES, size=size).scene for _ in range(batch)]
        y = torch.from_numpy(np.stack([patch_labels(s, patch) for s in scenes]))
        loss, acc = heads.loss(features(np.stack([s.uint8() for s in scenes])), y)
        return loss, lambda: {"loss": loss.item(), "patch_acc": acc}

    last = fit(Stage("a", desc, steps, lr, warmup(steps, 100)), list(params) + list(heads.parameters()), step_loss, log)
    return last.get("patch_acc", float("nan"))
