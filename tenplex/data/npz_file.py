"""Reading an `.npz` archive that may be truncated, corrupt or lying: the dataset index's file.

`read_npz(path)` returns the archive's arrays by name (`.npy` suffix dropped), never unpickling.

Invariants:
- only a regular file is opened (symlinks followed): a FIFO or a device such as /dev/zero is
  refused before a byte is read;
- a member's `.npy` header is checked against the member's size before its array is allocated:
  a header that claims more bytes than the member holds (10^12 elements in 64 bytes) is refused,
  and so is a member larger than its compressed bytes can inflate to (deflate: 1032 to 1);
- every failure (not a zip, truncated, a bad CRC, a bad header, an object dtype) is one
  `NpzError` line saying what is wrong; the caller names the file.
"""

from __future__ import annotations

import os
import stat
import zipfile
import zlib
from typing import IO

import numpy as np

from tenplex.data.errors import DataError
from tenplex.ir.npy_header import read_npy_header

MAX_INFLATION = 1032  # deflate's largest ratio of output to input


class NpzError(DataError):
    """An `.npz` archive cannot be read; the message says why (the caller adds the path)."""


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of the `.npz` archive at `path`. Raises NpzError (module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise NpzError(e.strerror or str(e)) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NpzError("not a regular file")
        try:
            with zipfile.ZipFile(f) as z:
                return {_name(info.filename): _member(z, info) for info in z.infolist()}
        except NpzError:
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
            raise NpzError(f"not a complete .npz archive ({e})") from None


def _name(member: str) -> str:
    return member.removesuffix(".npy")


def _member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    with z.open(info) as f:
        dtype, shape, order, header = _header(f, info.filename)
        claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
        held = info.file_size - header
        if info.file_size > MAX_INFLATION * info.compress_size + 1024:
            raise NpzError(f"{info.filename}: claims {info.file_size} bytes from {info.compress_size} compressed")
        if claimed != held:
            raise NpzError(f"{info.filename}: its header claims {claimed} bytes of data, the member holds {held}")
        array = np.frombuffer(f.read(held), dtype=dtype)
    return array.reshape(shape, order="F" if order else "C")


def _header(f: IO[bytes], name: str) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran order, header length) of the `.npy` member `name`."""
    try:
        shape, fortran, dtype = read_npy_header(f)
    except ValueError as e:
        raise NpzError(f"{name}: not an .npy member ({e})") from None
    if dtype.hasobject:
        raise NpzError(f"{name}: holds Python objects (dtype {dtype}), which are never unpickled")
    return dtype, shape, fortran, f.tell()
