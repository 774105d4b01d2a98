"""Random-weight stand-ins of real checkpoints, for the real-shape rehearsal.

Each stand-in is built from its family adapter with the real model's token counts and depth (image
tokens per image, language and vision layers, heads, key-value heads, cross-attention layout) and
a reduced width (head dimension, vision width), saved with ``save_pretrained`` next to its processor
and a model card that says ``"stand_in": true``. They test code paths, memory and time at real
shapes; their attention statistics mean nothing, and notebooks show "not meaningful (random
weights)" instead of verdicts for them.

    python -m unicache_lib.zoo.builders.standins --out outputs/rehearsal/models            # all three
    python -m unicache_lib.zoo.builders.standins --out DIR --only llava-1.5-7b
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...core.compat import transformers
from ...core.errors import InputError, UnknownNameError
from ...core.untrusted import folder_inside
from ...families import FAMILIES, Shape
from ...paths import check_output_path, claim_output_folder, odd_entry, record_output_files
from ...runtime.checksums import CARD, write_card


@dataclass(frozen=True)
class StandIn:
    """``family``: adapter name; ``imitates``: the hub checkpoint; ``real``: the real config's sizes
    (published ``config.json``); ``shape``: what is built (real counts, reduced width)."""

    family: str
    imitates: str
    real: dict
    shape: Shape
    notes: str = ""
    image_tokens: int = 0
    real_width: Shape | None = None  # the real widths too (for a GPU: `gpu-rehearsal`)


STANDINS: dict[str, StandIn] = {
    "llava-1.5-7b": StandIn(
        "LLaVA-1.5", "llava-hf/llava-1.5-7b-hf",
        real={"text": "Llama 32 layers x 32 heads x 128 (hidden 4096), 32 KV heads",
              "vision": "CLIP ViT-L/14-336: 24 layers x 16 heads, hidden 1024", "image_tokens": 576},
        shape=Shape(layers=32, heads=32, kv_heads=32, head_dim=8, vision_layers=24, vision_heads=16, vision_head_dim=4,
                    image_size=336, patch=14, extra={"vision_feature_layer": -2}),
        image_tokens=576,
        real_width=Shape(layers=32, heads=32, kv_heads=32, head_dim=128, vision_layers=24, vision_heads=16, vision_head_dim=64,
                         image_size=336, patch=14, extra={"vision_feature_layer": -2, "intermediate": 11008})),
    "qwen2-vl-2b": StandIn(
        "Qwen2-VL", "Qwen/Qwen2-VL-2B-Instruct",
        real={"text": "Qwen2 28 layers x 12 heads x 128 (hidden 1536), 2 KV heads, M-RoPE [16, 24, 24]",
              "vision": "ViT 32 blocks x 16 heads, hidden 1280, patch 14, 2x2 merge",
              "image_tokens": "dynamic: 256 for a 448 x 448 image"},
        shape=Shape(layers=28, heads=12, kv_heads=2, head_dim=8, vision_layers=32, vision_heads=16, vision_head_dim=4,
                    image_size=448, patch=14),
        notes="the processor resizes every image to 448 x 448 pixels (min_pixels = max_pixels), so each image "
              "has 256 tokens, as a 448-px photo has on the real model", image_tokens=256),
    "llama-3.2-11b-vision": StandIn(
        "Mllama", "meta-llama/Llama-3.2-11B-Vision-Instruct",
        real={"text": "Llama 40 layers (cross-attention at 3, 8, ..., 38) x 32 heads x 128 (hidden 4096), 8 KV heads",
              "vision": "32 + 8 global layers x 16 heads, hidden 1280, 560-px tiles, patch 14, up to 4 tiles",
              "image_tokens": "4 tiles x 1601 vision tokens (cross-attention keys)"},
        shape=Shape(layers=40, heads=32, kv_heads=8, head_dim=8, vision_layers=4, vision_heads=4, vision_head_dim=8,
                    image_size=560, patch=14,
                    extra={"cross_every": 5, "global_layers": 1, "intermediate_layers_indices": [1, 3]}),
        notes="the vision encoder is 4 + 1 layers instead of 32 + 8: it attends jointly over all 4 tiles (6,432 "
              "tokens), which at full depth takes about a minute per image on 2 CPU cores; its output, the 4 x 1601 "
              "cross-attention keys, has the real count", image_tokens=4 * 1601),
}


def tiny(family: str) -> StandIn:
    """A random-weight model of ``family`` at the shipped models' tiny shape (64 image tokens, 4 layers: one per depth
    band and two in the middle): a model that yields nothing, for checking that every notebook section says so instead
    of crashing (tests only)."""
    if family not in FAMILIES:
        raise UnknownNameError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    return StandIn(family, "(none: a tiny random-weight model)", real={}, shape=Shape(layers=4), image_tokens=64)


def build(name: str, out: Path, seed: int = 0, real_width: bool = False, device: str = "cpu",
          dtype: torch.dtype = torch.float32, spec: StandIn | None = None) -> Path:
    """Build the stand-in ``name`` into ``out / name`` (config, random weights, processor, card).

    ``real_width``: the real model's widths too (LLaVA-1.5-7B: hidden 4096, about 7B parameters; build it
    on a GPU with ``device="cuda", dtype=torch.float16``, where the weights are created directly).
    ``spec``: build this spec under ``name`` instead of ``STANDINS[name]`` (e.g. :func:`tiny`).
    """
    if spec is None and name not in STANDINS:
        raise UnknownNameError(f"unknown stand-in {name!r}; known: {', '.join(STANDINS)}")
    spec = spec or STANDINS[name]
    shape = spec.real_width if real_width else spec.shape
    if shape is None:
        raise InputError(f"stand-in {name!r} has no real-width shape; real widths exist for "
                         f"{', '.join(n for n, s in STANDINS.items() if s.real_width)}")
    d = model_folder(out, name + ("-real-width" if real_width else ""))  # before anything is built
    fam = FAMILIES[spec.family]
    t0 = time.perf_counter()
    tok = fam.tokenizer()
    cfg = fam.config(tok, shape)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = getattr(transformers, fam.model_class_for(cfg.model_type))(cfg).eval()
        fam.activate(model)
    finally:
        torch.set_default_dtype(old)
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)
    fam.processor(tok, shape).save_pretrained(d)
    card = {"model": name, "stand_in": True, "imitates": spec.imitates, "family": spec.family, "seed": seed,
            "class": type(model).__name__, "real": spec.real, "shape": asdict(shape),
            "parameters": sum(p.numel() for p in model.parameters()),
            "real_width": real_width,
            "image_tokens": spec.image_tokens, "notes": spec.notes,
            "what_it_is_for": "code paths, memory and time at the real model's token counts and depth; random "
                              "weights, so no statistic or verdict of it means anything",
            "build_seconds": round(time.perf_counter() - t0, 1)}
    write_card(d, card)
    return record_model(out, d)


MODELS_TOOL = "standins"  # the marker of a folder of stand-ins (both builders' and the rehearsal's models/)


def model_folder(out, name: str) -> Path:
    """``out/name``, where a stand-in is about to be saved: new, or a stand-in a builder saved there (its model card,
    which holds the weights' checksums, recorded in ``out``'s marker with the content it holds now,
    :func:`record_model`); never a folder of a user's model, whose files saving would replace in place. Refused in one
    line (:class:`InputError`) before anything is built."""
    d = Path(out) / name
    if os.path.lexists(d):  # a real folder inside out, never a link to one elsewhere (saving would follow it)
        folder_inside(out, name, what="stand-in folder", fix="a stand-in is never saved through a link: remove the "
                      "link, or choose another --out")
    if os.path.lexists(d) and not os.path.lexists(d / CARD):
        raise InputError(f"{d} is there already and is not a stand-in a builder saved (no {CARD}; a model of yours?): "
                         f"saving the stand-in would replace its files. Choose another --out, or move it away")
    check_output_path(out, "--out", MODELS_TOOL, files=[f"{name}/{CARD}"])  # a card the builders did not record: refused
    if os.path.lexists(d) and (why := odd_entry(d, "no stand-in builder")):  # saving would write through it
        raise InputError(f"{d} {why}: a stand-in is saved only over files of its own; remove it, or choose another --out")
    return d


def record_model(out, d: Path) -> Path:
    """Record the stand-in just saved in ``d`` (its model card) in ``out``'s marker as the builders', so a later build
    may replace it (:func:`model_folder`)."""
    record_output_files(out, MODELS_TOOL, {f"{d.name}/{CARD}": (d / CARD).read_bytes()})
    return d


def standins_cli(doc: str, names, argv=None, step: bool = False) -> argparse.Namespace:
    """The command line of a stand-in builder: ``--out`` (new, empty or a folder of stand-ins the builders or the
    rehearsal made: each model is saved into its own sub-folder there, replacing an earlier build), ``--only`` a
    subset of ``names``, ``--seed`` and, with ``step``, ``--step``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default="outputs/rehearsal/models")
    ap.add_argument("--only", nargs="*", default=None, choices=list(names), help=f"subset of {', '.join(names)}")
    ap.add_argument("--seed", type=int, default=0)
    if step:
        ap.add_argument("--step", action="store_true", help="then load it and time one denoising step (JSON line)")
    a = ap.parse_args(argv)
    claim_output_folder(a.out, MODELS_TOOL, writes="the stand-ins saved there")  # never a folder of a user's
    try:  # nor a model folder of a user's in it: each checked before the first is built
        for n in a.only or names:
            model_folder(a.out, n)
    except InputError as e:
        ap.error(str(e))
    return a


def main(argv=None):
    a = standins_cli(__doc__, STANDINS, argv)
    for name in a.only or STANDINS:
        print(build(name, Path(a.out), a.seed))


if __name__ == "__main__":
    main()
