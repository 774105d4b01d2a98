"""UniCache Workbench: measure how attention is distributed inside multimodal models."""
__version__ = "0.1.0"
