"""A `TensorStore` mounted as a directory: `view` mounts it, `ops` (reads) and `writes` are its
file system operations (`StoreFS`), `fuse.npy` the bytes of its files."""

from tenplex.runtime.fuse.store.ops import DTYPE_XATTR, StoreFS
from tenplex.runtime.fuse.store.view import (
    READ_AHEAD_KB,
    FuseError,
    NpyFile,
    fuse_unavailable_reason,
    is_mounted,
    load_npy,
    mount,
    npy_descr,
    parse_npy,
    read_ahead_of,
    serve,
)

__all__ = [
    "DTYPE_XATTR", "READ_AHEAD_KB", "FuseError", "NpyFile", "StoreFS", "fuse_unavailable_reason", "is_mounted",
    "load_npy", "mount", "npy_descr", "parse_npy", "read_ahead_of", "serve",
]  # fmt: skip
