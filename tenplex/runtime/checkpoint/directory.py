"""Checkpoint directories: a PTC and its sub-tensors as `.npy` files (`tenplex reshard`'s format).

Directory format (device-free; the same tree the FUSE view shows for one state):

    DIR/ptc.json                          the PTC (`tenplex.ptc/1`)
    DIR/<partition>/<sub-tensor path>.npy one file per sub-tensor of the partition
    DIR/<partition>/values.json           {value name: JSON value} of the partition

A sub-tensor's file holds its local array (shape `st.shape`). bfloat16 and float8 arrays are
stored as raw bits in the unsigned integer of the same width (`<u2`, `|u1`); the real dtype is
the tensor's dtype in ptc.json. Sub-tensor paths must be unique within a partition, relative,
without `.`/`..` components, and no path may be `values` (the values file). Replicas (a
partition on several devices) are stored once: the allocation and topology in ptc.json are
informative only.

Invariants:
- `write_checkpoint_dir` leaves the directory complete and re-read in full, or absent;
- every read error names the file and the sub-tensor or partition it belongs to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import atomic_dir, read_json
from tenplex.ir.ptc import PTC
from tenplex.ir.serialize import dumps, load_ptc
from tenplex.runtime.arrays import np_dtype, npy_dtype

__all__ = ["PTC_FILE", "VALUES_FILE", "CheckpointError", "read_checkpoint", "relative_paths", "write_checkpoint",
           "write_checkpoint_dir"]  # fmt: skip

PTC_FILE = "ptc.json"
VALUES_FILE = "values.json"


class CheckpointError(TenplexError):
    """A checkpoint directory that cannot be read or written."""


def _stored_dtype(name: str) -> np.dtype:
    """The dtype of the .npy file for a tensor dtype: raw unsigned bits for non-numpy dtypes."""
    return npy_dtype(np_dtype(name))


def relative_paths(ptc: PTC) -> dict[str, str]:
    """Sub-tensor id -> file path relative to the directory; raises on unsafe or shared paths."""
    out: dict[str, str] = {}
    for part in ptc.partitions:
        seen: dict[str, str] = {}
        for sid in part.subtensors:
            path = ptc.subtensor_map[sid].path
            for kind, name in (("partition id", part.id), (f"sub-tensor {sid!r} path", path)):
                parts = PurePosixPath(name).parts
                if not name or name.startswith("/") or any(p in (".", "..") for p in parts) or "\\" in name:
                    raise CheckpointError(f"{kind} {name!r} cannot be a relative file path")
            if path in seen:
                raise CheckpointError(
                    f"partition {part.id!r}: sub-tensors {seen[path]!r} and {sid!r} share path {path!r}"
                )
            if path == VALUES_FILE.removesuffix(".json"):
                raise CheckpointError(
                    f"partition {part.id!r}: sub-tensor {sid!r} path {path!r} clashes with {VALUES_FILE}"
                )
            seen[path] = sid
            out[sid] = f"{part.id}/{path}.npy"
    return out


def write_checkpoint(ptc: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]],
                     out_dir: str | os.PathLike) -> None:  # fmt: skip
    """Write the directory format into `out_dir` (created; must not exist, or be empty).

    `arrays`: sub-tensor id -> local array; `values`: partition id -> {name: value}.
    Raises CheckpointError naming the sub-tensor or partition when one is missing or wrong."""
    files = relative_paths(ptc)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for st in ptc.subtensors:
        if st.id not in arrays:
            raise CheckpointError(f"no array for sub-tensor {st.id!r}")
        a = np.asarray(arrays[st.id])
        dtype = ptc.tensor_map[st.tensor].dtype
        if a.shape != st.shape or a.dtype != np_dtype(dtype):
            raise CheckpointError(
                f"sub-tensor {st.id!r}: array {a.dtype}{list(a.shape)}, expected {dtype}{list(st.shape)}"
            )
        path = out / files[st.id]
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.ascontiguousarray(a).view(_stored_dtype(dtype)), allow_pickle=False)
    for part in ptc.partitions:
        got = dict(values.get(part.id, {}))
        if set(got) != set(part.value_map):
            raise CheckpointError(f"partition {part.id!r}: values {sorted(got)}, expected {sorted(part.value_map)}")
        (out / part.id).mkdir(parents=True, exist_ok=True)
        (out / part.id / VALUES_FILE).write_text(json.dumps(got, sort_keys=True, allow_nan=False) + "\n")
    (out / PTC_FILE).write_text(dumps(ptc))


def read_checkpoint(src_dir: str | os.PathLike) -> tuple[PTC, dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """(PTC, sub-tensor id -> array, partition id -> values) of a checkpoint directory.
    Raises CheckpointError (or ParseError for ptc.json) naming the file that is missing or wrong."""
    root = Path(src_dir)
    if not (root / PTC_FILE).is_file():
        raise CheckpointError(f"{root / PTC_FILE}: missing (not a checkpoint directory)")
    ptc = load_ptc(root / PTC_FILE)
    arrays: dict[str, np.ndarray] = {}
    for sid, rel in relative_paths(ptc).items():
        st, path = ptc.subtensor_map[sid], root / rel
        dtype = ptc.tensor_map[st.tensor].dtype
        try:
            a = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (sub-tensor {sid!r})") from None
        except (OSError, ValueError, EOFError) as e:
            raise CheckpointError(f"{path}: not a readable .npy file ({e})") from None
        if a.shape != st.shape or a.dtype != _stored_dtype(dtype):
            raise CheckpointError(f"{path}: holds {a.dtype}{list(a.shape)}, expected "
                                  f"{_stored_dtype(dtype)}{list(st.shape)} (sub-tensor {sid!r}, {dtype})")  # fmt: skip
        arrays[sid] = a.view(np_dtype(dtype))
    values: dict[str, dict[str, Any]] = {}
    for part in ptc.partitions:
        path = root / part.id / VALUES_FILE
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (values of partition {part.id!r})")
        got = read_json(path, CheckpointError)
        if not isinstance(got, dict) or set(got) != set(part.value_map):
            names = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise CheckpointError(f"{path}: values {names}, expected {sorted(part.value_map)}")
        values[part.id] = got
    return ptc, arrays, values


def write_checkpoint_dir(ptc: PTC, arrays: dict, values: dict, out: Path) -> None:
    """Write into a temporary directory beside `out`, validate it, rename it to `out`."""
    with atomic_dir(out, CheckpointError) as tmp:
        write_checkpoint(ptc, arrays, values, tmp)
        read_checkpoint(tmp)  # the written tree reads back in full
