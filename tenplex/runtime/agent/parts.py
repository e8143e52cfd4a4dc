"""How a network message travels: single-op parts without copies, one packed remainder, a scratch pool.

A message is a list of copy ops between two hosts. An op of at least `SINGLE_MIN` bytes whose
region is contiguous in its source array or in its target array travels as its own UCX
message (a *single*): the sender sends straight from the source view when that is contiguous
(else packs it alone), the receiver receives straight into the target view when that is
contiguous (else into a buffer it then unpacks). A single contiguous on both sides is never
copied. The other ops are packed, in op order, into one buffer that the receiver unpacks.
Both sides decide with `split(ops, src, dst)`, which looks only at shapes and boxes (never at
data), so sender and receiver always agree on the parts.

Tags: a single is tagged `SINGLE | op id`, the packed remainder with the message id. Op ids and
message ids are unique within a plan, so tags never collide between two hosts.

Pack and landing buffers come from a `Scratch` pool that is reused round after round: its pages
are touched once, when it grows, instead of faulting in fresh memory for every message (a fresh
destination roughly halves UCX shared-memory throughput on these machines).

Invariants:
- `contiguous` equals numpy's C-contiguous flag of the region's view;
- the packed buffer holds the packed ops' regions back to back, in op order;
- a `Scratch` slice is valid until the next `reserve`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tenplex.compiler.ops import CopyOp
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import Piece

SINGLE = 1 << 35  # tag bit of single-op parts (user tags have 36 bits)
SINGLE_MIN = 64 << 10  # smaller ops are packed: one UCX message each would cost more than a copy


def contiguous(local_shape: Sequence[int], piece: Piece, box: Box) -> bool:
    """Whether the view of global `box` inside `piece` of a local array is C-contiguous."""
    if box.volume == 0:
        return True
    if piece.flat:  # a flat run reshaped to the piece's global box
        return _row_major(piece.global_box.shape, box.relative_to(piece.global_box.start))
    return _row_major(tuple(local_shape), piece.to_local(box))


def _row_major(shape: Sequence[int], box: Box) -> bool:
    """A sub-box is one contiguous run iff every dim after the first one wider than 1 is full."""
    extents = box.shape
    wide = next((i for i, e in enumerate(extents) if e > 1), len(extents))
    return all(extents[j] == shape[j] for j in range(wide + 1, len(extents)))


class Single(NamedTuple):
    op_id: int
    op: CopyOp
    src_contiguous: bool  # the sender sends its source view itself
    dst_contiguous: bool  # the receiver receives into its target view itself
    nbytes: int


def split(ops: Sequence[tuple[int, CopyOp]], src: PTC, dst: PTC) -> tuple[list[Single], list[CopyOp]]:
    """(singles, packed ops) of a message, both in op order (see the module docstring)."""
    singles, packed = [], []
    for i, op in ops:
        sptc = src if op.src_side == "src" else dst
        s, d = sptc.subtensor_map[op.src_subtensor], dst.subtensor_map[op.dst_subtensor]
        nbytes = op.box.volume * sptc.itemsizes[s.tensor]
        src_c = contiguous(s.shape, s.pieces[op.src_piece], op.box)
        dst_c = contiguous(d.shape, d.pieces[op.dst_piece], op.box)
        if nbytes >= SINGLE_MIN and (src_c or dst_c):
            singles.append(Single(i, op, src_c, dst_c, nbytes))
        else:
            packed.append(op)
    return singles, packed


class Scratch:
    """A byte pool handing out slices; grows (touching its pages once) and is reused after `reset`."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)
        self._at = 0

    @property
    def nbytes(self) -> int:
        return self._buffer.nbytes

    def reserve(self, nbytes: int) -> None:
        """Make room for `nbytes` of slices in total until the next reset (drops current slices)."""
        if nbytes > self._buffer.nbytes:
            self._buffer = np.empty(0, dtype=np.uint8)  # free the old pool before the new one
            self._buffer = np.empty(nbytes, dtype=np.uint8)
            self._buffer.fill(0)
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


class Prefaulter:
    """Touches the pages of arrays in a background thread, in the order they will be written,
    so that page faults overlap with earlier rounds' transfers instead of slowing them.

    `claim(keys)` must be called before anything writes those arrays: it waits for a chunk in
    progress and then the thread never touches them again (an array it did not reach stays
    zero-filled and untouched; that is only slower, never wrong). `stop()` claims everything.
    """

    CHUNK = 16 << 20

    def __init__(self, arrays: list[tuple[object, np.ndarray]]):
        import threading

        self._order = [
            (k, a.reshape(-1).view(np.uint8)) for k, a in arrays if a.nbytes and not isinstance(a, np.memmap)
        ]
        self._claimed: set = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tenplex-prefault", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for key, flat in self._order:
            for at in range(0, flat.nbytes, self.CHUNK):
                with self._lock:
                    if key in self._claimed:
                        break
                    flat[at : at + self.CHUNK] = 0  # numpy releases the GIL for the fill

    def claim(self, keys: object) -> None:
        with self._lock:
            self._claimed.update(keys)  # type: ignore[call-overload]

    def stop(self) -> None:
        self.claim(k for k, _ in self._order)
        self._thread.join()
