"""Shared pieces of the DCP reader and writer: the error type and a bounded file view for
`torch.load`. Non-tensor entries become values through `dtensor.values`.
"""

from __future__ import annotations

import io
from typing import Any

from tenplex.ir.errors import TenplexError

__all__ = ["DcpError", "FileSlice"]


class DcpError(TenplexError, ValueError):
    """A DCP checkpoint directory that cannot be read or written; names the file and the key."""


class FileSlice(io.RawIOBase):
    """Read-only, seekable view of bytes [offset, offset + length) of an open binary file."""

    def __init__(self, file: io.BufferedReader, offset: int, length: int):
        super().__init__()
        self._file, self._start, self._length, self._pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        if n == 0:
            return 0
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(memoryview(buffer)[:n])
        self._pos += got or 0
        return got or 0
