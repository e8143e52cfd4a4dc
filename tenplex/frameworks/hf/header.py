"""One `.safetensors` file: its header, parsed and checked, and its tensors as numpy views.

The format (huggingface/safetensors): 8 bytes little-endian `N`, `N` bytes of a JSON object
(UTF-8, padded with spaces), then the raw little-endian data. The object maps each tensor name
to `{"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}` (offsets into the data,
end exclusive) and may hold `"__metadata__"`, a map of strings to strings.

`read_header(path)` parses and checks it; `map_tensors(header)` maps the file read-only with
numpy and returns one view per tensor: nothing is copied, and only what a plan reads is paged in.

Invariants (each refused with an `HfError` naming the file and the field):
- the header length fits the file and at most `MAX_HEADER_BYTES`; the header is a JSON object
  without duplicate keys, and `__metadata__` maps strings to strings;
- every dtype is one of `DTYPES`; shapes are lists of integers >= 0;
- `data_offsets` are two integers with `end - begin` = the tensor's bytes, inside the file's
  data (else the file is truncated), and no two tensors' bytes overlap.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.frameworks.hf.errors import HfError
from tenplex.ir.files import one_line, open_regular
from tenplex.ir.tensor import itemsize
from tenplex.runtime.arrays import np_dtype

__all__ = ["DTYPES", "MAX_HEADER_BYTES", "Header", "TensorEntry", "map_tensors", "read_header"]

DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "F16": "float16",
    "BF16": "bfloat16", "U32": "uint32", "I32": "int32", "F32": "float32", "U64": "uint64",
    "I64": "int64", "F64": "float64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
CODES = {name: code for code, name in DTYPES.items()}
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
METADATA = "__metadata__"


@attrs.frozen
class TensorEntry:
    """One tensor of a file: name, tenplex dtype name, shape, byte range [begin, end) of the data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@attrs.frozen
class Header:
    """A checked header: the tensors in data order, `__metadata__`, where the data starts."""

    path: Path
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str] = attrs.field(eq=False)
    data_start: int
    size: int


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; ValueError for a repeated key (`json` keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def read_header(path: str | os.PathLike) -> Header:
    """The checked header of the safetensors file `path` (see the module docstring).
    Raises HfError naming the file and the field that is wrong."""
    path = Path(path)
    with open_regular(path, "a safetensors file", HfError) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise HfError(f"{path}: truncated: {size} bytes, less than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise HfError(f"{path}: header length {n} does not fit (file of {size} bytes, limit {MAX_HEADER_BYTES}): truncated or not safetensors")
        raw = f.read(n)
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise HfError(f"{path}: header is not a JSON object ({type(e).__name__}: {one_line(e, 200)})") from None
    if not isinstance(doc, dict):
        raise HfError(f"{path}: header is {type(doc).__name__}, not a JSON object")
    metadata = doc.pop(METADATA, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HfError(f"{path}: {METADATA} is {metadata!r}, not a map of strings to strings")
    data = size - 8 - n
    tensors = sorted((_entry(path, name, item, data) for name, item in doc.items()), key=lambda t: (t.begin, t.end))
    for a, b in zip(tensors, tensors[1:]):
        if b.begin < a.end:
            raise HfError(f"{path}: tensor {b.name!r} data_offsets [{b.begin}, {b.end}) overlap tensor {a.name!r} [{a.begin}, {a.end})")
    return Header(path, tuple(tensors), metadata, 8 + n, size)


def _entry(path: Path, name: str, item: Any, data: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(item, dict) or set(item) != {"dtype", "shape", "data_offsets"}:
        raise HfError(f"{where} is {repr(item)[:120]}, not an object of dtype, shape and data_offsets")
    code, shape, offsets = item["dtype"], item["shape"], item["data_offsets"]
    if code not in DTYPES:
        raise HfError(f"{where} dtype {code!r} is not one tenplex reads ({', '.join(DTYPES)})")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise HfError(f"{where} shape {shape!r} is not a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        raise HfError(f"{where} data_offsets {offsets!r} are not two integers >= 0")
    dtype, (begin, end) = DTYPES[code], offsets
    nbytes = math.prod(shape) * itemsize(dtype)
    if end - begin != nbytes:
        raise HfError(f"{where} data_offsets [{begin}, {end}) hold {end - begin} bytes, but {code}{shape} needs {nbytes}")
    if end > data:
        raise HfError(f"{where} data_offsets [{begin}, {end}) exceed the file's {data} data bytes: truncated")
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def map_tensors(header: Header) -> dict[str, np.ndarray]:
    """Read-only numpy views of every tensor of `header`'s file, memory-mapped (no copy). The
    file must not change while the views are used."""
    if header.size == 0:
        return {}
    mm = np.memmap(header.path, dtype=np.uint8, mode="r")
    if mm.size != header.size:
        raise HfError(f"{header.path}: changed while read ({mm.size} bytes, was {header.size})")
    start = header.data_start
    return {t.name: np.ndarray(t.shape, np_dtype(t.dtype), buffer=mm, offset=start + t.begin) for t in header.tensors}
