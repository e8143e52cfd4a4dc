"""An agent's arrays straight from and to `.npy` files on its own machine (`tenplex reshard --central --workers N`).

`map_files(store, job, tag, files)` puts each src file's array into the store without reading
it: the leaf is a read-only view of the memory-mapped file (`checkpoint.npy.map_npy`), so the
plan's copies read the file's pages where they land, and no byte crosses the control connection.
`create_mapped(path, shape, dtype)` creates a new `.npy` file (never replacing one: `O_EXCL`),
header written, data sized, and returns a writable view of its memory-mapped data: a plan's
dst array that is the file itself, so the execution writes the output where it lands, with no
copy after it (`Agent.prepare`'s `files`). The caller makes the files durable and renames their
directory (`checkpoint.directory.write_checkpoint_dir`), so a file an agent leaves half written
is never seen.

Every failure is an ExecutionError naming the file and the sub-tensor.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tenplex.ir.errors import ExecutionError, TenplexError
from tenplex.ir.files import write_failure
from tenplex.runtime.agent.rounds import Execution
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.npy import as_dtype, map_npy, npy_header, pwrite_all
from tenplex.runtime.store import shared
from tenplex.runtime.store.layout import array_path
from tenplex.runtime.store.tree import TensorStore

__all__ = ["create_mapped", "dst_arrays", "map_files"]


def map_files(store: TensorStore, job: str, tag: str, files: Mapping[tuple[str, int], list]) -> int:
    """Put the files ({(sub-tensor, device): [path, dtype, shape]}) under `tag` (mapped, not
    read); returns their bytes. Raises ExecutionError naming a file that is not the array it should be."""
    n = 0
    for (sid, device), (path, dtype, shape) in files.items():
        what = f"sub-tensor {sid!r}"
        try:
            mapped = map_npy(Path(path), what, ExecutionError)
        except TenplexError as e:
            raise ExecutionError(str(e)) from None
        got = as_dtype(mapped, np_dtype(dtype))
        if got is None or got.shape != tuple(shape):
            raise ExecutionError(f"{path}: holds {mapped.dtype}{list(mapped.shape)}, expected {dtype}{list(shape)} ({what})")  # fmt: skip
        store.put(array_path(job, tag, device, sid), got, copy=False)  # adopted: the store keeps the mapping
        n += got.nbytes
    return n


def create_mapped(path: str, shape: list[int], dtype: str) -> np.ndarray:
    """A writable array of `shape` and `dtype` that is the data of a new `.npy` file at `path`
    (see the module docstring); its pages are faulted in at once (`MAP_POPULATE`). Raises
    ExecutionError naming the file (and errno) when it exists or cannot be made."""
    dt = np_dtype(dtype)
    header = npy_header(dt, tuple(shape))
    count = math.prod(shape)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            pwrite_all(fd, header, 0)
            if count == 0:
                return np.empty(shape, dt)
            os.ftruncate(fd, len(header) + count * dt.itemsize)
            mapped = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
    except OSError as e:
        raise ExecutionError(str(write_failure(path, e, ExecutionError))) from None
    return np.frombuffer(mapped, dt, count, len(header)).reshape(shape)


def dst_arrays(store: TensorStore, ex: Execution, files: Mapping[tuple[str, int], str],
               pool: Any) -> tuple[dict[int, np.ndarray], Callable[[], Any], dict[int, tuple[Any, int]]]:  # fmt: skip
    """{slice array index: dst array} of `ex` under its staging tag (`Agent.prepare`): new mapped
    files for the instances in `files`, the rest in one shared arena (`pool`: its `ArenaPool`);
    the plan writes every byte, so neither is cleared. The arena's arrays become store leaves
    when the returned call is made (`shared.arena_arrays`; `Execution.adopt`); the last item is
    {slice array index: (arena, byte offset)} of those in the arena (`Execution.places`)."""
    out, arena = {}, []
    for i, path in zip(*ex.sliced.paths(ex.job, ex.staging, "dst")):
        _, sid, d, dtype, shape = ex.meta[i]
        if (sid, d) in files:
            out[i] = create_mapped(files[(sid, d)], shape, dtype)
            store.put(path, out[i], copy=False)
        else:
            arena.append((i, (path, shape, dtype)))
    if not arena:
        return out, lambda: None, {}
    made, adopt, places = shared.arena_arrays(store, [item for _, item in arena], f"tenplex-{ex.dst_tag}", pool)
    indices = [i for i, _ in arena]
    out.update(zip(indices, made))
    return out, adopt, dict(zip(indices, places))
