"""The shipped toy models: their architectures (``tiny_llava``, ``tiny_generators``), builders (``builders/``) and
training scripts (``train/``, ``shipping``). Loading and sampling any model is :mod:`unicache_lib.runtime`."""
