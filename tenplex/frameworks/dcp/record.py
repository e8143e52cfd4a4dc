"""`torch.save`'s record of one CPU tensor, built without torch: what DCP's writer puts into a
`.distcp` file for each tensor chunk, byte for byte.

`torch.save(tensor, stream)` writes a zip archive (`PyTorchStreamWriter`, miniz): every entry
stored (no compression), named `archive/<name>`, its local header followed by an `FB` extra
field of `Z` padding so that its data starts at a multiple of 64 bytes from the record's start,
then a data descriptor (CRC-32 and sizes; general-purpose flags 0x0808). Entries, in order:
`data.pkl` (the pickle below), `.format_version` = "1", `.storage_alignment` = "64",
`byteorder` = "little", `data/0` (the tensor's bytes), `version` = "3\\n", and
`.data/serialization_id`: 20 decimal digits of a hash of the entry names (a constant here: the
names never change) and 20 of `c10::hash_combine` folded over the non-empty entries' CRC-32s.
Then the central directory, a zip64 end record and locator, and the end record. An entry
without bytes has no data descriptor.

The pickle (protocol 2, as `torch.save` pickles) is `torch._utils._rebuild_tensor_v2(storage,
0, size, stride, False, OrderedDict())` with the persistent id `("storage", <Type>Storage,
"0", "cpu", numel)`; dtypes without a typed storage class (float8, uint16/32/64) use
`_rebuild_tensor_v3`, `torch.storage.UntypedStorage` with numel in bytes, and the dtype as the
last argument. `torch.load(weights_only=True)` accepts both.

`Record(dtype, shape)` builds the parts before and after the data: `head`, and `tail(crc)` once
the data's CRC-32 is known (the data may be several buffers: `crc32` folds over them, through
the system's libdeflate where there is one, else zlib). `tensor_record(array)` returns (head,
data, tail) of one array. Only the small byte strings are built; the data is the caller's memory.

What could differ from a record torch writes elsewhere: the first half of the serialization id
is libstdc++'s `std::hash` of the names (the constant here, checked against the installed torch);
a torch built with another C++ library writes other digits there. torch.load reads the id only
to log it (`torch.load.metadata` usage logging), so such a record loads the same.

Invariants:
- `b"".join(tensor_record(a))` equals `torch.save(torch.from_numpy(a))`'s bytes for every
  C-contiguous array of a tenplex dtype on a little-endian host (tests/frameworks/test_dcp_record.py);
- records whose zip needs zip64 fields (over `MAX_DATA` bytes of data) are refused:
  `fits(nbytes)` says which, and the caller saves those with torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import struct
import zlib

import numpy as np

from tenplex.ir.tensor import ITEMSIZE

__all__ = ["MAX_DATA", "Record", "crc32", "fits", "tensor_record"]

_TYPED = {"bool": "Bool", "int8": "Char", "uint8": "Byte", "int16": "Short", "float16": "Half", "bfloat16": "BFloat16",
          "int32": "Int", "float32": "Float", "int64": "Long", "float64": "Double", "complex64": "ComplexFloat",
          "complex128": "ComplexDouble"}  # fmt: skip
_UNTYPED = frozenset({"float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"})
_NAMES_HASH = "15728199511854643026"  # hash of the entry names below, as torch computes it
_ALIGN = 64
_FLAGS = 0x0808  # data descriptor follows; UTF-8 names
MAX_DATA = 0xFFFFFFFF - (1 << 16)  # below this every offset and size fits in 32 bits
_M64 = (1 << 64) - 1


@functools.cache
def libdeflate_crc32() -> ctypes._CFuncPtr | None:
    """libdeflate's `crc32` (carry-less multiply: ~7x zlib's on these hosts), if the system has it;
    looked up at the first large CRC, not at import (`find_library` may run ldconfig)."""
    try:
        lib = ctypes.CDLL("libdeflate.so.0")
    except OSError:
        name = ctypes.util.find_library("deflate")
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            lib = None
    fn = getattr(lib, "libdeflate_crc32", None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    return fn


def crc32(data: np.ndarray, crc: int = 0) -> int:
    """`zlib.crc32(data, crc)` of a C-contiguous uint8 array: the same value, computed by
    libdeflate where the system has it (without the GIL, as ctypes calls are), else by zlib."""
    fn = libdeflate_crc32() if data.nbytes >= 4096 else None
    if fn is None:
        return zlib.crc32(data, crc)
    return fn(crc, data.ctypes.data, data.nbytes)


def fits(nbytes: int) -> bool:
    """Whether a tensor of `nbytes` bytes has a record here (no zip64 fields needed)."""
    return nbytes <= MAX_DATA


def _int(x: int) -> bytes:
    """An int as pickle protocol 2 writes it."""
    if 0 <= x <= 0xFF:
        return b"K" + bytes([x])
    if 0 <= x <= 0xFFFF:
        return b"M" + struct.pack("<H", x)
    if -(1 << 31) <= x < (1 << 31):
        return b"J" + struct.pack("<i", x)
    raw = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


class _Pickle:
    """The few opcodes of torch.save's pickle, memoizing as the pickle module does."""

    def __init__(self) -> None:
        self.out, self.memo = [b"\x80\x02"], 0

    def put(self) -> None:
        self.out.append(b"q" + bytes([self.memo]) if self.memo < 256 else b"r" + struct.pack("<I", self.memo))
        self.memo += 1

    def glob(self, module: str, name: str) -> None:
        self.out.append(b"c" + f"{module}\n{name}\n".encode())
        self.put()

    def text(self, s: str) -> None:
        raw = s.encode()
        self.out.append(b"X" + struct.pack("<I", len(raw)) + raw)
        self.put()

    def ints(self, xs: tuple[int, ...]) -> None:
        if not xs:
            self.out.append(b")")
            return
        self.out.append((b"" if len(xs) <= 3 else b"(") + b"".join(map(_int, xs)) + (b"\x85\x86\x87"[len(xs) - 1 : len(xs)] if len(xs) <= 3 else b"t"))
        self.put()

    def raw(self, op: bytes, memo: bool = False) -> None:
        self.out.append(op)
        if memo:
            self.put()


def _pickle(dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    untyped = dtype in _UNTYPED
    p = _Pickle()
    p.glob("torch._utils", "_rebuild_tensor_v3" if untyped else "_rebuild_tensor_v2")
    p.raw(b"((")
    p.text("storage")
    p.glob(*(("torch.storage", "UntypedStorage") if untyped else ("torch", f"{_TYPED[dtype]}Storage")))
    p.text("0")
    p.text("cpu")
    p.raw(_int(nbytes if untyped else nbytes // ITEMSIZE[dtype]) + b"t", memo=True)
    p.raw(b"Q" + _int(0))
    stride = tuple(math.prod(max(n, 1) for n in shape[d + 1 :]) for d in range(len(shape)))  # as torch: empty dims count 1
    p.ints(tuple(shape))
    p.ints(stride)
    p.raw(b"\x89")
    p.glob("collections", "OrderedDict")
    p.raw(b")R", memo=True)
    if untyped:
        p.glob("torch", dtype)
    p.raw(b"t", memo=True)
    p.raw(b"R", memo=True)
    p.raw(b".")
    return b"".join(p.out)


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64-bit size_t."""
    return (seed ^ (value + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2))) & _M64


def _local(name: bytes, offset: int, size: int) -> bytes:
    """The local header of entry `name` starting at `offset`, padded so its data is aligned."""
    pad = -(offset + 30 + len(name) + 4) % _ALIGN
    extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    flags = _FLAGS if size else _FLAGS & ~8
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(name), len(extra)) + name + extra


def _descriptor(crc: int, size: int) -> bytes:
    return struct.pack("<IIII", 0x08074B50, crc, size, size) if size else b""


def _central(entries: list[tuple[bytes, int, int, int]], offset: int) -> bytes:
    """Central directory (at `offset`) of (name, local offset, crc, size) and the end records."""
    cd = b"".join(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, _FLAGS if size else _FLAGS & ~8, 0, 0, 0, crc, size, size, len(name), 0, 0, 0, 0, 0, at) + name
                  for name, at, crc, size in entries)  # fmt: skip
    n, end = len(entries), offset + len(cd)
    zip64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, end, 1)
    return cd + zip64 + locator + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(cd), offset, 0)


class Record:
    """The record of a tensor of `dtype` and `shape` around its data: `head` goes before the
    data's bytes, `tail(crc)` after them (`crc`: the data's CRC-32, e.g. `zlib.crc32` folded
    over its parts), so the data can be written from several buffers without joining them.

    Raises ValueError for an unknown dtype or data over `MAX_DATA`."""

    def __init__(self, dtype: str, shape: tuple[int, ...]):
        if dtype not in ITEMSIZE:
            raise ValueError(f"no torch.save record for dtype {dtype!r}")
        self.nbytes = math.prod(shape) * ITEMSIZE[dtype]
        if not fits(self.nbytes):
            raise ValueError(f"{self.nbytes} bytes need zip64 fields: save them with torch")
        before = [(b"data.pkl", _pickle(dtype, tuple(shape), self.nbytes)), (b".format_version", b"1"),
                  (b".storage_alignment", b"64"), (b"byteorder", b"little")]  # fmt: skip
        head, self.entries, self.crcs, at = [], [], 0, 0
        for name, raw in before:
            head.append(_entry(b"archive/" + name, raw, at, self.entries))
            self.crcs = _hash_combine(self.crcs, self.entries[-1][2])
            at += len(head[-1])
        head.append(_local(b"archive/data/0", at, self.nbytes))
        self.data_at, self.head = at, b"".join(head)

    def tail(self, crc: int) -> bytes:
        """What follows the data, whose CRC-32 is `crc`."""
        entries = [*self.entries, (b"archive/data/0", self.data_at, crc, self.nbytes)]
        crcs = _hash_combine(self.crcs, crc) if self.nbytes else self.crcs
        tail = [_descriptor(crc, self.nbytes)]
        at = len(self.head) + self.nbytes + len(tail[0])
        tail.append(_entry(b"archive/version", b"3\n", at, entries))
        crcs = _hash_combine(crcs, entries[-1][2])
        at += len(tail[-1])
        tail.append(_entry(b"archive/.data/serialization_id", f"{_NAMES_HASH}{crcs:020d}".encode(), at, entries))
        at += len(tail[-1])
        return b"".join([*tail, _central(entries, at)])


def _entry(name: bytes, raw: bytes, at: int, entries: list) -> bytes:
    """Entry `name` holding `raw` at offset `at`; appends (name, at, crc, size) to `entries`."""
    crc = zlib.crc32(raw)
    entries.append((name, at, crc, len(raw)))
    return _local(name, at, len(raw)) + raw + _descriptor(crc, len(raw))


def tensor_record(array: np.ndarray, dtype: str | None = None) -> tuple[bytes, memoryview, bytes]:
    """(head, data, tail) of `torch.save` of the C-contiguous `array` (see the module
    docstring); `dtype` is its tenplex dtype name (default: the array's numpy name).

    Raises ValueError for a non-contiguous array, an unknown dtype or data over `MAX_DATA`."""
    dtype = dtype or array.dtype.name
    if dtype not in ITEMSIZE or array.dtype.itemsize != ITEMSIZE[dtype]:
        raise ValueError(f"no torch.save record for an array of dtype {array.dtype} as {dtype!r}")
    if not array.flags.c_contiguous:
        raise ValueError("tensor_record needs a C-contiguous array")
    rec = Record(dtype, tuple(array.shape))
    raw = array.reshape(-1).view(np.uint8)
    return rec.head, memoryview(raw) if array.size else memoryview(b""), rec.tail(crc32(raw))
