"""The agent control wire's message format: typed JSON plus raw buffers, never pickles.

A message is one Python value built from: None, bool, int, float (non-finite floats tagged),
str, list, tuple, dict (any encodable keys), bytes, numpy arrays of numeric dtypes (bfloat16 and
float8 included) and numpy scalars. `encode` turns it into a JSON header and a list of raw
buffers; `decode` turns them back. Decoding builds only those types: nothing is imported,
called or looked up by name, so a peer can at worst send wrong data, never run code.

Frame on the wire: `TPX1` (4 bytes), the header length and the number of buffers (8 + 4 bytes,
big-endian), the UTF-8 JSON header `{"v": VALUE, "n": [buffer lengths]}`, then the buffers.
In VALUE a dict whose keys are all strings not starting with `$` is itself; everything else is
tagged: `{"$t": [...]}` tuple, `{"$m": [[k, v], ...]}` other dicts, `{"$f": "inf"}` float,
`{"$b": i}` bytes (buffer i), `{"$a": i, "dtype": D, "shape": S}` array, `{"$g": i, "dtype": D}`
numpy scalar.

Invariants: decode(encode(x)) == x with types (tuple stays tuple, dict key types kept, arrays
keep dtype and shape); every malformed input raises `WireError` naming what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.arrays import EXTRA_DTYPES, np_dtype

__all__ = ["MAGIC", "PREFIX", "WireError", "decode", "encode", "parse_prefix"]

MAGIC = b"TPX1"
PREFIX = struct.Struct(">4sQI")  # magic, header bytes, number of buffers
MAX_HEADER = 1 << 31
MAX_BUFFERS = 1 << 24
_TAGS = {"$t", "$m", "$f", "$b", "$a", "$g"}
_PLAIN = {str, int, bool, type(None)}  # exact types `_enc` returns unchanged
_NESTED = {list, dict}  # what JSON decodes to that `_dec` must look into


class WireError(ExecutionError):
    """A control message that cannot be sent or is malformed; names what is wrong."""


def _dtype(name: Any, where: str) -> np.dtype:
    try:
        dtype = np_dtype(name) if isinstance(name, str) else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or not (dtype.kind in "biufc" or str(dtype) in EXTRA_DTYPES) or dtype.hasobject:
        raise WireError(f"{where}: dtype {name!r} is not a numeric dtype")
    return dtype


def encode(value: Any) -> tuple[bytes, list[memoryview]]:
    """(JSON header, raw buffers) of `value`. Raises WireError for a type the wire does not carry."""
    buffers: list[memoryview] = []
    header = json.dumps({"v": _enc(value, buffers), "n": [b.nbytes for b in buffers]}, allow_nan=False).encode()
    return header, buffers


def _enc(x: Any, buffers: list[memoryview]) -> Any:
    """`x` as JSON, its raw parts appended to `buffers`. A module function, not a closure that
    calls itself: such a closure is a reference cycle holding `buffers`, so every array sent
    would live on until the cyclic collector ran."""
    if type(x) is list:  # the common case first; str, int and None items as they are (no call each)
        return [v if type(v) in _PLAIN else _enc(v, buffers) for v in x]
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else {"$f": repr(x)}
    if isinstance(x, np.ndarray):
        a = x if x.flags.c_contiguous else x.copy(order="C")  # ascontiguousarray makes 0-d 1-d
        _dtype(str(a.dtype), "encode")
        buffers.append(memoryview(a.reshape(-1).view(np.uint8)))
        return {"$a": len(buffers) - 1, "dtype": str(a.dtype), "shape": list(a.shape)}
    if isinstance(x, np.generic):
        _dtype(str(x.dtype), "encode")
        buffers.append(memoryview(x.tobytes()))
        return {"$g": len(buffers) - 1, "dtype": str(x.dtype)}
    if isinstance(x, (bytes, bytearray, memoryview)):
        buffers.append(memoryview(bytes(x)))
        return {"$b": len(buffers) - 1}
    if isinstance(x, tuple):
        return {"$t": [_enc(v, buffers) for v in x]}
    if isinstance(x, list):
        return [_enc(v, buffers) for v in x]
    if isinstance(x, dict):
        if all(type(k) is str and not k.startswith("$") for k in x):
            return {k: _enc(v, buffers) for k, v in x.items()}
        return {"$m": [[_enc(k, buffers), _enc(v, buffers)] for k, v in x.items()]}
    raise WireError(f"cannot send a {type(x).__module__}.{type(x).__qualname__} over the agent wire")


def parse_prefix(prefix: bytes) -> tuple[int, int]:
    """(header bytes, number of buffers) from a frame's prefix. Raises WireError."""
    magic, header, count = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"not a tenplex control frame (starts with {magic!r}, expected {MAGIC!r})")
    if header > MAX_HEADER or count > MAX_BUFFERS:
        raise WireError(f"frame too large: header {header} B, {count} buffers")
    return header, count


def decode(header: bytes, buffers: list[memoryview]) -> Any:
    """The value `encode` made. Raises WireError for anything malformed."""
    try:
        doc = json.loads(header.decode(), parse_constant=_reject)
        if not isinstance(doc, dict) or set(doc) != {"v", "n"}:
            raise WireError("frame header must be {\"v\": ..., \"n\": [...]}")
        return _dec(doc["v"], buffers)
    except WireError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
        raise WireError(f"malformed control frame: {type(e).__name__}: {e}") from None


def _reject(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _buffer(buffers: list[memoryview], index: Any) -> memoryview:
    if type(index) is not int or not 0 <= index < len(buffers):
        raise WireError(f"buffer index {index!r} outside the frame's {len(buffers)} buffers")
    return buffers[index]


def _dec(x: Any, buffers: list[memoryview]) -> Any:
    if type(x) is list:  # only lists and dicts need decoding: no call per other item
        return [_dec(v, buffers) if type(v) in _NESTED else v for v in x]
    if not isinstance(x, dict):
        return x
    tags = _TAGS & set(x)
    if not tags:
        return {k: _dec(v, buffers) for k, v in x.items()}
    tag = tags.pop()
    if tag == "$t":
        return tuple(_dec(v, buffers) for v in x["$t"])
    if tag == "$m":
        return {_key(_dec(k, buffers)): _dec(v, buffers) for k, v in x["$m"]}
    if tag == "$f":
        if x["$f"] not in ("inf", "-inf", "nan"):
            raise WireError(f"float tag {x['$f']!r} is not inf, -inf or nan")
        return float(x["$f"])
    if tag == "$b":
        return bytes(_buffer(buffers, x["$b"]))
    dtype = _dtype(x.get("dtype"), f"buffer {x.get(tag)!r}")
    raw = _buffer(buffers, x[tag])
    if tag == "$g":
        if raw.nbytes != dtype.itemsize:
            raise WireError(f"scalar of {dtype} in {raw.nbytes} B")
        return np.frombuffer(raw, dtype)[0]
    shape = x.get("shape")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError(f"array shape {shape!r} is not a list of non-negative integers")
    if math.prod(shape) * dtype.itemsize != raw.nbytes:
        raise WireError(f"array {dtype}{shape} does not fit its {raw.nbytes} B buffer")
    return np.frombuffer(raw, dtype).reshape(tuple(shape))


def _key(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise WireError(f"dict key {key!r} is not hashable") from None
    return key
