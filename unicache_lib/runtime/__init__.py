"""The runtime: loading any supported model (``loaders``: a shipped name, a folder or a hub id; ``checksums``: its
weights against its card) and sampling any generator (``sampling``: the library's loop and a diffusers pipeline's own
``__call__``, with step callbacks; ``pipelines``), the tiny layouts' inputs (``tiny_layouts``) and chance-baseline
controls (``controls``). The shipped toy models, their builders and training are in :mod:`unicache_lib.zoo`."""
