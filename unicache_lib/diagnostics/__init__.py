"""Diagnostics: a hallucination signal from attention, a modality-neglect detector, broken-model
variants to test it on, and a one-call report."""
