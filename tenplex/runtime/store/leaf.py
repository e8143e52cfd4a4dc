"""The pieces of a `TensorStore` below its tree: paths, leaves and typed values.

Invariants:
- a path is absolute, POSIX-like, and made of non-empty components other than `.` and `..`
  without NUL or backslash (the root `/` has no components);
- a leaf is either an array (kind "array") or a JSON-able value (kind "value"), never both;
- a leaf's `spill_file` is set exactly when its array is a memmap of that file.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from tenplex.ir.errors import TenplexError

Value = None | bool | int | float | str | list["Value"] | dict[str, "Value"]


class StoreError(TenplexError):
    """A TensorStore operation is invalid (missing path, clash, bad box, over budget); names the path."""


def parse_path(path: str) -> tuple[str, ...]:
    """The components of an absolute store path; `/` is the root, `()`."""
    if not isinstance(path, str):
        raise StoreError(f"store path {path!r} is not an absolute path starting with '/'")
    return _parse(path)


@functools.lru_cache(maxsize=1 << 16)  # an agent resolves the same paths at every execution of a plan
def _parse(path: str) -> tuple[str, ...]:
    if not path.startswith("/"):
        raise StoreError(f"store path {path!r} is not an absolute path starting with '/'")
    if path == "/":
        return ()
    parts = tuple(path[1:].split("/"))
    for part in parts:
        if part in ("", ".", "..") or "\0" in part or "\\" in part:
            raise StoreError(f"store path {path!r} has an invalid component {part!r} (empty, '.', '..', NUL or backslash)")
    return parts


def join(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


def check_value(value: Any, path: str) -> None:
    """Raise unless `value` is JSON-able: None, bool, int, float, str, list, dict with str keys."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, list):
        for item in value:
            check_value(item, path)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise StoreError(f"value for {path} has a dict key {key!r} that is not a str")
            check_value(item, path)
        return
    raise StoreError(f"value for {path} contains {value!r} of type {type(value).__name__}, which is neither a numpy array nor JSON-able")


def copy_value(value: Value) -> Value:
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    return value


@attrs.frozen
class LeafMeta:
    """What `TensorStore.meta` reports; shape and dtype are None for values."""

    kind: str  # "array" or "value"
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    spilled: bool


@attrs.define(eq=False)
class Leaf:
    """A stored array or value. `spill_file` is set once the array lives in a memmap."""

    array: np.ndarray | None = None
    value: Value = None
    spill_file: str | None = None
    shared: tuple[Any, int] | None = None  # (store.shared.Arena, offset) when the array lives in one

    @property
    def nbytes(self) -> int:
        return 0 if self.array is None else self.array.nbytes

    @property
    def resident_nbytes(self) -> int:
        return 0 if self.spill_file is not None else self.nbytes

    def meta(self) -> LeafMeta:
        if self.array is None:
            return LeafMeta("value", None, None, 0, False)
        a = self.array
        return LeafMeta("array", tuple(a.shape), str(a.dtype), a.nbytes, self.spill_file is not None)


def leaf_parts(path: str) -> tuple[str, ...]:
    parts = parse_path(path)
    if not parts:
        raise StoreError("the root / is a directory and cannot hold a leaf")
    return parts


def shape_of(shape: Sequence[int], path: str) -> tuple[int, ...]:
    try:
        out = tuple(map(operator.index, shape))
    except TypeError:
        raise StoreError(f"shape {shape!r} for {path} is not a sequence of integers") from None
    if out and min(out) < 0:
        raise StoreError(f"shape {out} for {path} has a negative side")
    return out


def read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def leaves_of(node: Any, parts: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Leaf]]:
    """(path parts, leaf) of every leaf under a store node (a directory dict or a leaf), sorted."""
    if isinstance(node, Leaf):
        yield parts, node
        return
    for name in sorted(node):
        yield from leaves_of(node[name], (*parts, name))
