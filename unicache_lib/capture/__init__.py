"""Attention capture: context managers that record attention and restore the model on exit."""
from ..core.errors import CaptureError
from ..core.models import unwrap
from .record import CaptureResult, Record
from .vlm import MODES, AttentionCapture, find_attention_modules

__all__ = ["AttentionCapture", "CaptureError", "CaptureResult", "MODES", "Record", "find_attention_modules", "unwrap"]
