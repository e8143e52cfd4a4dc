"""What an open file of a dataset view serves (`dataset.ops`): a `Layout` is a header, zero
padding, then samples back to back; a sample file is its `.npy` header (megatron) or nothing,
then one sample; a step file (`tenplex.data.step_file`) its table, padding to the data offset,
then the step's samples; a source file its bytes as they are (`source_layout`). `Open` is one
open file: its layout, what a prefetcher gave it, and the source file it shows, if one.

Invariants: a `Layout` is immutable once built (the opens of one view's step file share it);
`starts[k]` is where part k begins and `size` is the file's size.
"""

from __future__ import annotations

import itertools
import threading

from tenplex.data.errors import DataError
from tenplex.data.reader import SampleReader
from tenplex.data.step_file import ALIGN, StepFile

ZEROS = memoryview(bytes(ALIGN))  # a step file's padding (not kept per step)


class Layout:
    """What an open file serves: `header` bytes, `pad` zero bytes, then the samples `parts`, each
    (step, position, sample id, length), back to back from `starts`; `ranges`, where known, each
    part's (fd, offset) in its source file. Immutable: a view's opens of one step file share it."""

    __slots__ = ("direct", "header", "pad", "parts", "ranges", "size", "starts")

    def __init__(self, header: bytes, parts: tuple[tuple[int, int, int, int], ...] = (), direct: bool = False,
                 pad: int = 0, ranges: list[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.header, self.pad, self.parts, self.direct, self.ranges = header, pad, parts, direct, ranges
        self.starts = list(itertools.accumulate((p[3] for p in parts[:-1]), initial=len(header) + pad))
        self.size = len(header) + pad + sum(p[3] for p in parts)


def step_layout(step_file: StepFile, reader: SampleReader) -> Layout:
    """A step file's layout: its table (the padding to the data served from `ZEROS`, not kept per
    step), its samples and, for local sources, their file ranges (found once, not per READ)."""
    parts = tuple((step_file.step, k, i, n) for k, (i, n) in enumerate(zip(step_file.ids, step_file.lengths)))
    try:
        ranges = [reader.file_range(i, 0, 0) for i in step_file.ids]
        known = None if None in ranges else [r[:2] for r in ranges]  # None: a source behind a URL
    except DataError:  # a source that cannot be opened: its reads find out (EIO)
        known = None
    header = step_file.header()[: step_file.table_size]
    return Layout(header, parts, True, step_file.data_offset - len(header), known)


def source_layout(size: int) -> Layout:
    """The layout of a source file of `size` bytes (its reads name the source itself: `Open.source`)."""
    return Layout(b"", ((-1, 0, -1, size),))


class Open:
    """An open file: its `layout`, the bytes of its samples that a prefetcher gave (fetched
    lazily), and for a source file its number in the index and its open descriptor (None: behind
    a URL)."""

    __slots__ = ("data", "fd", "layout", "lock", "source")

    def __init__(self, layout: Layout, source: int | None = None, fd: int | None = None) -> None:
        self.layout, self.data, self.lock, self.source, self.fd = layout, {}, threading.Lock(), source, fd
