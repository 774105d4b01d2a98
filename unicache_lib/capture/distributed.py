"""Capture the standard sample set with N processes, each writing its own part of one store.

    torchrun --nproc_per_node 2 -m unicache_lib.capture.distributed --out outputs/store
    accelerate launch --num_processes 2 -m unicache_lib.capture.distributed --out outputs/store

Each rank (``RANK`` / ``WORLD_SIZE`` from the launcher) takes a disjoint slice of the samples
(:func:`~unicache_lib.store.shard_samples`) and writes its own index log ``index-rankNNNNN.jsonl`` and chunk
folders; readers merge the parts through the indexes. No process group is needed: ranks never
write the same file. A model too big for one device loads with ``--device-map auto``.
"""
from __future__ import annotations

import argparse
import os

import torch

from ..paths import cli_output_path
from ..runtime.loaders import load_understanding
from ..store import Store, shard_samples
from ..world import samples as sample_set
from .runner import capture_samples


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kw in (("--model", dict(default="tiny-llava")), ("--out", dict(required=True)),
                     ("--mode", dict(default="stats", choices=["stats", "full", "recompute"])),
                     ("--n-samples", dict(type=int, default=20)), ("--layer-batch", dict(type=int, default=0)),
                     ("--device-map", dict(default=None))):
        ap.add_argument(flag, **kw)
    args = ap.parse_args(argv)
    if args.layer_batch < 0:  # -1 captured nothing and exited 0
        ap.error(f"--layer-batch must be >= 1 (0, the default: all layers in one forward), got {args.layer_batch}")
    cli_output_path(args.out, "unicache-capture")  # not empty, not the repository or one of its own folders
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    model, processor = load_understanding(args.model, attn_implementation="sdpa" if args.mode == "recompute" else "eager",
                                          device_map=args.device_map)
    mine = shard_samples(sample_set.load()[: args.n_samples], rank, world)
    store = Store(args.out, rank=rank, meta={"model": args.model, "dtype": str(next(model.parameters()).dtype),
                                             "world_size": world})
    res = capture_samples(model, processor, mine, store=store, mode=args.mode,
                          layer_batch=args.layer_batch or None, progress=None if rank == 0 else False)
    print(f"rank {rank}/{world}: captured {len(res.samples)} samples, {len(res)} records")


if __name__ == "__main__":
    main()
