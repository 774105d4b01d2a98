"""Training: the recipes of the shipped models (one module each: how to build the model, one step's loss, the
evaluation), the one loop they train with (:mod:`.loop`) and the patch heads every vision tower starts from.
Outside the runtime graph: nothing a user's measurement runs imports them (``tools/layers.py``).

    python -m unicache_lib.zoo.train.llava --out data/models/tiny-llava --seed 0
"""
