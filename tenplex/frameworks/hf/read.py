"""Read a Hugging Face safetensors directory as a PTC triple.

`read_hf(dir) -> (PTC, {sub-tensor id: array}, {partition id: {name: value}})`, the triple of
`tenplex.runtime.checkpoint.directory.read_checkpoint`. The directory holds what
`save_pretrained` writes (`model.safetensors`, or shards `model-0000i-of-0000n.safetensors` named
by `model.safetensors.index.json`) or what DCP's `HuggingFaceStorageWriter` writes (the same
names and index; with `save_distributed`, `shard-*-model-*.safetensors` files without an index
whose tensors are chunks placed by the `DCP_SHARDING_INFO` entry of `__metadata__`):

- the files: those the index names (every one must exist and hold exactly the tensors the
  index maps to it), else every `*.safetensors` file of the directory;
- partitions: one per file (`model-00001-of-00002.safetensors` -> partition
  `model-00001-of-00002`), allocated to device i of host `h0`, files in sorted order;
- tensors: one per name; a name in several files is a tensor cut into chunks (its global shape
  reaches the farthest chunk), each at its saved offsets (zeros without sharding info);
- sub-tensors: one per chunk, id the name (`name@[o0,o1,...]` for a cut tensor), path the name;
- values: the JSON object `tenplex.values` of a file's `__metadata__` (written by `write_hf`);
- arrays: read-only views of the memory-mapped files (`header.map_tensors`): no copy.

Raises `HfError` naming the file and field: a missing or malformed index, a file it names that
is missing (a half-written or partly copied checkpoint), a malformed header (`header`), chunks
that overlap, disagree on dtype or leave a region of their tensor uncovered.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.header import Header, TensorEntry, map_tensors, read_header
from tenplex.ir.box import Box
from tenplex.ir.files import confined, loads, read_json
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta
from tenplex.ir.topology import Device, Topology

__all__ = ["INDEX", "SHARDING", "SUFFIX", "VALUES", "HfIndex", "Chunk", "ptc_of_index", "read_hf", "read_index"]

INDEX = "model.safetensors.index.json"
SUFFIX = ".safetensors"
SHARDING = "DCP_SHARDING_INFO"  # torch.distributed.checkpoint._hf_utils.CUSTOM_METADATA_KEY
VALUES = "tenplex.values"


@attrs.frozen
class Chunk:
    """One tensor entry of one file, placed at `box` of its tensor."""

    file: str
    entry: TensorEntry
    box: Box

    @classmethod
    def at(cls, file: str, entry: TensorEntry, offsets: tuple[int, ...]) -> Chunk:
        return cls(file, entry, Box(offsets, tuple(o + s for o, s in zip(offsets, entry.shape))))


@attrs.frozen
class HfIndex:
    """The checked headers of a directory's files (sorted by name) and whether an index named them."""

    root: Path
    headers: tuple[Header, ...]
    indexed: bool

    def chunks(self) -> dict[str, list[Chunk]]:
        """Tensor name -> its chunks, in file order."""
        out: dict[str, list[Chunk]] = defaultdict(list)
        for h in self.headers:
            placed = _sharding(h)
            for t in h.tensors:
                out[t.name].append(Chunk.at(h.path.name, t, placed.get(t.name, (0,) * len(t.shape))))
        return out


def read_index(root: str | os.PathLike) -> HfIndex:
    """The files of directory `root` and their checked headers (see the module docstring)."""
    root = Path(root)
    if (root / INDEX).exists():
        files, weight_map = _indexed_files(root)
    else:
        files, weight_map = sorted(p.name for p in root.glob(f"*{SUFFIX}") if not p.name.startswith(".")), None
        if not files:
            raise HfError(f"{root}: no *{SUFFIX} file and no {INDEX}: not a Hugging Face checkpoint")
    headers = tuple(read_header(root / f) for f in files)
    for h in headers if weight_map is not None else ():
        names = {t.name for t in h.tensors}
        mapped = {k for k, v in weight_map.items() if v == h.path.name}
        if names != mapped:
            odd = sorted(names ^ mapped)[0]
            where = f"holds {odd!r}, which {INDEX} maps elsewhere" if odd in names else f"lacks {odd!r}, which {INDEX} maps to it"
            raise HfError(f"{h.path}: {where}")
    return HfIndex(root, headers, weight_map is not None)


def _indexed_files(root: Path) -> tuple[list[str], dict[str, str]]:
    path = root / INDEX
    doc = read_json(path, HfError, "the safetensors index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HfError(f"{path}: weight_map is {type(weight_map).__name__}, not an object of tensor name -> file name")
    by_file: dict[str, list[str]] = defaultdict(list)
    for name, file in sorted(weight_map.items()):
        by_file[file].append(name)
    for file, names in sorted(by_file.items()):
        p = confined(root, file, f"weight_map file of {names[0]!r}", HfError)
        if not p.exists():
            raise HfError(f"{path}: names {file} (for {len(names)} tensor(s), e.g. {names[0]!r}), which is missing: "
                          "a half-written or partly copied checkpoint")  # fmt: skip
    return sorted(by_file), weight_map


def _sharding(h: Header) -> dict[str, tuple[int, ...]]:
    """Tensor name -> saved offsets, from DCP's `DCP_SHARDING_INFO` metadata (empty without it)."""
    info = _json_object(h, SHARDING, "tensor name -> saved_offsets")
    shapes = {t.name: t.shape for t in h.tensors}
    out = {}
    for name, item in info.items():
        offsets = item.get("saved_offsets") if isinstance(item, dict) else None
        shape = shapes.get(name)
        if shape is None or not isinstance(offsets, list) or len(offsets) != len(shape) or not all(type(o) is int and o >= 0 for o in offsets):
            raise HfError(f"{h.path}: __metadata__ {SHARDING} entry {name!r} is {item!r}: not saved_offsets of one of its tensors")
        out[name] = tuple(offsets)
    return out


def ptc_of_index(index: HfIndex) -> PTC:
    """The PTC of the saved layout (see the module docstring). Raises HfError when chunks of a
    tensor disagree on dtype, overlap, or leave a region uncovered."""
    tensors, subtensors = [], []
    by_file: dict[str, list[str]] = defaultdict(list)
    for name, chunks in sorted(index.chunks().items()):
        tensors.append(_tensor(index.root, name, chunks))
        boxes = [c.box for c in chunks]
        for i, j in overlapping_pairs(boxes, boxes) if len(boxes) > 1 else ():
            if i < j:
                raise HfError(f"{index.root}: tensor {name!r} chunks {boxes[i]} ({chunks[i].file}) and {boxes[j]} ({chunks[j].file}) overlap")
        for c in chunks:
            sid = name if len(chunks) == 1 else f"{name}@[{','.join(map(str, c.box.start))}]"
            pieces = (Piece(c.box, Box.from_shape(c.entry.shape)),) if c.box.volume else ()
            subtensors.append(SubTensor(sid, name, name, c.entry.shape, pieces))
            by_file[c.file].append(sid)
    partitions = [Partition(_partition(h), by_file[h.path.name], {k: Value() for k in _values(h)}) for h in index.headers]
    devices = range(len(partitions))
    ptc = PTC(tuple(tensors), tuple(subtensors), tuple(partitions), Allocation({p.id: (i,) for i, p in zip(devices, partitions)}),
              Topology(tuple(Device(i, "h0") for i in devices)))  # fmt: skip
    gaps = ptc.uncovered()
    if gaps:
        name = sorted(gaps)[0]
        raise HfError(f"{index.root}: tensor {name!r} region {gaps[name][0]} is in no file (a shard is missing?)")
    return ptc


def _tensor(root: Path, name: str, chunks: list[Chunk]) -> TensorMeta:
    dtypes = {c.entry.dtype for c in chunks}
    if len(dtypes) > 1 or len({c.box.ndim for c in chunks}) > 1:
        raise HfError(f"{root}: tensor {name!r} has chunks of different dtypes or ranks in {', '.join(c.file for c in chunks)}")
    shape = tuple(max(c.box.stop[d] for c in chunks) for d in range(chunks[0].box.ndim))
    return TensorMeta(name, shape, dtypes.pop())


def _partition(h: Header) -> str:
    return h.path.name.removesuffix(SUFFIX)


def _values(h: Header) -> dict[str, Any]:
    """The partition values a file's `__metadata__` carries (`tenplex.values`, a JSON object)."""
    return _json_object(h, VALUES, "values")


def _json_object(h: Header, key: str, what: str) -> dict[str, Any]:
    """The JSON object that `__metadata__[key]` holds ({} without the key). Raises HfError naming
    the file and key when it is no JSON object."""
    if key not in h.metadata:
        return {}
    try:
        found = loads(h.metadata[key])
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise HfError(f"{h.path}: __metadata__ {key} is not a JSON object of {what}")
    return found


def read_hf(root: str | os.PathLike, index: HfIndex | None = None) -> tuple[PTC, dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """(PTC, sub-tensor id -> array, partition id -> values) of a safetensors directory (see the
    module docstring); `index`, when given, is `read_index(root)` already done. The arrays are
    views of the mapped files, which must not change while they are used."""
    index = index or read_index(root)
    ptc = ptc_of_index(index)
    ids = {(st.tensor, ptc.partition_of[st.id]): st.id for st in ptc.subtensors}
    arrays = {ids[name, _partition(h)]: a for h in index.headers for name, a in map_tensors(h).items()}
    return ptc, arrays, {_partition(h): _values(h) for h in index.headers}
