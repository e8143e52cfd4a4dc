"""The bytes of a leaf's file in the FUSE view (`tenplex.runtime.fuse.store`), and parsing them back.

An open file is a `Handle`: a reader's `NpyFile`, or a writer's buffered bytes that `parse` turns
back into a leaf when the file is closed. An array leaf is served as a `.npy` (format 1.0, numpy's
own header for its dtype and shape; for bfloat16 and float8 a header whose `descr` is the dtype's
name, `'bfloat16'`, so that `np.load` returns that dtype where ml_dtypes is imported and refuses
the file where it is not, instead of returning raw uint16 bits) whose data bytes come straight
from the stored array: `NpyFile.segments` names a byte range as views of the header and of the
array's memory (no copy) for C- or Fortran-contiguous arrays, which the mount splices into the
kernel's reply (`fuse.splice`), and copies just the elements that cover the range of a strided
view. A value leaf is its JSON plus a newline. A leaf that the store holds as a `.npy` image
(`store.image`: a memory file holding exactly these bytes) names it as `NpyFile.image`, which a
read-only mount hands the kernel instead (FUSE passthrough, `fuse.session`).

`load_npy` is the reader's side: `numpy.load` for a file of the view, faster for large arrays
because it reads with O_DIRECT, which FUSE serves straight into the array's memory (no page
cache, one copy in all, as a tmpfs read; see bench/results/fuse.md).

Invariants:
- a file's bytes are exactly what `np.save` (`json.dumps` + newline) writes for the leaf, but for
  the `descr` of the `NAMED` dtypes;
- `read(size, offset)` and `segments(size, offset)` serve the same bytes, and so does `image`
  where it is set (`store.image.is_image` checked it against the header and the array);
- `parse_npy` returns a C- or F-contiguous array and rejects truncated, oversized, object-dtype
  or unsupported-version `.npy` bytes with a ValueError that says which.
"""

from __future__ import annotations

import errno
import io
import json
import os
from typing import Any

import attrs
import ml_dtypes  # noqa: F401 (registers the NAMED dtypes with numpy, so headers naming them parse)
import numpy as np

from tenplex.runtime.arrays import EXTRA_DTYPES, npy_descr, npy_header
from tenplex.runtime.store.image import is_image

__all__ = ["NAMED", "Handle", "NpyFile", "load_npy", "npy_descr", "parse_npy"]

NAMED = EXTRA_DTYPES  # the dtypes whose header names them (`runtime.arrays.npy_descr`)


@attrs.frozen
class NpyFile:
    """The bytes of one leaf's file: a header and the data bytes of `array` in file order.

    `address` is where the data bytes start in memory when they are one contiguous run (C- or
    Fortran-contiguous `array`), else None. `array` keeps that memory alive.
    """

    header: bytes
    array: np.ndarray | None  # None for a JSON value (all bytes are in `header`)
    address: int | None = None
    image: Any = None  # the leaf's `store.image` memory file when it holds exactly these bytes

    @classmethod
    def from_leaf(cls, data: np.ndarray | object, shared: tuple[Any, int] | None = None) -> NpyFile:
        """The file of a leaf; `shared` is where the store holds it (`TensorStore.shared`), which
        makes it the file's `image` when that memory file holds exactly the file's bytes."""
        if not isinstance(data, np.ndarray):
            return cls((json.dumps(data) + "\n").encode(), None)
        array = data
        fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
        header = npy_header(array.dtype, array.shape, fortran)
        contiguous = array.flags.c_contiguous or array.flags.f_contiguous
        address = array.__array_interface__["data"][0] if contiguous and array.size else None
        image = shared[0] if shared is not None and is_image(shared[0], shared[1], header, address, array.nbytes) else None
        return cls(header, array, address, image)

    @property
    def size(self) -> int:
        return len(self.header) + (0 if self.array is None else self.array.nbytes)

    def read(self, size: int, offset: int) -> bytes:
        h, stop = len(self.header), min(offset + size, self.size)
        head = self.header[offset:stop] if offset < h else b""
        if stop <= max(offset, h):
            return head
        body = self._data(max(offset - h, 0), stop - h)
        return head + body if head else body

    def segments(self, size: int, offset: int) -> list[bytes | np.ndarray]:
        """Bytes [offset, offset + size) of the file (cut at its end) as views of the header and
        of the array's memory where it is contiguous (`fuse.splice` segments; copies otherwise)."""
        h, stop = len(self.header), min(offset + size, self.size)
        out: list[bytes | np.ndarray] = [self.header[offset : min(stop, h)]] if offset < h else []
        if stop > max(offset, h):
            start = max(offset - h, 0)
            if self.address is not None:
                out.append(self._flat[start : stop - h])
            else:
                out.append(self._data(start, stop - h))
        return out

    @property
    def _flat(self) -> np.ndarray:
        a = self.array
        return (a if a.flags.c_contiguous else a.T).reshape(-1).view(np.uint8)

    def _data(self, start: int, stop: int) -> bytes:
        a = self.array
        if a.flags.c_contiguous or a.flags.f_contiguous:
            return self._flat[start:stop].tobytes()
        size = a.itemsize  # strided view: copy just the elements that cover [start, stop)
        first, last = start // size, -(-stop // size)
        run = np.ascontiguousarray(a.flat[first:last]).view(np.uint8)
        return run[start - first * size : stop - first * size].tobytes()


@attrs.define
class Handle:
    """An open file of the view: a reader's `file`, or a writer's bytes in `buf`."""

    path: str  # mount path
    file: NpyFile | None = None  # what a reader reads
    buf: bytearray | None = None  # a writer's bytes; None until filled from the old file
    writer: bool = False
    dirty: bool = False

    def write(self, data: bytes, offset: int) -> None:
        if offset > len(self.buf):
            self.buf.extend(bytes(offset - len(self.buf)))
        self.buf[offset : offset + len(data)] = data
        self.dirty = True

    def truncate(self, length: int) -> None:
        del self.buf[length:]
        self.buf.extend(bytes(length - len(self.buf)))
        self.dirty = True

    def parse(self) -> np.ndarray | object:
        """The leaf a writer's bytes hold. Raises: ValueError or UnicodeDecodeError if malformed."""
        return parse_npy(self.buf) if self.path.endswith(".npy") else json.loads(self.buf.decode())


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """`numpy.load(path)` of a non-object `.npy`, read with O_DIRECT straight into the array (module
    doc); where O_DIRECT is refused (a file system without it, or unaligned), plain `numpy.load`.

    Raises: OSError, or ValueError for a truncated or malformed file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        with open(fd, "rb", buffering=0) as f:
            shape, fortran, dtype = _read_header(f)
            array = np.empty(int(np.prod(shape, dtype=np.int64)), dtype)
            dst, n = memoryview(array.view(np.uint8)), 0
            while n < len(dst):
                if not (k := f.readinto(dst[n:])):
                    raise ValueError(f"{path}: {n} data bytes for shape {shape} of {dtype} (needs {len(dst)})")
                n += k
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return np.load(path, allow_pickle=False)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _read_header(f: io.RawIOBase) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
    shape, fortran, dtype = readers[version](f)
    if dtype.hasobject:
        raise ValueError(f"object arrays ({dtype}) cannot be stored")
    return shape, fortran, dtype


def parse_npy(buf: bytes | bytearray) -> np.ndarray:
    """The array in `.npy` bytes, C- or F-contiguous, viewing `buf` where aligned.

    Raises: ValueError if the bytes are not a complete `.npy` of a non-object dtype.
    """
    f = io.BytesIO(buf)
    shape, fortran, dtype = _read_header(f)
    count = int(np.prod(shape, dtype=np.int64))
    if len(buf) - f.tell() != count * dtype.itemsize:
        raise ValueError(
            f"{len(buf) - f.tell()} data bytes for shape {shape} of {dtype} (needs {count * dtype.itemsize})"
        )
    flat = np.frombuffer(buf, dtype=dtype, count=count, offset=f.tell())
    array = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    return array if array.flags.aligned else array.copy(order="K")
