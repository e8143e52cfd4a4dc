"""`.npy` images: an array held in a memory file that is, byte for byte, the array's `.npy` file
(`arrays.npy_header`, then the data in C order), so that the store's FUSE view can hand the
kernel that file itself (FUSE passthrough): reads and `mmap` of the view's file are then reads
and mappings of the memory file, as fast as tmpfs, and nothing is copied to make them.

An image is a shared `Arena` (sealed memory file, `store.shared`) holding one array at the
offset where its header ends; `put_image` adopts it into a `TensorStore` like any shared arena
(`TensorStore.put_shared`), so the leaf is an ordinary array leaf. `is_image` is how a reader
recognises one: the arena is exactly header + data, its first bytes are the header, and the
leaf's array starts where the header ends.

Invariants: an image's bytes are the `.npy` file of its array at every moment (the header is
written once, before the array is adopted; only the data bytes change afterwards).
"""

from __future__ import annotations

import numpy as np

from tenplex.runtime.arrays import npy_header
from tenplex.runtime.store.shared import Arena

__all__ = ["is_image", "npy_image", "put_image"]


def npy_image(array: np.ndarray, name: str = "tenplex-npy") -> tuple[Arena, int]:
    """A new image holding a C-order copy of `array`: (arena, offset of the data). Raises OSError
    (ENOMEM, EMFILE) if the memory file cannot be made."""
    header = npy_header(array.dtype, array.shape)
    arena = Arena.create(len(header) + array.nbytes, name)
    arena.map[: len(header)] = header
    if array.size:
        np.copyto(arena.array(len(header), array.shape, array.dtype), array, casting="no")
    return arena, len(header)


def put_image(store: object, path: str, array: np.ndarray, *, replace: bool = False) -> np.ndarray:
    """Store a copy of `array` at `path` of `store` (a `TensorStore`) as an image; the leaf's
    array (writable). Raises StoreError as `TensorStore.put_shared`, OSError as `npy_image`."""
    arena, offset = npy_image(array)
    return store.put_shared(arena, [(path, offset, array.shape, array.dtype)], replace=replace)[0]


def is_image(arena: object, offset: int, header: bytes, address: int | None, nbytes: int) -> bool:
    """Whether `arena` (an `Arena`) is the image of the array of `nbytes` at memory `address`
    whose `.npy` header is `header`, the array lying at `offset` of the arena (module doc)."""
    if not isinstance(arena, Arena) or arena.map is None or arena.fd < 0:
        return False
    if offset != len(header) or arena.size != offset + nbytes:
        return False
    base = np.frombuffer(arena.map, np.uint8, arena.size)
    if nbytes and address != base.ctypes.data + offset:
        return False
    return base[:offset].tobytes() == header
