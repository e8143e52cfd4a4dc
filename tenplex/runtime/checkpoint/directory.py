"""Checkpoint directories: a PTC and its sub-tensors as `.npy` files (`tenplex reshard`'s format).

Directory format (device-free; the same tree the FUSE view shows for one state):

    DIR/ptc.json                          the PTC (`tenplex.ptc/1`)
    DIR/<partition>/<sub-tensor path>.npy one file per sub-tensor of the partition
    DIR/<partition>/values.json           {value name: JSON value}; only for a partition with values

A sub-tensor's file holds its local array (shape `st.shape`, the tensor's dtype; a bfloat16 or
float8 header names the dtype, `checkpoint.npy`). Files of older versions that hold such arrays
as raw bits (`<u2`, `|u1`) are read too: ptc.json names the real dtype. A partition without
values has no values file (an empty `{}` one is accepted). Replicas (a partition on several
devices) are stored once: the allocation and topology in ptc.json are informative only.

The directory may come from anyone: ptc.json is what names its files. Partition ids and
sub-tensor paths are therefore relative `/`-separated paths with one spelling each (no empty,
`.` or `..` components, backslashes or NUL bytes: `x/./y` and `x//y` are refused, not read as
`x/y`), no path is `values` (the values file), and no two sub-tensors, of one partition or of
two, name one file. Only regular files inside the directory are read (`tenplex.ir.files`),
and a `.npy` header must fit its file before anything is allocated (`checkpoint.npy`).

Invariants:
- `write_checkpoint_dir` leaves the directory complete, every file of its size and durable, or
  absent (nothing is read back: each file's size is checked as it is written);
- every read error names the file and the sub-tensor or partition it belongs to;
- an I/O error while writing names the file and its errno (`No space left on device (ENOSPC)`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tenplex.ir.files import confined, read_json
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import dumps, ptc_from_json
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.checkpoint.npy import as_dtype, load_npy, map_npy, write_npy
from tenplex.runtime.checkpoint.planned import PlannedFiles, pwrite_all
from tenplex.runtime.checkpoint.pool import THREADS, run_all
from tenplex.runtime.checkpoint.tree import (
    PTC_FILE,
    VALUES_FILE,
    CheckpointError,
    WriteError,
    checkpoint_dir,
    make_tree,
    relative_paths,
)

__all__ = ["PTC_FILE", "VALUES_FILE", "CheckpointError", "WriteError", "checkpoint_dir", "make_tree", "read_checkpoint",
           "relative_paths", "write_checkpoint", "write_checkpoint_dir", "write_file", "write_files"]  # fmt: skip

def write_checkpoint(ptc: PTC, arrays: Mapping[str, np.ndarray] | PlannedFiles, values: Mapping[str, Mapping[str, Any]],
                     out_dir: str | os.PathLike, tree: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """Write the directory format into `out_dir` (created; must not exist, or be empty), each
    file once, several at a time (`THREADS`), the values and ptc.json while the arrays are written.

    `arrays`: sub-tensor id -> local array, a plan's `PlannedFiles` (written straight from its
    src; into the files of a `prealloc.Preallocation` where it says so), or an object whose
    `write_files(out_dir, {sub-tensor id: relative path}, meanwhile)` creates every array file
    itself and calls `meanwhile()` once (agents, `runtime.reshard.AgentFiles`; worker processes,
    `checkpoint.workers`); `values`: partition id -> {name: value}. Raises CheckpointError naming
    the sub-tensor or partition when one is missing or wrong, or the file being written when the
    system refuses a write (full disk, ...). `tree`: what `make_tree(ptc, out_dir)` returned,
    where the caller made the tree already (for a `prealloc.Preallocation`)."""
    out = Path(out_dir)
    preallocated = getattr(arrays, "preallocated", False)  # the files exist: opened without O_EXCL
    files = make_tree(ptc, out) if tree is None else tree
    texts = {f"{pid}/{VALUES_FILE}": text for pid, text in _value_texts(ptc, values).items()}
    write = arrays.write if isinstance(arrays, PlannedFiles) else None
    write = write or (None if callable(getattr(arrays, "write_files", None)) else _array_writer(ptc, arrays))

    def write_texts() -> None:
        for rel, text in [*texts.items(), (PTC_FILE, dumps(ptc))]:
            write_file(out / rel, lambda _, fd, text=text: pwrite_all(fd, text.encode(), 0), rel)

    if write is None:  # written elsewhere (agents, worker processes), every file created new
        arrays.write_files(out, files, write_texts)
    else:
        ordered = {st.id: files[st.id] for st in ptc.subtensors}
        write_files(out, ordered, write, meanwhile=write_texts, exclusive=not preallocated)


def write_files(out: Path, files: Mapping[str, str], write: Callable[[str, int], object], threads: int = THREADS,
                on_file: Callable[[], None] | None = None, meanwhile: Callable[[], None] | None = None,
                exclusive: bool = True) -> None:  # fmt: skip
    """`write_file(out / files[key], write, key, exclusive)` for every key, `threads` files at a
    time in key order (`pool.run_all`), `on_file()` after each and `meanwhile()` while they are
    written, both in this thread. Raises WriteError naming the file (the first to fail, in key
    order); after a failure no further file is started."""
    items = list(files.items())

    def one(i: int) -> None:
        key, rel = items[i]
        write_file(os.path.join(out, rel), write, key, exclusive)

    run_all(len(items), one, threads, on_file, meanwhile)


def write_file(path: str | os.PathLike, write: Callable[[str, int], object], key: str, exclusive: bool = True) -> None:
    """Create `path` (it must not exist, unless not `exclusive`: then it may, from a
    `prealloc.Preallocation`, and is written over) and `write(key, fd)` into it. Raises
    WriteError naming `path`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o644)
        try:
            write(key, fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteError(Path(path), e) from None


def _array_writer(ptc: PTC, arrays: Mapping[str, np.ndarray]) -> Callable[[str, int], None]:
    """`write(sid, fd)` for in-memory arrays, every array checked before anything is written."""
    checked = {st.id: _checked_array(ptc, arrays, st) for st in ptc.subtensors}

    def write(sid: str, fd: int) -> None:
        with os.fdopen(fd, "wb", closefd=False) as f:
            write_npy(f, checked[sid])

    return write


def _value_texts(ptc: PTC, values: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Partition id -> its values file's text, for partitions with values."""
    out = {}
    for part in ptc.partitions:
        got = dict(values.get(part.id, {}))
        if set(got) != set(part.value_map):
            raise CheckpointError(f"partition {part.id!r}: values {sorted(got)}, expected {sorted(part.value_map)}")
        if not got:
            continue  # no values: no values file
        try:
            out[part.id] = json.dumps(got, sort_keys=True, allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"partition {part.id!r}: values cannot be stored as JSON: {e}") from None
    return out


def _checked_array(ptc: PTC, arrays: Mapping[str, np.ndarray], st: Any) -> np.ndarray:
    if st.id not in arrays:
        raise CheckpointError(f"no array for sub-tensor {st.id!r}")
    a = np.asarray(arrays[st.id])
    dtype = ptc.tensor_map[st.tensor].dtype
    if a.shape != st.shape or a.dtype != np_dtype(dtype):
        raise CheckpointError(f"sub-tensor {st.id!r}: array {a.dtype}{list(a.shape)}, expected {dtype}{list(st.shape)}")
    return a


def read_checkpoint(src_dir: str | os.PathLike, *, mapped: bool = False) -> tuple[PTC, dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """(PTC, sub-tensor id -> array, partition id -> values) of a checkpoint directory; with
    `mapped`, the arrays are read-only views of the memory-mapped files (`npy.map_npy`).
    Raises CheckpointError (or ParseError for ptc.json) naming the file that is missing or wrong:
    a path that is unsafe or leads outside the directory, a file that is not a regular file, a
    `.npy` whose header does not fit its file or its sub-tensor."""
    root = Path(src_dir)
    if not (root / PTC_FILE).exists():
        raise CheckpointError(f"{root / PTC_FILE}: missing (not a checkpoint directory)")
    ptc = ptc_from_json(read_json(root / PTC_FILE, CheckpointError, "the PTC"), str(root / PTC_FILE))
    arrays: dict[str, np.ndarray] = {}
    seen: dict[str, str] = {}  # real paths of the directories resolved so far
    for sid, rel in relative_paths(ptc).items():
        st, what = ptc.subtensor_map[sid], f"sub-tensor {sid!r}"
        path = confined(root, rel, f"file of {what}", CheckpointError, seen)
        dtype = ptc.tensor_map[st.tensor].dtype
        a = (map_npy if mapped else load_npy)(path, what, CheckpointError)
        got = as_dtype(a, np_dtype(dtype))  # the dtype itself, or the raw bits older versions wrote
        if got is None or a.shape != st.shape:
            raise CheckpointError(f"{path}: holds {a.dtype}{list(a.shape)}, expected {dtype}{list(st.shape)} "
                                  f"(sub-tensor {sid!r})")  # fmt: skip
        arrays[sid] = got
    values: dict[str, dict[str, Any]] = {}
    for part in ptc.partitions:
        path = confined(root, f"{part.id}/{VALUES_FILE}", f"values file of partition {part.id!r}", CheckpointError, seen)
        if not part.values and not os.path.lexists(path):
            values[part.id] = {}  # a partition without values needs no values file
            continue
        got = read_json(path, CheckpointError, f"values of partition {part.id!r}")
        if not isinstance(got, dict) or set(got) != set(part.value_map):
            names = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise CheckpointError(f"{path}: values {names}, expected {sorted(part.value_map)}")
        values[part.id] = got
    return ptc, arrays, values


def write_checkpoint_dir(ptc: PTC, arrays: Mapping[str, np.ndarray] | PlannedFiles, values: Mapping, out: Path) -> None:
    """`write_checkpoint` into a `checkpoint_dir(out)`: `out` is complete or absent, also after a crash."""
    with checkpoint_dir(out) as tmp:
        write_checkpoint(ptc, arrays, values, tmp)
