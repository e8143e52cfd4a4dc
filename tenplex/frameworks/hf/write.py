"""Write a PTC triple as a Hugging Face safetensors directory, as `save_pretrained` lays it out.

`write_hf(ptc, arrays, values, out, max_shard_bytes=None)` takes a *whole* PTC (`whole_ptc`: one
partition `model` holding every tensor as one unsharded sub-tensor named like the tensor) and
writes `model.safetensors`, or with `max_shard_bytes` the shards `model-0000i-of-0000n.safetensors`
plus `model.safetensors.index.json` (`{"metadata": {"total_size"}, "weight_map"}`), filling a
shard in name order until the next tensor would pass the limit (as transformers does; a tensor
larger than the limit gets a shard of its own). Tensors are stored in each file by decreasing
item size, then name, after a header padded to 8 bytes, so every tensor is aligned. The values
go, as the JSON object `tenplex.values`, into the `__metadata__` of the first file (`format` is
`pt`, as transformers writes it). `OUT` is written beside its name, re-read and renamed: it is
complete or absent.

`parse_target(text)` reads the `--to` of `tenplex reshard --format hf`: `whole` (one file) or
`max_shard_size=SIZE` (`SIZE` in bytes or with a unit: `KB`/`MB`/`GB` are powers of 1000 as in
transformers, `KiB`/`MiB`/`GiB` powers of 1024).

Raises `HfError`: a PTC that is not whole, an array of another shape or dtype than its tensor,
an existing OUT, a failed write (naming the file and the reason).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tenplex.frameworks.hf.errors import HfError
from tenplex.frameworks.hf.header import CODES
from tenplex.frameworks.hf.read import INDEX, SUFFIX, VALUES, read_hf
from tenplex.ir.files import atomic_dir, write_atomic, write_failure
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor, TensorMeta, itemsize
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.arrays import np_dtype

__all__ = ["PARTITION", "parse_target", "whole_arrays", "whole_ptc", "write_hf"]

PARTITION = "model"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def parse_target(text: str) -> int | None:
    """`max_shard_bytes` of a `--to` for safetensors output: None for `whole`. Raises HfError."""
    if text.strip() == "whole":
        return None
    m = re.fullmatch(r"\s*max_shard_size\s*=\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS or int(m.group(1)) == 0:
        raise HfError(f"--to {text!r}: safetensors output takes 'whole' or 'max_shard_size=SIZE' (e.g. 5GB, 512MiB, 1000000)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def whole_ptc(src: PTC, names: Collection[str] | None = None) -> PTC:
    """One partition `model` on device 0 holding every tensor of `src` (or those named in
    `names`) whole, with `src`'s value names (inherited from src when resharded)."""
    tensors = tuple(t for t in src.tensors if names is None or t.name in names)
    subtensors = [SubTensor(t.name, t.name, t.name, t.shape, (Piece(t.box, t.box),) if t.box.volume else ()) for t in tensors]  # fmt: skip
    values = {name: Value() for p in src.partitions for name, _ in p.values}
    part = Partition(PARTITION, [t.name for t in tensors], values)
    return PTC(tensors, tuple(subtensors), (part,), Allocation({PARTITION: (0,)}), Topology((Device(0, "h0"),)))


def _whole(ptc: PTC, t: TensorMeta) -> SubTensor | None:
    """The one sub-tensor holding all of `t` as it is (no fill, no reordering), if there is one."""
    held = ptc.by_tensor[t.name]
    st = held[0] if len(held) == 1 else None
    return st if st is not None and st.shape == t.shape and (not t.box.volume or st.pieces == (Piece(t.box, t.box),)) else None


def whole_arrays(src: PTC, arrays: Mapping[str, Any]) -> dict[str, Any] | None:
    """Tensor name -> array when every tensor of `src` is held whole by one sub-tensor (so the
    arrays of `whole_ptc(src)` are `src`'s own: writing needs no copy); else None."""
    held = {t.name: _whole(src, t) for t in src.tensors}
    return None if None in held.values() else {name: arrays[st.id] for name, st in held.items()}


def _check_whole(ptc: PTC, out: Path) -> None:
    for t in ptc.tensors:
        held = ptc.by_tensor[t.name]
        st = _whole(ptc, t)
        if st is None or st.id != t.name:
            raise HfError(f"{out}: tensor {t.name!r} is held as {len(held)} sub-tensor(s), not whole: safetensors output "
                          "needs every tensor whole in one partition (whole_ptc)")  # fmt: skip


def _shards(tensors: list[TensorMeta], limit: int | None) -> list[list[TensorMeta]]:
    shards: list[list[TensorMeta]] = [[]]
    size = 0
    for t in sorted(tensors, key=lambda t: t.name):
        if limit is not None and shards[-1] and size + t.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def write_hf(ptc: PTC, arrays: Mapping[str, Any], values: dict[str, dict[str, Any]], out: str | os.PathLike,
             max_shard_bytes: int | None = None, extra: Mapping[str, str] | None = None) -> list[str]:  # fmt: skip
    """Write the whole PTC `ptc` with `arrays` (sub-tensor id -> array) and `values` (partition
    id -> values) to the new directory `out` (see the module docstring), with the text files
    `extra` (name -> text, e.g. `config.json`) beside them; returns the safetensors file names.
    Each array is read once, right before it is written, so `arrays` may be a lazy mapping
    whose item is valid until the next access (`dcp.apply.StreamedArrays`)."""
    out = Path(out)
    _check_whole(ptc, out)
    shards = _shards(list(ptc.tensors), max_shard_bytes)
    n = len(shards)
    names = [f"model{SUFFIX}"] if n == 1 else [f"model-{i:05d}-of-{n:05d}{SUFFIX}" for i in range(1, n + 1)]
    part_values = {k: v for p in ptc.partitions for k, v in values.get(p.id, {}).items()}
    with atomic_dir(out, HfError) as tmp:
        for i, (name, shard) in enumerate(zip(names, shards)):
            metadata = {"format": "pt", **({VALUES: json.dumps(part_values, sort_keys=True)} if i == 0 and part_values else {})}
            _write_file(tmp / name, out / name, shard, arrays, metadata)
        if n > 1:
            weight_map = {t.name: name for name, shard in zip(names, shards) for t in shard}
            doc = {"metadata": {"total_size": sum(t.nbytes for t in ptc.tensors)}, "weight_map": dict(sorted(weight_map.items()))}
            write_atomic(tmp / INDEX, json.dumps(doc, indent=2) + "\n")
        for name, text in (extra or {}).items():
            write_atomic(tmp / name, text)
        read_hf(tmp)  # the written directory reads back in full
    return names


def _array(out: Path, t: TensorMeta, array: Any) -> np.ndarray:
    a = np.asarray(array, order="C") if array is not None else None
    if a is None or a.shape != t.shape or a.dtype != np_dtype(t.dtype):
        got = "nothing" if a is None else f"{a.dtype}{list(a.shape)}"
        raise HfError(f"{out}: tensor {t.name!r} has {got}, expected {t.dtype}{list(t.shape)}")
    return a


def _write_file(path: Path, shown: Path, tensors: list[TensorMeta], arrays: Mapping[str, Any], metadata: dict[str, str]) -> None:
    """One safetensors file: header (tensors by decreasing item size, then name), then the data,
    each array fetched just before it is written."""
    tensors = sorted(tensors, key=lambda t: (-itemsize(t.dtype), t.name))
    header: dict[str, Any] = {"__metadata__": metadata}
    begin = 0
    for t in tensors:
        header[t.name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [begin, begin + t.nbytes]}
        begin += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    try:
        with open(path, "xb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for t in tensors:
                f.write(_array(shown, t, arrays.get(t.name)).reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_failure(shown, e, HfError) from None
