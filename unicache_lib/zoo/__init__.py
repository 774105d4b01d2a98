"""Model building, training scripts and loaders."""
