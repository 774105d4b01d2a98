"""Analyses built on captured statistics: anchors, token classes, step dynamics."""
