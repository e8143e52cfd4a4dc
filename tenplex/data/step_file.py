"""A step file: one rank's share of one step as ONE file, so that a training program reads its
micro-batch with one open and one read (`DIR/step-SSSSSS.bin` of a dataset view; docs/dataset.md).

Layout, every number a little-endian uint64 (8 bytes):

    [0, 8)        magic b"TPLXSTEP"
    [8, 64)       version (1), generation, step, world, rank, count n, data offset D
    [64, 64+24n)  n rows (sample id, offset, length): the samples in reading order, each
                  at bytes [offset, offset + length) of this file
    [64+24n, D)   zeros; D is the header's end rounded up to a multiple of 4096
    [D, size)     the samples' bytes, one after another: sample k's offset is D plus the
                  lengths of samples 0..k-1; size = D + the sum of the lengths

A sample's bytes are exactly `file[begin:end]` of its index entry (P8; no per-format header,
unlike the per-sample files of megatron samples). `generation` is the view's: the files of one
view all carry the same one, so a reader can tell that it mixed two views.

Invariants: offsets increase, start at D and leave no gap; `parse(build(...) + data)` gives back
the ids and the samples.
"""

from __future__ import annotations

import os

import attrs
import numpy as np

from tenplex.data.errors import DataError

MAGIC = b"TPLXSTEP"
VERSION = 1
ALIGN = 4096  # the data starts page-aligned
FIXED = 64  # magic + 7 numbers
_ROW = 24


def data_offset(count: int) -> int:
    """Where the data of a step file of `count` samples starts."""
    return -(-(FIXED + _ROW * count) // ALIGN) * ALIGN


@attrs.frozen
class StepFile:
    """Step `step` of rank `rank` of `world` in view `generation`: its samples `ids` (in reading
    order) of `lengths` bytes, laid out as the module doc says."""

    generation: int
    step: int
    world: int
    rank: int
    ids: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def table_size(self) -> int:
        """Bytes [0, table_size) are the numbers and the table; zeros follow up to `data_offset`."""
        return FIXED + _ROW * len(self.ids)

    @property
    def data_offset(self) -> int:
        return data_offset(len(self.ids))

    @property
    def size(self) -> int:
        return self.data_offset + sum(self.lengths)

    def header(self) -> bytes:
        """Bytes [0, data_offset) of the file."""
        n = len(self.ids)
        head = np.zeros(self.data_offset // 8, "<u8")
        head[1:8] = (VERSION, self.generation, self.step, self.world, self.rank, n, self.data_offset)
        rows = head[8 : 8 + 3 * n].reshape(n, 3)
        rows[:, 0] = self.ids
        rows[:, 1] = np.cumsum((self.data_offset, *self.lengths[:-1])) if n else []
        rows[:, 2] = self.lengths
        out = head.tobytes()
        return MAGIC + out[8:]


@attrs.frozen
class StepBatch:
    """A parsed step file: the header's numbers, the sample ids and each sample's bytes (views
    of the buffer read, no copy)."""

    generation: int
    step: int
    world: int
    rank: int
    ids: list[int]
    samples: list[memoryview]


def parse(buf: bytes | bytearray | memoryview, where: str = "step file") -> StepBatch:
    """The step batch in `buf` (a whole step file). Raises DataError naming `where` if `buf` is
    not one (magic, version, a table or data past its end)."""
    view = memoryview(buf).cast("B")
    if len(view) < FIXED or bytes(view[:8]) != MAGIC:
        raise DataError(f"{where}: not a tenplex step file (expected magic {MAGIC!r})")
    version, generation, step, world, rank, n, data = np.frombuffer(view, "<u8", 7, 8).tolist()
    if version != VERSION:
        raise DataError(f"{where}: version {version}, this tenplex reads version {VERSION}")
    if FIXED + _ROW * n > min(data, len(view)):
        raise DataError(f"{where}: a table of {n} samples does not fit in {len(view)} bytes")
    ids, offsets, lengths = np.frombuffer(view, "<u8", 3 * n, FIXED).reshape(n, 3).T.tolist()
    if n and offsets[-1] + lengths[-1] > len(view):
        raise DataError(f"{where}: {offsets[-1] + lengths[-1]} bytes, but {len(view)} were read")
    return StepBatch(generation, step, world, rank, ids, [view[o : o + k] for o, k in zip(offsets, lengths)])


def read(path: str | os.PathLike) -> StepBatch:
    """The step batch of the step file at `path`, read with one open and (normally) one read into
    fresh memory (its samples stay valid; `StepReader` reuses one buffer instead). Raises
    DataError (not a step file), OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = _rest(fd, os.fstat(fd).st_size + ALIGN)
    finally:
        os.close(fd)
    return parse(data, os.fspath(path))


class StepReader:
    """Reads step files into one buffer that it keeps (a larger one when a file needs it): a
    training loop's reads then touch no fresh memory (a fresh buffer per step costs its page
    faults, more than the copy itself for steps of megabytes). A batch's samples are views of the
    buffer, valid until the next `read`."""

    def __init__(self, size: int = 0) -> None:
        self._buffer = bytearray(size)

    def read(self, path: str | os.PathLike) -> StepBatch:
        """The step batch of the step file at `path`: one open and (normally) one read. Raises
        DataError (not a step file), OSError."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size + ALIGN  # a page more: the same read finds EOF
            if len(self._buffer) < size:
                self._buffer = bytearray(size)  # views of the old one keep it alive
            view = memoryview(self._buffer)
            got = os.readv(fd, [view])
            data = view[:got] if got < len(view) else view.tobytes() + _rest(fd, len(view))
        finally:
            os.close(fd)
        return parse(data, os.fspath(path))


def _rest(fd: int, size: int) -> bytes:
    """The bytes of `fd` from its position to EOF, read `size` at a time (normally one read: a
    file bigger than its cached size is read on)."""
    parts = [os.read(fd, size)]
    while len(parts[-1]) == size:
        parts.append(os.read(fd, size))
    return parts[0] if len(parts) == 1 else b"".join(parts)
