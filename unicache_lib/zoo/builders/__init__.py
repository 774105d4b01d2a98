"""Builders of models for tests and rehearsals: random-weight stand-ins of real checkpoints and pipelines at their
real shapes (:mod:`.standins`, :mod:`.gen_standins`) and tiny random ones for the test suites (:mod:`.tiny_random`,
:mod:`.tiny_pipelines`). Outside the runtime graph (``tools/layers.py``)."""
