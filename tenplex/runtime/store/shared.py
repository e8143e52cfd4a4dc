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
- a read-only arena's views are read-only.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterable, Sequence
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

    def __init__(self, fd: int, size: int, writable: bool):
        self.fd, self.size, self.writable = fd, size, writable
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # mmap of 0 bytes is an error; an arena of empty arrays maps one page it never uses
        self.map = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, prot) if size or writable else None

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
        count = int(np.prod(shape, dtype=np.int64))
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
        with contextlib.suppress(OSError):
            self.close()


def create_in_arena(store: Any, items: Sequence[tuple[str, Sequence[int], str]], name: str) -> None:
    """Zero-filled arrays at (path, shape, dtype name) in one new arena that `store` (a
    `TensorStore`) adopts; one by one with `store.create` where the arena would not fit the
    store's memory budget (so that they may spill)."""
    from tenplex.runtime.arrays import np_dtype

    dtypes = [np_dtype(d) for _, _, d in items]
    offsets, size = layout(int(np.prod(s, dtype=np.int64)) * dt.itemsize for (_, s, _), dt in zip(items, dtypes))
    budget = store.memory_budget_bytes
    if budget is not None and store.resident_nbytes + size > budget:
        for path, shape, dtype in items:
            store.create(path, shape, dtype)
        return
    arena = Arena.create(size, name)
    store.put_shared(arena, [(p, at, tuple(s), dt) for (p, s, _), at, dt in zip(items, offsets, dtypes)])
