"""Read a PyTorch DCP checkpoint directory (`.metadata` + `*.distcp`) as a PTC triple.

`read_dcp(dir) -> (PTC, {sub-tensor id: array}, {partition id: {name: value}})`, the same
triple as `tenplex.runtime.checkpoint.directory.read_checkpoint` (the index and PTC come from
`dcp.index`, which needs no torch; re-exported here):

- tensors: one `TensorMeta` per tensor FQN of `state_dict_metadata` (global `size`, dtype);
- partitions: **one per data file** (`__0_0.distcp` → partition `__0_0`), i.e. what one saving
  rank wrote through one writer thread. Files, not ranks, because DCP deduplicates replicated
  chunks across ranks (a rank's file is not its state dict) and a rank may write several files;
  partition i is allocated to device i of one host `h0`, files in sorted order;
- sub-tensors: one per saved chunk, id `{fqn}@[o0,o1,...]` (its global offsets), path the FQN
  (`{fqn}@[...]` if one file holds two chunks of a tensor), one piece covering the chunk;
  zero-size chunks (empty DTensor shards) are kept as sub-tensors without pieces;
- values: each bytes entry (non-tensor leaf) becomes a value of its file's partition, JSON data
  or an opaque bytes value (see `dtensor.values`);
- arrays: by default read-only views of the memory-mapped files at each chunk's saved storage
  (found with a meta-device `torch.load`, which reads no tensor data), so reading costs no copy
  and only the bytes a plan touches are ever paged in; `mmap=False` loads copies instead.

Raises `DcpError` naming the file and key for: a missing or unreadable `.metadata`, a missing or
truncated data file, a chunk outside its tensor or overlapping another, a tensor region no
chunk covers, stream transforms other than ZStandard compression (`transforms`: entries are
decompressed into memory, arrays are views of that) and chunk bytes that do not hold the tensor
the metadata describes.

The directory may come from anyone: `.metadata` is unpickled with an allow-list of DCP's
metadata classes (`dcp.metadata`; `trust_pickles=True` unpickles anything, as DCP does), every
field read from it is type-checked, a data file must be a plain file name that resolves inside
the directory and a regular file (a fifo is refused, not waited on), and chunks are loaded with
`torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import mmap
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from tenplex.frameworks.dcp.format import DcpError, FileSlice
from tenplex.frameworks.dcp.index import SUFFIX, DcpIndex, Entry, ptc_of_index, read_index
from tenplex.frameworks.dcp.transforms import untransformed
from tenplex.frameworks.dtensor.convert import dtype_name, to_numpy
from tenplex.frameworks.dtensor.values import value_from_bytes
from tenplex.ir.files import confined, one_line, open_regular
from tenplex.ir.ptc import PTC
from tenplex.ir.tensor import itemsize
from tenplex.runtime.arrays import np_dtype

__all__ = ["SUFFIX", "DcpIndex", "Entry", "ptc_of_index", "read_dcp", "read_index"]


def read_dcp(root: str | os.PathLike, index: DcpIndex | None = None, *, mmap: bool = True,
             trust_pickles: bool = False) -> tuple[PTC, dict[str, np.ndarray], dict[str, dict[str, Any]]]:  # fmt: skip
    """(PTC, sub-tensor id -> array, partition id -> values) of a DCP directory (see above);
    `index`, when given, is `read_index(root)` already done. With `mmap` (the default) arrays
    are read-only views of the memory-mapped `.distcp` files (no copy; the files must not
    change while the arrays are used), else copies loaded by `torch.load`. `trust_pickles`:
    see `read_index`."""
    index = index or read_index(root, trust_pickles=trust_pickles)
    ptc = ptc_of_index(index)
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, dict[str, Any]] = {p.id: {} for p in ptc.partitions}
    dtypes = {t.name: t.dtype for t in index.tensors}
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in index.entries:
        by_file[e.file].append(e)
    for file, entries in sorted(by_file.items()):
        pid = index.partition_of(file)
        path = confined(index.root, file, f"data file of {entries[0].key}", DcpError)
        for e, got in _read_file(path, entries, dtypes, mmap):
            if e.box is None:
                values[pid][e.fqn] = value_from_bytes(got)
            else:
                arrays[e.key] = got
    return ptc, arrays, values


def _read_file(path: Path, entries: list[Entry], dtypes: dict[str, str], use_mmap: bool):
    """(entry, raw bytes or array) per entry, in file order."""
    f = open_regular(path, f"holds {entries[0].key} and {len(entries) - 1} more", DcpError)
    with f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if use_mmap and size else None
        plain = untransformed(path, f, entries, dtypes) if any(e.transforms for e in entries) else {}
        for e in sorted(entries, key=lambda e: e.offset):
            if e.offset + e.length > size:
                raise DcpError(f"{path}: truncated: {e.key} needs bytes [{e.offset}, {e.offset + e.length}) but the file has {size}")
            if e.transforms:
                data = plain[e.key]
                unpacked = attrs.evolve(e, offset=0, length=len(data))
                yield e, data if e.box is None else _chunk(path, io.BytesIO(data), data if use_mmap else None, unpacked, dtypes[e.fqn])
            elif e.box is None:
                f.seek(e.offset)
                yield e, f.read(e.length)
            else:
                yield e, _chunk(path, f, mm, e, dtypes[e.fqn])


def _chunk(path: Path, f: Any, mm: mmap.mmap | bytes | None, e: Entry, dtype: str) -> np.ndarray:
    """The chunk's array: a view of `mm` at the saved storage (its offset from a meta-device
    `torch.load`, which reads no data), or a `torch.load`ed copy without `mm`."""
    where = f"{path}: {e.key} at bytes [{e.offset}, {e.offset + e.length})"
    try:
        t = torch.load(FileSlice(f, e.offset, e.length), map_location="meta" if mm else "cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (a corrupt slice, whatever torch raises)
        raise DcpError(f"{where} is not a saved tensor ({type(err).__name__}: {one_line(err)})") from None
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != e.box.shape or dtype_name(t.dtype) != dtype:
        got = f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise DcpError(f"{where} holds {got}, expected {dtype}{list(e.box.shape)}")
    if mm is None:
        return to_numpy(t)
    base = getattr(t.untyped_storage(), "_checkpoint_offset", None)
    if not e.box.volume or base is None:  # nothing to map, or an old format without offsets
        return to_numpy(torch.load(FileSlice(f, e.offset, e.length), map_location="cpu", weights_only=True))
    size = itemsize(dtype)
    start = e.offset + base + t.storage_offset() * size
    span = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * size
    if start < e.offset or start + span > e.offset + e.length:
        raise DcpError(f"{where}: its storage [{start}, {start + span}) lies outside the entry")
    return np.ndarray(t.shape, np_dtype(dtype), buffer=mm, offset=start, strides=tuple(s * size for s in t.stride()))
