"""TensorStore: one host's hierarchical in-memory store of arrays and typed values.

Paths look like `/job/<job>/<tag>/<partition>/<path>`, but the store is generic: a tree of
directories whose leaves are numpy arrays (any dtype, bfloat16 included, 0-d and empty too) or
JSON-able values. Directories exist implicitly, created by `put`/`create` and kept until deleted.
`read` hands out views of sub-boxes, never copies of whole tensors. With a memory budget, the
least recently used arrays spill to `.npy` files in `spill_dir` and live on as `r+` memmaps,
readable and writable through the same API; spilled arrays stay spilled until deleted.
Every method takes one lock, so agents may share a store between threads.

Invariants:
- a node is a directory or a leaf; no leaf has children (paths per `store.leaf.parse_path`);
- resident array bytes (`resident_nbytes`) never exceed `memory_budget_bytes` after a call;
- `get` and `read` return read-only views (unless `read(..., writable=True)`); values are copied;
- a failed call changes nothing observable (spilling other arrays is not observable);
- `rename` moves a whole subtree in one step under the lock: readers see src or dst, never both
  or a mix.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tenplex.ir.box import Box
from tenplex.runtime.arrays import np_dtype, view
from tenplex.runtime.store.leaf import (
    Leaf,
    LeafMeta,
    StoreError,
    Value,
    check_value,
    copy_value,
    join,
    leaf_parts,
    leaves_of,
    parse_path,
    read_only,
    shape_of,
)
from tenplex.runtime.store.memory import Memory
from tenplex.runtime.store.shared import Arena

__all__ = ["LeafMeta", "StoreError", "TensorStore"]

Node = dict[str, Any] | Leaf  # a directory maps names to nodes


class TensorStore:
    """A per-host tree of arrays and values with optional LRU spill to disk (see module doc)."""

    def __init__(self, memory_budget_bytes: int | None = None, spill_dir: str | None = None) -> None:
        self.memory_budget_bytes = memory_budget_bytes
        self._memory = Memory(memory_budget_bytes, spill_dir)
        self._root: dict[str, Node] = {}
        self._lock = threading.RLock()

    # -- writing leaves ------------------------------------------------------------------------

    def put(self, path: str, data: np.ndarray | Value, *, replace: bool = False, copy: bool = True) -> None:
        """Store an array (copied unless `copy=False`, which adopts it) or a JSON-able value.

        Raises: StoreError if path is invalid or a directory, a leaf exists and not `replace`, a
        parent is a leaf, the value is not JSON-able, or the array exceeds the budget without spill.
        """
        parts = leaf_parts(path)
        with self._lock:
            old = self._check_free(parts, path, replace)
            if isinstance(data, np.generic):
                data = np.asarray(data)
            if isinstance(data, np.ndarray):
                leaf = self._memory.new_array(path, data, copy, old)
            else:
                check_value(data, path)
                leaf = Leaf(value=copy_value(data))
            self._insert(parts, leaf, old)

    def create(self, path: str, shape: Sequence[int], dtype: str | np.dtype, *, replace: bool = False) -> None:
        """Allocate a zero-filled array (e.g. a dst sub-tensor to `write` into).

        Raises: StoreError as for `put`, or for a negative or non-integer shape.
        """
        parts = leaf_parts(path)
        shape_t = shape_of(shape, path)
        dt = np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
        with self._lock:
            old = self._check_free(parts, path, replace)
            self._insert(parts, self._memory.zeros(path, shape_t, dt, old), old)

    def put_shared(self, arena: Arena, items: Sequence[tuple[str, int, Sequence[int], np.dtype]], *,
                   replace: bool = False, made: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:  # fmt: skip
        """Adopt the arrays of `arena` at (path, offset, shape, dtype) as leaves, without a copy;
        all or none; returns the leaves' (writable) arrays in order. `made`: one array per item
        that `arena.array` made already (`shared.arena_arrays`), adopted as it is, not made again
        (~1.5 µs per leaf). Raises: StoreError as for `put`, for an array outside the arena, or over budget."""
        with self._lock:
            leaves = []
            for k, (path, offset, shape, dtype) in enumerate(items):
                parts = leaf_parts(path)
                old = self._check_free(parts, path, replace)
                try:
                    array = arena.array(offset, shape_of(shape, path), np.dtype(dtype)) if made is None else made[k]
                except ValueError as e:
                    raise StoreError(f"{path}: {e}") from None
                leaves.append((parts, old, Leaf(array=array, shared=(arena, offset))))
            if len({p for p, _, _ in leaves}) != len(leaves):
                raise StoreError(f"put_shared: a path is given twice in {[join(p) for p, _, _ in leaves][:3]}...")
            if not self._memory.make_room(items[0][0] if items else "/", sum(leaf.nbytes for *_, leaf in leaves), None):
                raise StoreError(f"{len(leaves)} shared arrays of {arena.size} bytes exceed the memory budget")
            for parts, old, leaf in leaves:
                self._insert(parts, leaf, old)
            return [leaf.array for _, _, leaf in leaves]

    def shared(self, path: str) -> tuple[Arena, int] | None:
        """(arena, offset) of the array at `path` when it lives in a shared arena, else None."""
        with self._lock:
            return self._leaf(path).shared

    def write(self, path: str, box: Box, data: np.ndarray) -> None:
        """Copy `data` (same dtype, shape == box.shape) into `box` of the array at `path`.

        Raises: StoreError if path is missing or not an array, box is outside it, or data mismatches.
        """
        with self._lock:
            target = self._region(path, box)
            if not isinstance(data, np.ndarray) or data.dtype != target.dtype or data.shape != box.shape:
                got = f"{type(data).__name__} {getattr(data, 'dtype', '')} {getattr(data, 'shape', '')}"
                raise StoreError(f"write to {path} box {box} needs {target.dtype} of shape {box.shape}, got {got}")
            target[...] = data

    # -- reading -------------------------------------------------------------------------------

    def get(self, path: str) -> np.ndarray | Value:
        """A read-only view of the array at `path`, or a copy of its value.

        Raises: StoreError if path is missing or a directory.
        """
        with self._lock:
            leaf = self._leaf(path)
            if leaf.array is None:
                return copy_value(leaf.value)
            self._memory.touch(leaf)
            return read_only(leaf.array[...])

    def read(self, path: str, box: Box, *, writable: bool = False) -> np.ndarray:
        """A view (never a copy) of `box` in the array at `path`; read-only unless `writable`.

        A view taken before its array spills keeps the old memory and misses later writes.
        Raises: StoreError if path is missing or not an array, or box is outside it.
        """
        with self._lock:
            out = self._region(path, box)
            return out if writable else read_only(out)

    def exists(self, path: str) -> bool:
        parts = parse_path(path)
        with self._lock:
            node: Node = self._root
            for part in parts:
                if not isinstance(node, dict) or part not in node:
                    return False
                node = node[part]
            return True

    def meta(self, path: str) -> LeafMeta:
        with self._lock:
            return self._leaf(path).meta()

    def list(self, prefix: str = "/") -> list[str]:
        """Sorted child names of the directory `prefix`. Raises: StoreError if missing or a leaf."""
        with self._lock:
            node = self._node(parse_path(prefix), prefix)
            if not isinstance(node, dict):
                raise StoreError(f"{prefix} is a leaf, not a directory")
            return sorted(node)

    def walk(self, prefix: str = "/") -> list[str]:
        """Sorted paths of every leaf under `prefix` (just `prefix` if it is a leaf)."""
        parts = parse_path(prefix)
        with self._lock:
            return [join(p) for p, _ in leaves_of(self._node(parts, prefix), parts)]

    def nbytes(self, prefix: str = "/") -> int:
        """Bytes of the arrays under `prefix`, resident and spilled (values count 0)."""
        parts = parse_path(prefix)
        with self._lock:
            return sum(leaf.nbytes for _, leaf in leaves_of(self._node(parts, prefix), parts))

    @property
    def resident_nbytes(self) -> int:
        """Bytes of arrays held in memory (not spilled) across the store."""
        return self._memory.resident

    # -- subtrees ------------------------------------------------------------------------------

    def delete(self, prefix: str) -> None:
        """Remove the leaf or subtree at `prefix` (`/` empties the store) and its spill files.

        Raises: StoreError if prefix is missing.
        """
        parts = parse_path(prefix)
        with self._lock:
            node = self._node(parts, prefix)
            for _, leaf in leaves_of(node, parts):
                self._memory.forget(leaf)
            if parts:
                del self._node(parts[:-1], prefix)[parts[-1]]
            else:
                self._root.clear()

    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        """Move the subtree at `src` to `dst` atomically (the commit of a tag switch).

        Raises: StoreError if src is missing or the root, dst is inside src or src inside dst,
        a parent of dst is a leaf, or dst exists and not `replace` (then nothing changes).
        """
        s, d = parse_path(src), parse_path(dst)
        if not s or d[: len(s)] == s or s[: len(d)] == d:
            raise StoreError(f"cannot rename {src} to {dst}: the root cannot move and neither path may contain the other")
        with self._lock:
            node = self._node(s, src)
            if self._check_free(d, dst, replace, kind="path") is not None:
                self.delete(dst)
            del self._node(s[:-1], src)[s[-1]]
            self._parent(d, create=True)[d[-1]] = node

    def close(self) -> None:
        """Drop every leaf and remove the spill directory. Idempotent."""
        with self._lock:
            self.delete("/")
            self._memory.close()

    def __enter__(self) -> TensorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tree helpers --------------------------------------------------------------------------

    def _node(self, parts: tuple[str, ...], path: str) -> Node:
        node: Node = self._root
        for i, part in enumerate(parts):
            if not isinstance(node, dict):
                raise StoreError(f"{join(parts[:i])} is a leaf, not a directory, so {path} does not exist")
            if part not in node:
                raise StoreError(f"{path} does not exist (no {join(parts[: i + 1])})")
            node = node[part]
        return node

    def _leaf(self, path: str) -> Leaf:
        node = self._node(parse_path(path), path)
        if isinstance(node, dict):
            raise StoreError(f"{path} is a directory, not a leaf")
        return node

    def _region(self, path: str, box: Box) -> np.ndarray:
        leaf = self._leaf(path)
        if leaf.array is None:
            raise StoreError(f"{path} holds a value, not an array")
        shape = leaf.array.shape
        if box.ndim != len(shape) or not Box.from_shape(shape).contains(box):
            raise StoreError(f"box {box} is outside the array {path} of shape {shape}")
        self._memory.touch(leaf)
        return view(leaf.array, box)

    def _parent(self, parts: tuple[str, ...], create: bool) -> dict[str, Node] | None:
        """The directory that holds `parts`, None if it is missing (and not `create`).
        Callers check first (`_check_free`) that no parent is a leaf."""
        node = self._root
        for part in parts[:-1]:
            if part not in node:
                if not create:
                    return None
                node[part] = {}
            node = node[part]
        return node

    def _check_free(self, parts: tuple[str, ...], path: str, replace: bool, kind: str = "leaf") -> Node | None:
        """The node now at `parts` (None if none), after checking that `parts` may be written."""
        node: Node = self._root
        for i, part in enumerate(parts[:-1]):
            node = node.get(part, {})
            if not isinstance(node, dict):
                raise StoreError(f"{join(parts[: i + 1])} is a leaf, so {path} cannot be created under it")
        old = node.get(parts[-1])
        if kind == "leaf" and isinstance(old, dict):
            raise StoreError(f"{path} is a directory, not a leaf")
        if old is not None and not replace:
            raise StoreError(f"{path} already exists (pass replace=True to overwrite it)")
        return old

    def _insert(self, parts: tuple[str, ...], leaf: Leaf, old: Leaf | None) -> None:
        self._parent(parts, create=True)[parts[-1]] = leaf
        if old is not None:
            self._memory.forget(old)
        self._memory.admit(leaf)
