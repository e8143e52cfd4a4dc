"""How a network part's bytes are staged: packing views into a buffer, unpacking, a scratch pool.

A part (`compiler.emit.slices`) is one UCX message: a single op's region or several ops packed
back to back in op order. A side whose part is one C-contiguous view sends from it or receives
into it directly; otherwise it packs into (or unpacks from) a slice of the `Scratch` pool.

The pool is reused round after round and execution after execution: its pages are touched
once, by the first pack or receive into them, never zero-filled (every byte of a slice is
written before it is read), instead of faulting in fresh memory for every message.

Invariants:
- a packed buffer holds its views' bytes back to back, in order;
- a `Scratch` slice is valid until the next `reserve`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tenplex.ir.errors import ExecutionError


def pack(views: Sequence[np.ndarray], out: np.ndarray) -> None:
    """Copy `views` back to back into the uint8 buffer `out` (exactly their size)."""
    at = _each(views, out, lambda v, chunk: np.copyto(chunk, v))
    if at != out.nbytes:
        raise ExecutionError(f"pack buffer has {out.nbytes} B but the views take {at} B")


def unpack(views: Sequence[np.ndarray], buffer: np.ndarray) -> None:
    """Copy the uint8 `buffer` (exactly their size) back into `views`, in order."""
    at = _each(views, buffer, lambda v, chunk: np.copyto(v, chunk))
    if at != buffer.nbytes:
        raise ExecutionError(f"message buffer has {buffer.nbytes} B but its views take {at} B")


def _each(views: Sequence[np.ndarray], buffer: np.ndarray, copy: object) -> int:
    at = 0
    for v in views:
        n = v.nbytes
        if at + n > buffer.nbytes:
            raise ExecutionError(f"buffer of {buffer.nbytes} B is too short for its views ({at + n} B and more)")
        copy(v, buffer[at : at + n].view(v.dtype).reshape(v.shape))  # type: ignore[operator]
        at += n
    return at


class Scratch:
    """A byte pool handing out slices; grows (its new pages touched by their first use) and is
    reused after each `reserve`."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)
        self._at = 0

    @property
    def nbytes(self) -> int:
        return self._buffer.nbytes

    def reserve(self, nbytes: int) -> None:
        """Make room for `nbytes` of slices in total until the next reserve (drops current slices)."""
        if nbytes > self._buffer.nbytes:
            self._buffer = np.empty(0, dtype=np.uint8)  # free the old pool before the new one
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        self._at = 0

    def take(self, nbytes: int) -> np.ndarray:
        if self._at + nbytes > self._buffer.nbytes:
            raise ValueError(f"scratch pool of {self._buffer.nbytes} B has {self._buffer.nbytes - self._at} B left, "
                             f"{nbytes} B asked (reserve first)")  # fmt: skip
        out = self._buffer[self._at : self._at + nbytes]
        self._at += nbytes
        return out

    def release(self) -> None:
        """Drop the pool's memory."""
        self._buffer = np.empty(0, dtype=np.uint8)
        self._at = 0
