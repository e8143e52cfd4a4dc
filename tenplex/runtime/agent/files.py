"""An agent's arrays straight from and to `.npy` files on its own machine (`tenplex reshard --workers N`).

`map_files(store, job, tag, files)` puts each src file's array into the store without reading
it: the leaf is a read-only view of the memory-mapped file (`checkpoint.npy.map_npy`), so the
plan's copies read the file's pages where they land, and no byte crosses the control connection.
`write_files(store, job, tag, files)` writes arrays of a tag as new `.npy` files (created, never
replaced: `O_EXCL`), header then data with `pwrite`; the caller makes them durable and renames
their directory (`checkpoint.directory.write_checkpoint_dir`), so a file an agent leaves half
written is never seen.

Every failure is an ExecutionError naming the file and the sub-tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tenplex.ir.errors import ExecutionError, TenplexError
from tenplex.ir.files import write_failure
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.npy import as_dtype, map_npy, npy_header, pwrite_all
from tenplex.runtime.store.layout import array_path
from tenplex.runtime.store.tree import TensorStore

__all__ = ["map_files", "write_files"]


def map_files(store: TensorStore, job: str, tag: str, files: list) -> int:
    """Put `[sub-tensor, device, path, dtype, shape]` rows' files under `tag` (mapped, not read);
    returns their bytes. Raises ExecutionError naming a file that is not the array its row says."""
    n = 0
    for sid, device, path, dtype, shape in files:
        what = f"sub-tensor {sid!r}"
        try:
            mapped = map_npy(Path(path), what, ExecutionError)
        except TenplexError as e:
            raise ExecutionError(str(e)) from None
        got = as_dtype(mapped, np_dtype(dtype))
        if got is None or got.shape != tuple(shape):
            raise ExecutionError(f"{path}: holds {mapped.dtype}{list(mapped.shape)}, expected {dtype}{list(shape)} ({what})")
        store.put(array_path(job, tag, device, sid), got, copy=False)  # adopted: the store keeps the mapping
        n += got.nbytes
    return n


def write_files(store: TensorStore, job: str, tag: str, files: list) -> int:
    """Write the arrays of `[sub-tensor, device, path]` rows under `tag` as new `.npy` files;
    returns the bytes written. Raises ExecutionError naming the array or the file (and errno)."""
    n = 0
    for sid, device, path in files:
        at = array_path(job, tag, device, sid)
        if not store.exists(at):
            raise ExecutionError(f"no array {at} to write to {path} (sub-tensor {sid!r})")
        a = store.get(at)
        if not isinstance(a, np.ndarray):
            raise ExecutionError(f"{at} holds a value, not the array of sub-tensor {sid!r}")
        try:
            _write(path, a)
        except OSError as e:
            raise ExecutionError(str(write_failure(path, e, ExecutionError))) from None
        n += a.nbytes
    return n


def _write(path: str, a: np.ndarray) -> None:
    header = npy_header(a.dtype, a.shape)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, header, 0)
        if a.size:
            pwrite_all(fd, memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)), len(header))
    finally:
        os.close(fd)
