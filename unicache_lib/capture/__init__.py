"""Attention capture: context managers that record attention and restore the model on exit."""
from .record import CaptureResult, Record
from .vlm import MODES, AttentionCapture, CaptureError, find_attention_modules, unwrap

__all__ = ["AttentionCapture", "CaptureError", "CaptureResult", "MODES", "Record", "find_attention_modules", "unwrap"]
