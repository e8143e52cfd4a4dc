"""The error of the safetensors reader and writer."""

from __future__ import annotations

from tenplex.ir.errors import TenplexError

__all__ = ["HfError"]


class HfError(TenplexError, ValueError):
    """A safetensors file or Hugging Face directory that cannot be read or written; names the
    file and the field."""
