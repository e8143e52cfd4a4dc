"""What a DCP checkpoint directory's `.metadata` says, as an index and a PTC, without torch.

`read_index(dir) -> DcpIndex`: the tensors (one `TensorMeta` per FQN of `state_dict_metadata`:
global `size`, dtype), the stored entries (a tensor chunk or a bytes entry: file, offset, length,
stream transforms) and the flatten mapping; `ptc_of_index(index)`: the PTC of the saved layout
(`dcp.read`'s module docstring: one partition per data file, one sub-tensor per chunk).
`.metadata` is unpickled into plain stand-ins of DCP's classes (`dcp.metadata`, `dcp.pickled`), so
this module and `tenplex inspect`/`tenplex layout` of a DCP directory import no torch; reading
the data (`dcp.read.read_dcp`) does.

Raises `DcpError` naming the file and key for: a missing or unreadable `.metadata`, a field of
the wrong type, a chunk outside its tensor or overlapping another, a tensor region no chunk
covers, and stream transforms other than ZStandard compression (`transforms`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs

from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dcp.metadata import load_metadata
from tenplex.frameworks.dcp.pickled import (
    DTYPES,
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
    TorchName,
)
from tenplex.frameworks.dcp.transforms import check_transforms
from tenplex.ir.box import Box
from tenplex.ir.errors import IRError, TenplexError
from tenplex.ir.files import check_relative
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.tensor import ITEMSIZE, Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

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
    if not isinstance(dtype, TorchName) or dtype.name not in DTYPES:
        raise DcpError(f"{path}: tensor {fqn!r} has dtype {dtype!r}, not a torch dtype")
    if not isinstance(getattr(item, "chunks", None), list):
        raise DcpError(f"{path}: tensor {fqn!r} chunks are {type(getattr(item, 'chunks', None)).__name__}, not a list")
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise DcpError(f"{path}: tensor {fqn!r}: torch dtype {dtype} has no tenplex dtype (known: {', '.join(sorted(ITEMSIZE))})")
    try:
        return TensorMeta(fqn, size, name)
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
