"""`.npy` files of a checkpoint: read only what the file holds, write so that errors keep their errno.

`load_npy(path, what, error)` reads the header first (`np.lib.format.read_magic`,
`read_array_header_1_0`/`_2_0`) and refuses a header whose shape and dtype need more bytes than
the file has after it, before anything is allocated: a header claiming 10^12 elements is a
one-line error, not a MemoryError. The file must be a regular file (`tenplex.ir.files.open_regular`).
`map_npy` checks the same and returns a read-only view of the memory-mapped file instead of a
copy: opening a checkpoint reads no data, and a reshard reads only the pages it copies.

`write_npy(f, array)` writes the `.npy` header and the array's bytes through `f.write` (numpy's
own `tofile` reports a full disk as "4096 requested and 992 written", without an errno); the
bytes are those `np.save` writes, except the header of a bfloat16 or float8 array. `npy_header`
is that header alone, for writers that place the data themselves (`checkpoint.planned`).

bfloat16 and float8 (`NAMED`): the header's `descr` is the dtype's name (`'bfloat16'`,
`'float8_e4m3fn'`, `'float8_e5m2'`), which `np.load` turns into that dtype where ml_dtypes is
imported and refuses ("descr is not a valid dtype descriptor: 'bfloat16'") where it is not:
never the silent uint16 that `np.save`'s `'<V2'` or the raw bits of older tenplex versions
give. Files written by tenplex before this hold the raw bits (`<u2`, `|u1`); `as_dtype`
accepts them where the manifest or ptc.json names the real dtype.

Invariants:
- `load_npy` never allocates more than the file's size, `map_npy` never maps a header the file
  cannot hold; neither unpickles (object dtypes refused);
- every read error is `error(message)` naming the file and `what` it holds;
- `load_npy(write_npy(a))` has `a`'s dtype, shape and bytes, for every dtype `NAMED` too.
"""

from __future__ import annotations

import io
import math
import mmap
import os
from pathlib import Path
from typing import BinaryIO

import ml_dtypes  # noqa: F401 (registers the NAMED dtypes with numpy, so headers naming them parse)
import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import one_line, open_regular, regular_fd
from tenplex.ir.npy_header import read_npy_header
from tenplex.runtime.arrays import EXTRA_DTYPES, npy_descr, npy_header

__all__ = ["NAMED", "as_dtype", "load_npy", "map_npy", "mapped_file", "npy_descr", "npy_header", "pwrite_all", "write_npy"]

NAMED = EXTRA_DTYPES  # no numpy descr: the header names them (`runtime.arrays.npy_descr`)
_fmt = np.lib.format


def as_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """`array` (as a file held it) as `dtype`, or None when the file holds something else. A
    `NAMED` dtype is also accepted as the same-width raw bits that older versions wrote."""
    if array.dtype == dtype:
        return array
    if dtype.name in NAMED and array.dtype == np.dtype(f"u{dtype.itemsize}"):
        return array.view(dtype)
    return None


def load_npy(path: Path, what: str, error: type[TenplexError]) -> np.ndarray:
    """The array in `.npy` file `path` (see the module docstring)."""
    with open_regular(path, what, error) as f:
        _checked_header(f, os.fstat(f.fileno()).st_size, path, what, error)
        f.seek(0)
        try:
            return _fmt.read_array(f, allow_pickle=False)
        except (ValueError, EOFError, OSError) as e:
            raise error(f"{path}: not a readable .npy file ({what}): {one_line(e)}") from None


def map_npy(path: Path, what: str, error: type[TenplexError]) -> np.ndarray:
    """The array in `.npy` file `path` as a read-only view of the memory-mapped file: nothing is
    read until used, and a copy out of it reads only the pages it touches (`mapped_file` finds
    the file again). Checked as `load_npy` checks (the header must fit the file); the file must
    not shrink while the view is in use."""
    fd, size = regular_fd(path, what, error)
    try:
        shape, fortran, dtype, offset = _header_at(fd, size, path, what, error)
        count = math.prod(shape)
        if count == 0:
            return np.empty(shape, dtype)
        try:
            mapped = _Mapped(fd, 0, prot=mmap.PROT_READ)
        except OSError as e:
            raise error(f"{path}: cannot map ({what}): {e.strerror or e}") from None
    finally:
        os.close(fd)
    flat = np.frombuffer(mapped, dtype, count, offset)
    mapped.path, mapped.address = path, flat.ctypes.data - offset
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


class _Mapped(mmap.mmap):
    """A file mapping that knows its file and where it is mapped (the base of `map_npy`'s arrays)."""

    path: Path
    address: int


def mapped_file(a: np.ndarray) -> tuple[Path, int] | None:
    """(file, byte offset of `a`'s first element in it) for a view of an array `map_npy`
    returned; None for any other array."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    mapped = base.obj if isinstance(base, memoryview) else base  # np.frombuffer keeps a memoryview
    if not isinstance(mapped, _Mapped):
        return None
    return mapped.path, a.ctypes.data - mapped.address


_HEAD = 4096  # bytes read at once for a header: numpy's are 128 for a checkpoint's shapes


def _header_at(fd: int, size: int, path: Path, what: str, error: type[TenplexError]) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) of the `.npy` file open at `fd` (`size`
    bytes), as `_checked_header` checks them: from one `pread` where the header fits in it
    (no file object, no seeks: ~25 us less a file), else from a file object as `load_npy` reads."""
    head = os.pread(fd, _HEAD, 0)
    n = {b"\x93NUMPY\x01\x00": 10, b"\x93NUMPY\x02\x00": 12}.get(head[:8], len(head) + 1)  # the length field's end
    if n <= len(head) and n + int.from_bytes(head[8:n], "little") <= len(head):
        f: BinaryIO = io.BytesIO(head)
        return (*_checked_header(f, size, path, what, error), f.tell())
    with os.fdopen(os.dup(fd), "rb") as f:
        return (*_checked_header(f, size, path, what, error), f.tell())


def _checked_header(f: BinaryIO, size: int, path: Path, what: str, error: type[TenplexError]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the header at `f` (the start of a file of `size` bytes),
    leaving `f` at the data; raises `error` unless the file holds numbers and at least the
    bytes the header claims."""
    try:
        shape, fortran, dtype = read_npy_header(f)
    except ValueError as e:
        raise error(f"{path}: not a readable .npy file ({what}): {one_line(e)}") from None
    if dtype.hasobject:
        raise error(f"{path}: holds Python objects (dtype {dtype}), not numbers ({what})")
    if any(n < 0 for n in shape):
        raise error(f"{path}: header shape {list(shape)} has a negative size ({what})")
    need, have = math.prod(shape) * dtype.itemsize, size - f.tell()
    if need > have:
        raise error(f"{path}: header claims {dtype}{list(shape)} ({need} bytes) but the file holds {have} bytes "
                    f"of data ({what})")  # fmt: skip
    return shape, fortran, dtype


def write_npy(f: BinaryIO, array: np.ndarray) -> None:
    """Write `array` as a `.npy` file into the open binary file `f` (see the module docstring)."""
    a = np.asarray(array)
    f.write(npy_header(a.dtype, a.shape))
    if a.size:
        f.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """All of `data` at `offset` (`os.pwrite` may write less than asked)."""
    view_ = memoryview(data)
    while view_.nbytes:
        n = os.pwrite(fd, view_, offset)
        view_, offset = view_[n:], offset + n
