"""Shared-memory arenas: arrays in anonymous memory files that other processes can map.

An `Arena` is one memory file (`memfd_create`), mapped once, holding arrays at 64-byte aligned
offsets. Its file descriptor can be passed to another process on the same machine over a Unix
socket (`SCM_RIGHTS`), which maps the same pages: a training program writes its state into an
arena and hands it to its agent's store, and reads a state from the arenas the store holds,
with no copy in between. The memory is freed when the last mapping and descriptor are gone.

Invariants:
- an arena's size is fixed at creation and sealed (`F_SEAL_SHRINK | F_SEAL_GROW`): no process
  holding its descriptor can shrink it under another's mapping (which would crash the reader
  with SIGBUS); `adopt` refuses a descriptor without these seals;
- `array(offset, shape, dtype)` views lie inside the arena;
- `fd` is open exactly as long as the arena object lives (closed by `close` or at collection),
  and is close-on-exec;
- a read-only arena's views are read-only;
- an arena goes back to its `ArenaPool` (pages kept, not zeroed) only when no leaf and no other
  process holds it, and is handed out again only once no view maps it either: one whose
  descriptor was sent to another process (`exported`) is closed as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import math
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

ALIGN = 64
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Offsets of consecutive blocks of `sizes` bytes, each aligned, and the total size."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += aligned(n)
    return offsets, at


class Arena:
    """One shared memory file, mapped (see the module docstring)."""

    def __init__(self, fd: int, size: int, writable: bool, mapped: mmap.mmap | None = None):
        self.fd, self.size, self.writable = fd, size, writable
        self.pool: ArenaPool | None = None  # where it goes once unused (see the module docstring)
        self.exported = False  # its descriptor went to another process: never pooled
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # mmap of 0 bytes is an error; an arena of empty arrays maps one page it never uses
        self.map = mapped or (mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, prot) if size or writable else None)

    @classmethod
    def create(cls, size: int, name: str = "tenplex") -> Arena:
        """A new zero-filled arena of `size` bytes. Raises OSError (e.g. ENOMEM, EMFILE)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, max(size, 1))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            return cls(fd, size, True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int, writable: bool = False) -> Arena:
        """The arena of a descriptor received from another process (this object owns `fd`).
        Raises OSError when `fd` is not a memory file sealed against resizing."""
        try:
            st = os.fstat(fd)
            if not (st.st_mode & 0o170000 == 0o100000):
                raise OSError(f"descriptor {fd} is not a regular file")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if seals & SEALS != SEALS:
                raise OSError("the arena is not sealed against resizing (memfd with F_SEAL_SHRINK | F_SEAL_GROW)")
            return cls(fd, st.st_size, writable)
        except BaseException:
            os.close(fd)
            raise

    def array(self, offset: int, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        """The array of `shape` and `dtype` at `offset` (a view of the shared pages)."""
        dtype = np.dtype(dtype)
        count = math.prod(shape)  # not np.prod: ~10x slower on the short shapes of every dst array
        if offset < 0 or offset + count * dtype.itemsize > self.size:
            raise ValueError(f"array of {count * dtype.itemsize} bytes at offset {offset} lies outside the arena of {self.size}")
        if count == 0 or self.map is None:
            return np.zeros(tuple(shape), dtype)
        out = np.frombuffer(self.map, dtype, count, offset).reshape(tuple(shape))
        if not self.writable:
            out.flags.writeable = False
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # no leaf holds it; 2 references to the map (ours, getrefcount's) mean no view maps it either,
        # else the pool keeps it aside until the views are gone
        pooled = self.pool is not None and not self.exported and self.fd >= 0 and self.map is not None
        unmapped = sys.getrefcount(self.map) == 2  # counted before `give`'s argument adds a reference
        if pooled and self.pool.give(self.fd, self.size, self.map, unmapped):
            self.fd, self.map = -1, None
            return
        with contextlib.suppress(OSError):
            self.close()


class ArenaPool:
    """Arenas whose pages this process already touched, kept for the next `take` instead of
    faulting fresh memory in (first touch runs at a fraction of memcpy speed on VMs). Holds at
    most `limit` bytes (None: the largest arena taken so far, one execution's dst). An arena given
    back while views of it still live (a reader that has not let go of an array yet) waits
    aside and is handed out only once no view maps it; before, it was closed, and the next
    execution faulted all its pages in anew."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.largest = limit, 0
        self.free: list[tuple[int, int, mmap.mmap]] = []  # (size, fd, map)
        self.waiting: list[tuple[int, int, mmap.mmap]] = []  # (size, fd, map) that views still map
        self.lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        """Bytes ready for a `take` (arenas that views still map not counted)."""
        with self.lock:
            self._settle()
            return sum(size for size, _, _ in self.free)

    def take(self, size: int, name: str = "tenplex") -> Arena:
        """The smallest pooled arena of at least `size` bytes (its old bytes still in it), else a
        new one whose pages a thread faults in meanwhile (`populate`)."""
        with self.lock:  # reentrant: a collection inside may give an arena back
            self.largest = max(self.largest, size)
            self._settle()
            got = min((x for x in self.free if x[0] >= size), default=None, key=lambda x: x[0])
            if got is not None:
                self.free.remove(got)
        arena = Arena(got[1], got[0], True, got[2]) if got else populate(Arena.create(size, name))
        arena.pool = self
        return arena

    def reserve(self, size: int) -> None:
        """Pool an arena of `size` bytes with every page touched now (ahead of an execution)."""
        arena = self.take(size, "tenplex-pool")
        if arena.map is not None:
            np.frombuffer(arena.map, np.uint8, size)[::mmap.PAGESIZE] = 0  # one write per page
        del arena  # unused: back to the pool

    def arenas(self) -> list[tuple[int, int]]:
        """(descriptor, size) of each arena ready for a `take`: what same-node peers may map ahead
        of an execution that offers them one (`Runtime.reserve`, `agent.direct.Mappings.premap`)."""
        with self.lock:
            self._settle()
            return [(fd, size) for size, fd, _ in self.free]

    def give(self, fd: int, size: int, mapped: mmap.mmap, unmapped: bool = True) -> bool:
        """Keep an arena: pooled when `unmapped` (no view maps it) and the pool has room, else
        False (the caller closes it); one that views still map waits aside until none does (its
        pages are pinned by those views meanwhile, so waiting costs no memory), then is pooled or
        closed as if given back then."""
        with self.lock:
            self._settle()
            if not unmapped:
                self.waiting.append((size, fd, mapped))
                return True
            return self._pool(size, fd, mapped)

    def _pool(self, size: int, fd: int, mapped: mmap.mmap) -> bool:
        limit = self.largest if self.limit is None else self.limit
        if sum(n for n, _, _ in self.free + self.waiting) + size > limit:  # the arenas aside hold room too
            return False
        self.free.append((size, fd, mapped))
        return True

    def _settle(self) -> None:
        """Pool (or close) the waiting arenas that no view maps any more: 2 references to a map
        (the list's tuple, getrefcount's) are the pool's own."""
        for entry in [x for x in self.waiting if sys.getrefcount(x[2]) == 2]:
            self.waiting.remove(entry)
            if not self._pool(*entry):
                os.close(entry[1])

    def clear(self) -> None:
        with self.lock:
            kept, self.free, self.waiting = self.free + self.waiting, [], []
        for _, fd, _ in kept:
            os.close(fd)


MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable without writing a byte


def populate(arena: Arena, chunk: int = 16 << 20) -> Arena:
    """Fault `arena`'s pages in from a daemon thread, front to back, overlapping whatever fills
    them next. MADV_POPULATE_WRITE writes no byte, so it never races a writer (unlike touching
    pages), and populating a range that is no longer this arena's changes nothing either; libc's
    madvise through ctypes runs without the GIL. Best effort: stops at the first error (an older
    kernel, an unmapped range). Returns `arena`."""
    if arena.map is None or not arena.size:
        return arena
    view = np.frombuffer(arena.map, np.uint8, arena.size)
    start, size = view.ctypes.data, arena.size
    del view  # the thread holds no reference: a range unmapped meanwhile just ends it (ENOMEM)

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for at in range(0, size, chunk):
            if libc.madvise(ctypes.c_void_p(start + at), ctypes.c_size_t(min(chunk, size - at)), MADV_POPULATE_WRITE):
                return

    threading.Thread(target=run, name="tenplex-populate", daemon=True).start()
    return arena


def populate_ranges(view: np.ndarray, ranges: Iterable[tuple[int, int]]) -> None:
    """Fault in the pages under the byte ranges `[start, stop)` of the mapped uint8 `view` now, in
    this thread (MADV_POPULATE_WRITE per run of merged ranges: one call instead of a page fault
    per page; writes no byte). For a mapping about to be written (`agent.direct`: a peer's arena
    mapped anew), it halves the CPU of the first copies into it. Best effort: stops at the first error."""
    runs = page_runs(ranges, mmap.PAGESIZE)
    if not runs:
        return
    base, size = view.ctypes.data, view.nbytes
    libc = ctypes.CDLL(None, use_errno=True)
    for start, stop in runs:
        if libc.madvise(ctypes.c_void_p(base + start), ctypes.c_size_t(min(stop, size) - start), MADV_POPULATE_WRITE):
            return


def page_runs(ranges: Iterable[tuple[int, int]], page: int) -> list[tuple[int, int]]:
    """The byte ranges `[start, stop)` rounded out to whole pages, sorted, overlapping and
    touching ones merged, empty ones dropped."""
    runs: list[list[int]] = []
    for start, stop in sorted((s // page * page, -(-e // page) * page) for s, e in ranges if e > s):
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], stop)
        else:
            runs.append([start, stop])
    return [(a, b) for a, b in runs]


def create_in_arena(store: Any, items: Sequence[tuple[str, Sequence[int], str]], name: str,
                    pool: ArenaPool | None = None) -> list[np.ndarray]:  # fmt: skip
    """`arena_arrays`, added to `store` at once. Returns writable views of them, in order."""
    arrays, adopt, _ = arena_arrays(store, items, name, pool)
    adopt()
    return arrays


def arena_arrays(store: Any, items: Sequence[tuple[str, Sequence[int], str]], name: str,
                 pool: ArenaPool | None = None) -> tuple[list[np.ndarray], Callable[[], Any], list[tuple[Arena, int]]]:  # fmt: skip
    """Writable arrays at (path, shape, dtype name) in one arena for `store` (a `TensorStore`): a
    new zero-filled one, or from `pool` (then holding old bytes: for arrays that will be written
    whole); the call that makes them the store's leaves (`put_shared`, all or none), which the
    caller may make later (an execution adds its dst arrays while its first transfers run); and
    each array's (arena, byte offset), as `TensorStore.shared` gives them once they are leaves.
    Where the arena would not fit the store's memory budget, arrays made one by one with
    `store.create` (zero-filled, so that they may spill), already leaves, and no places."""
    from tenplex.ir.box import Box
    from tenplex.runtime.arrays import np_dtype

    dtypes = [np_dtype(d) for _, _, d in items]
    offsets, size = layout(math.prod(s) * dt.itemsize for (_, s, _), dt in zip(items, dtypes))
    budget = store.memory_budget_bytes
    if budget is not None and store.resident_nbytes + size > budget:
        for path, shape, dtype in items:
            store.create(path, shape, dtype)
        return [store.read(path, Box.from_shape(shape), writable=True) for path, shape, _ in items], lambda: None, []
    arena = pool.take(size, name) if pool is not None else Arena.create(size, name)
    rows = [(p, at, tuple(s), dt) for (p, s, _), at, dt in zip(items, offsets, dtypes)]
    arrays = [arena.array(at, shape, dt) for _, at, shape, dt in rows]
    return arrays, functools.partial(store.put_shared, arena, rows, made=arrays), [(arena, at) for at in offsets]
