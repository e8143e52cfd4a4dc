"""A ranges file: where every sample of one rank's view lies in the dataset's source files, so
that a training program reads each sample straight from its source (`DIR/ranges.bin` of a
dataset view, beside the source files passed through as `DIR/sources/FFFFFF`; docs/dataset.md
section 10.4). The view's server is then out of the data path: with FUSE passthrough the kernel
reads the sources itself, at the speed of reading them directly.

Layout, every number a little-endian uint64 (8 bytes):

    [0, 8)             magic b"TPLXRNGS"
    [8, 80)            version (1), generation, world, rank, first step F, step count S,
                       sample count n, source count m, row width (4)
    [80, 80+8(S+1))    row starts: step F+s's rows are [starts[s], starts[s+1]); starts[0] = 0,
                       starts[S] = n
    then n rows        (sample id, source, offset, length): in reading order, step by step;
                       the sample's bytes are [offset, offset + length) of source file `source`

A sample's bytes are exactly `file[begin:end]` of its index entry (P8), as in a step file.
`generation` is the view's (`.state.json` has the same): a reader that reads the table once and
the sources afterwards reads one view, whatever switches happen meanwhile (the sources never
change).

Invariants: starts never decrease; every row's source < m; `parse(build(...))` gives back the
ids and ranges.
"""

from __future__ import annotations

import os

import attrs
import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.step_file import StepBatch

MAGIC = b"TPLXRNGS"
VERSION = 1
FIXED = 80  # magic + 9 numbers
WIDTH = 4  # numbers per row
SOURCES = "sources"  # DIR/sources/FFFFFF: the source files
OPEN_SOURCES = 256  # source files a RangesReader keeps open (a dataset of many files: the oldest closes)


def source_name(source: int) -> str:
    """The name of source file `source` in `DIR/sources/`."""
    return f"{source:06d}"


def size(steps: int, samples: int) -> int:
    """The size of a ranges file of `steps` steps and `samples` rows."""
    return FIXED + 8 * (steps + 1) + 8 * WIDTH * samples


@attrs.frozen(eq=False)
class Ranges:
    """A parsed ranges file: the header's numbers, `starts` (S + 1 row starts) and `rows` (n x 4:
    sample id, source, offset, length), both int64 arrays."""

    generation: int
    world: int
    rank: int
    first: int
    sources: int
    starts: np.ndarray
    rows: np.ndarray

    @property
    def steps(self) -> range:
        return range(self.first, self.first + len(self.starts) - 1)

    def step_rows(self, step: int) -> np.ndarray:
        """The rows of `step` (k x 4). Raises DataError if the table has no such step."""
        if step not in self.steps:
            raise DataError(f"step {step}: not in this view's steps {self.steps.start}..{self.steps.stop - 1}")
        s = step - self.first
        return self.rows[self.starts[s] : self.starts[s + 1]]


def build(generation: int, world: int, rank: int, first: int, sources: int, counts: np.ndarray,
          rows: np.ndarray) -> bytes:  # fmt: skip
    """The bytes of a ranges file: `counts[s]` rows for step first + s, `rows` (n x 4) in order."""
    counts = np.asarray(counts, np.int64)
    rows = np.asarray(rows, np.int64).reshape(-1, WIDTH)
    if len(rows) != int(counts.sum()):
        raise DataError(f"ranges: {len(rows)} rows, but the steps' counts add up to {int(counts.sum())}")
    head = np.array((VERSION, generation, world, rank, first, len(counts), len(rows), sources, WIDTH), "<u8")
    starts = np.concatenate(([0], np.cumsum(counts))).astype("<u8")
    return MAGIC + head.tobytes() + starts.tobytes() + rows.astype("<u8").tobytes()


def parse(buf: bytes | bytearray | memoryview, where: str = "ranges file") -> Ranges:
    """The table in `buf` (a whole ranges file). Raises DataError naming `where` if it is not one."""
    view = memoryview(buf).cast("B")
    if len(view) < FIXED or bytes(view[:8]) != MAGIC:
        raise DataError(f"{where}: not a tenplex ranges file (expected magic {MAGIC!r})")
    version, generation, world, rank, first, steps, n, sources, width = np.frombuffer(view, "<u8", 9, 8).tolist()
    if version != VERSION or width != WIDTH:
        raise DataError(f"{where}: version {version} with rows of {width}, this tenplex reads version {VERSION} "
                        f"with rows of {WIDTH}")  # fmt: skip
    if len(view) != size(steps, n):
        raise DataError(f"{where}: {len(view)} bytes, but {steps} steps of {n} rows in all take {size(steps, n)}")
    starts = np.frombuffer(view, "<u8", steps + 1, FIXED).astype(np.int64)
    rows = np.frombuffer(view, "<u8", WIDTH * n, FIXED + 8 * (steps + 1)).reshape(n, WIDTH).astype(np.int64)
    if starts[0] != 0 or starts[-1] != n or np.any(np.diff(starts) < 0):
        raise DataError(f"{where}: row starts do not split {n} rows in order")
    if n and int(rows[:, 1].max()) >= sources:
        raise DataError(f"{where}: a row names source {int(rows[:, 1].max())}, but there are {sources}")
    return Ranges(generation, world, rank, first, sources, starts, rows)


class RangesReader:
    """Reads a view's samples by its ranges file (`DIR/ranges.bin`) from its source files
    (`DIR/sources/`), each sample with one `preadv` into one buffer that it keeps: a batch's
    samples are views of it, valid until the next `read`. The table is read once (`refresh`
    reads it again, e.g. after a switch; a step the table lacks refreshes it once); a source is
    opened once and kept open, up to `OPEN_SOURCES` of them (then the one opened first closes:
    a dataset of a file per sample costs an open per sample, as a view's sample files do).
    Raises DataError (not a ranges file, a short read), OSError."""

    def __init__(self, directory: str | os.PathLike, table: str = "ranges.bin") -> None:
        self.directory, self.table_name = os.fspath(directory), table
        self._fds: dict[int, int] = {}
        self._buffer = bytearray(0)
        self.ranges = self.refresh()

    def refresh(self) -> Ranges:
        """Read the table again (the view's current one)."""
        path = os.path.join(self.directory, self.table_name)
        with open(path, "rb", buffering=0) as f:
            self.ranges = parse(f.read(), path)
        return self.ranges

    def _fd(self, source: int) -> int:
        fd = self._fds.get(source)
        if fd is None:
            if len(self._fds) >= OPEN_SOURCES:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = self._fds[source] = os.open(os.path.join(self.directory, SOURCES, source_name(source)), os.O_RDONLY)
        return fd

    def read(self, step: int) -> StepBatch:
        """The rank's samples of `step`, as a `StepBatch` of views of the kept buffer."""
        if step not in self.ranges.steps:
            self.refresh()
        r = self.ranges
        ids, sources, offsets, lengths = (c.tolist() for c in r.step_rows(step).T)
        total = sum(lengths)
        if len(self._buffer) < total:
            self._buffer = bytearray(total)  # views of the old one keep it alive
        view, at, samples = memoryview(self._buffer), 0, []
        for sample_id, source, offset, length in zip(ids, sources, offsets, lengths):
            got = os.preadv(self._fd(source), [view[at : at + length]], offset)
            if got != length:
                raise DataError(f"sample {sample_id} in {self.directory}/{SOURCES}/{source_name(source)}: read {got} "
                                f"of {length} bytes at offset {offset}")  # fmt: skip
            samples.append(view[at : at + length])
            at += length
        return StepBatch(r.generation, step, r.world, r.rank, ids, samples)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> RangesReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
