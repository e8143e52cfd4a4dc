"""Memory of a `TensorStore`: resident bytes, least-recently-used order, and spill files.

Invariants:
- `resident` is the sum of `nbytes` over `lru`, the arrays held in memory (empty ones excepted);
- after `make_room` returns True, `resident` plus the requested bytes fit the budget;
- a spilled array is an `r+` memmap of a `.npy` file in the `SpillDir`; the file's stored dtype
  is the array's dtype or, where `.npy` cannot name it (ml_dtypes bfloat16, float8), the
  unsigned integer of the same itemsize, viewed back on load.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections import OrderedDict

import numpy as np

from tenplex.runtime.arrays import npy_dtype
from tenplex.runtime.store.leaf import Leaf, StoreError


class SpillDir:
    """A private directory (under `root`) of `.npy` files backing spilled arrays."""

    def __init__(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="tenplex-store-", dir=root)
        self._ids = itertools.count()

    def _new_file(self) -> str:
        return os.path.join(self.dir, f"{next(self._ids):08d}.npy")

    def save(self, array: np.ndarray) -> tuple[str, np.ndarray]:
        """Write `array` to a new file; return the file and an `r+` memmap of it."""
        file = self._new_file()
        np.save(file, array.view(npy_dtype(array.dtype)))
        return file, self._open(file, array.dtype)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[str, np.ndarray]:
        """A new zero-filled file of `shape` and `dtype`, and an `r+` memmap of it."""
        file = self._new_file()
        m = np.lib.format.open_memmap(file, mode="w+", dtype=npy_dtype(dtype), shape=shape)
        del m  # flush the header; reopen r+ like every other spilled array
        return file, self._open(file, dtype)

    @staticmethod
    def _open(file: str, dtype: np.dtype) -> np.ndarray:
        return np.load(file, mmap_mode="r+").view(dtype)

    @staticmethod
    def remove(file: str) -> None:
        # open memmaps (views handed out earlier) stay valid after the unlink on POSIX
        os.unlink(file)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)



class Memory:
    """The budget, the LRU order of resident arrays, and the spill directory (None: no spill)."""

    def __init__(self, budget: int | None, spill_dir: str | None) -> None:
        if budget is not None and budget < 0:
            raise StoreError(f"memory_budget_bytes {budget} is negative")
        self.budget = budget
        self.spill = SpillDir(spill_dir) if spill_dir is not None else None
        self.lru: OrderedDict[Leaf, None] = OrderedDict()  # least recently used first
        self.resident = 0

    def new_array(self, path: str, data: np.ndarray, copy: bool, old: Leaf | None) -> Leaf:
        """A leaf holding `data` (copied unless not `copy`), in memory if it fits, else spilled."""
        if data.dtype.hasobject:
            raise StoreError(f"array for {path} has dtype {data.dtype}; object arrays cannot be stored")
        if not self.make_room(path, data.nbytes, old):
            file, m = self.spill.save(data)
            return Leaf(array=m, spill_file=file)
        return Leaf(array=np.array(data, order="C") if copy else data)

    def zeros(self, path: str, shape: tuple[int, ...], dtype: np.dtype, old: Leaf | None) -> Leaf:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.make_room(path, n, old):
            return Leaf(array=np.zeros(shape, dtype))
        file, m = self.spill.zeros(shape, dtype)
        return Leaf(array=m, spill_file=file)

    def make_room(self, path: str, n: int, old: Leaf | None) -> bool:
        """Spill least recently used arrays until `n` more bytes fit beside the others (`old`, to
        be replaced, counts as freed); False if the new array must go straight to disk.

        Raises: StoreError if it does not fit and there is no spill directory.
        """
        freed = old.resident_nbytes if old is not None else 0
        if self.budget is None or n == 0 or self.resident - freed + n <= self.budget:
            return True
        if self.spill is None:
            raise StoreError(f"{path} needs {n} bytes but {self.resident - freed} of the {self.budget}-byte memory budget are in use and the store has no spill_dir")
        if n > self.budget:
            return False  # could never be resident: spilling others would not help
        for victim in [leaf for leaf in self.lru if leaf is not old]:
            if self.resident - freed + n <= self.budget:
                break
            self._spill_leaf(victim)
        return True

    def admit(self, leaf: Leaf) -> None:
        if leaf.spill_file is None and leaf.nbytes:
            self.lru[leaf] = None
            self.resident += leaf.nbytes

    def touch(self, leaf: Leaf) -> None:
        if leaf in self.lru:
            self.lru.move_to_end(leaf)

    def forget(self, leaf: Leaf) -> None:
        if leaf in self.lru:
            del self.lru[leaf]
            self.resident -= leaf.nbytes
        if leaf.spill_file is not None:
            self.spill.remove(leaf.spill_file)
            leaf.spill_file = None
        # the array before the arena: an arena that no leaf or view holds closes, or is recycled
        leaf.array, leaf.shared = None, None

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    def _spill_leaf(self, leaf: Leaf) -> None:
        leaf.spill_file, leaf.array = self.spill.save(leaf.array)
        leaf.shared = None
        del self.lru[leaf]
        self.resident -= leaf.nbytes
