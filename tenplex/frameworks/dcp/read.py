"""Read a PyTorch DCP checkpoint directory (`.metadata` + `*.distcp`) as a PTC triple.

`read_dcp(dir) -> (PTC, {sub-tensor id: array}, {partition id: {name: value}})`, the same
triple as `tenplex.runtime.checkpoint.directory.read_checkpoint`:

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
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

from tenplex.frameworks.dcp.format import DcpError, FileSlice
from tenplex.frameworks.dcp.metadata import load_metadata
from tenplex.frameworks.dcp.transforms import check_transforms, untransformed
from tenplex.frameworks.dtensor.convert import dtype_name, to_numpy
from tenplex.frameworks.dtensor.values import value_from_bytes
from tenplex.ir.box import Box
from tenplex.ir.errors import IRError, TenplexError
from tenplex.ir.files import check_relative, confined, one_line, open_regular
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta, itemsize
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.arrays import np_dtype

SUFFIX = ".distcp"


@attrs.frozen
class Entry:
    """One stored item: a tensor chunk (`box` set) or a bytes entry (`box` None)."""

    fqn: str
    box: Box | None
    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return self.fqn if self.box is None else f"{self.fqn}@[{','.join(map(str, self.box.start))}]"


@attrs.frozen
class DcpIndex:
    """What `.metadata` says: tensors, stored entries and the flatten mapping (planner_data)."""

    root: Path
    tensors: tuple[TensorMeta, ...]
    entries: tuple[Entry, ...]
    mapping: dict[str, tuple[Any, ...]] = attrs.field(eq=False)
    version: str | None = None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({e.file for e in self.entries}))

    def partition_of(self, file: str) -> str:
        return file.removesuffix(SUFFIX)


def read_index(root: str | os.PathLike, *, trust_pickles: bool = False) -> DcpIndex:
    """Parse `root/.metadata` (`trust_pickles`: see the module docstring). Raises DcpError
    naming the file or key that is wrong, or the class its pickle needs outside the allow-list."""
    root = Path(root)
    path = root / ".metadata"
    md = load_metadata(path, trust_pickles=trust_pickles)
    sd = getattr(md, "state_dict_metadata", None)
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict) or not isinstance(sd, dict):
        raise DcpError(f"{path}: holds {type(md).__name__} without state_dict_metadata and storage_data dicts, not DCP Metadata")
    odd = next((k for k in sd if not isinstance(k, str)), None)
    if odd is not None:
        raise DcpError(f"{path}: state_dict_metadata key {odd!r} is not a string")
    tensors, entries = [], []
    for fqn, item in sorted(sd.items()):
        if isinstance(item, TensorStorageMetadata):
            meta = _meta(path, fqn, item)
            tensors.append(meta)
            entries += [_chunk_entry(path, md, meta, i, c) for i, c in enumerate(item.chunks)]
        elif isinstance(item, BytesStorageMetadata):
            entries.append(_entry(path, md, fqn, None))
        else:
            raise DcpError(f"{path}: key {fqn!r} has storage type {type(item).__name__}, not tensor or bytes")
    return DcpIndex(root, tuple(tensors), tuple(entries), _mapping(path, md.planner_data), md.version)


def _mapping(path: Path, planner_data: Any) -> dict[str, tuple[Any, ...]]:
    """The flatten mapping (FQN -> nested key path of str and int) of `planner_data`, if any."""
    if not isinstance(planner_data, dict):
        return {}
    for fqn, keys in planner_data.items():
        if not isinstance(fqn, str) or not isinstance(keys, (tuple, list)) or not all(type(k) in (str, int) for k in keys):
            raise DcpError(f"{path}: planner_data maps {fqn!r} to {keys!r}, not to a key path of strings and integers")
    return {fqn: tuple(keys) for fqn, keys in planner_data.items()}


def _ints(path: Path, where: str, value: Any) -> tuple[int, ...]:
    """`value` as a tuple of ints >= 0 (a size or offsets read from the metadata)."""
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        raise DcpError(f"{path}: {where} is {value!r}, not a sequence of integers >= 0")
    return tuple(value)


def _meta(path: Path, fqn: str, item: TensorStorageMetadata) -> TensorMeta:
    size = _ints(path, f"tensor {fqn!r} size", getattr(item, "size", None))
    dtype = getattr(getattr(item, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise DcpError(f"{path}: tensor {fqn!r} has dtype {dtype!r}, not a torch dtype")
    if not isinstance(getattr(item, "chunks", None), list):
        raise DcpError(f"{path}: tensor {fqn!r} chunks are {type(getattr(item, 'chunks', None)).__name__}, not a list")
    try:
        return TensorMeta(fqn, size, dtype_name(dtype))
    except TenplexError as e:
        raise DcpError(f"{path}: tensor {fqn!r}: {e}") from None


def _chunk_entry(path: Path, md: Metadata, meta: TensorMeta, i: int, chunk: Any) -> Entry:
    offsets = _ints(path, f"tensor {meta.name!r} chunk {i} offsets", getattr(chunk, "offsets", None))
    sizes = _ints(path, f"tensor {meta.name!r} chunk {i} sizes", getattr(chunk, "sizes", None))
    try:
        box = Box(offsets, tuple(o + s for o, s in zip(offsets, sizes)))
    except IRError as e:
        raise DcpError(f"{path}: tensor {meta.name!r} chunk {i}: {e}") from None
    if box.ndim != len(meta.shape) or not meta.box.contains(box):
        raise DcpError(f"{path}: tensor {meta.name!r} chunk {i} at offsets {list(offsets)} sizes {list(sizes)} is outside its size {list(meta.shape)}")
    return _entry(path, md, meta.name, box)


def _entry(path: Path, md: Metadata, fqn: str, box: Box | None) -> Entry:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    index = MetadataIndex(fqn, None if box is None else box.start)
    info = md.storage_data.get(index)
    where = fqn if box is None else f"{fqn} chunk at offsets {list(box.start)}"
    if info is None:
        raise DcpError(f"{path}: storage_data has no entry for {where}")
    file, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
    if not isinstance(file, str) or "/" in file or type(offset) is not int or type(length) is not int or min(offset, length) < 0:
        raise DcpError(f"{path}: storage_data of {where} names file {file!r} at offset {offset!r} length {length!r}, "
                       "not a file name with integers >= 0")  # fmt: skip
    check_relative(file, f"storage_data of {where}: file", DcpError)
    transforms = check_transforms(path, f"{where} in {file}", getattr(info, "transform_descriptors", None))
    return Entry(fqn, box, file, offset, length, transforms)


def ptc_of_index(index: DcpIndex, *, complete: bool = True) -> PTC:
    """The PTC of the saved layout (see the module docstring). Raises DcpError when chunks
    overlap or (with `complete`) leave a tensor region uncovered."""
    by_tensor: dict[str, list[Entry]] = defaultdict(list)
    by_file: dict[str, list[Entry]] = defaultdict(list)
    for e in index.entries:
        by_file[e.file].append(e)
        if e.box is not None:
            by_tensor[e.fqn].append(e)
    for fqn, chunks in by_tensor.items():
        for i, j in overlapping_pairs([c.box for c in chunks], [c.box for c in chunks]):
            if i < j:
                raise DcpError(f"{index.root / '.metadata'}: tensor {fqn!r} chunks {chunks[i].box} ({chunks[i].file}) and {chunks[j].box} ({chunks[j].file}) overlap")
    subtensors, partitions = [], []
    for file in index.files:
        chunks = [e for e in by_file[file] if e.box is not None]
        paths = [e.fqn for e in chunks]
        for e, p in zip(chunks, paths):
            pieces = (Piece(e.box, Box.from_shape(e.box.shape)),) if e.box.volume else ()
            subtensors.append(SubTensor(e.key, e.fqn, p if paths.count(p) == 1 else e.key, e.box.shape, pieces))
        values = {e.fqn: Value() for e in by_file[file] if e.box is None}
        partitions.append(Partition(index.partition_of(file), [e.key for e in chunks], values))
    devices = range(len(partitions))
    ptc = PTC(index.tensors, tuple(subtensors), tuple(partitions), Allocation({p.id: (i,) for i, p in zip(devices, partitions)}),
              Topology(tuple(Device(i, "h0") for i in devices)))  # fmt: skip
    gaps = ptc.uncovered() if complete else {}
    if gaps:
        name = sorted(gaps)[0]
        raise DcpError(f"{index.root / '.metadata'}: tensor {name!r} region {gaps[name][0]} is in no saved chunk (the metadata does not cover it)")
    return ptc


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
