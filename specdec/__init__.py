"""specdec: lossless speculative decoding for Llama-family models."""

from specdec.errors import SpecdecError

__all__ = ["SpecdecError"]
__version__ = "0.1.0"
