"""`.npy` and `.npz` sample files: an `.npy` file is one sample (the whole file); an `.npz` file
is one or more concatenated archives, one sample each (see `npz_stream`).

Invariants checked for an `.npy` file: the magic and header parse, the dtype holds no Python
objects, and the file size equals the header length plus shape x itemsize.

Raises: `DataError` naming the file.
"""

from __future__ import annotations

import math
from typing import BinaryIO

import numpy as np

from tenplex.data.errors import DataError
from tenplex.data.formats.npz_stream import scan_npz_stream

NPY_MAGIC = b"\x93NUMPY"
SUFFIXES = (".npy", ".npz")


def _npy_header(f: BinaryIO, location: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            shape, _, dtype = np.lib.format._read_array_header(f, version)
    except (ValueError, SyntaxError, EOFError) as e:
        raise DataError(f"{location}: not a .npy file: {e}") from None
    if dtype.hasobject:
        raise DataError(f"{location}: dtype {dtype} holds Python objects (pickles are not loaded)")
    return shape, dtype


def scan_npy(f: BinaryIO, location: str, size: int) -> tuple[list[int], list[int]]:
    """One sample: the whole `.npy` file, after checking that its header matches its size."""
    shape, dtype = _npy_header(f, location)
    expected = f.tell() + math.prod(shape) * dtype.itemsize
    if expected != size:
        raise DataError(
            f"{location}: header says shape {list(shape)} of {dtype} ({expected} bytes in all), the file has {size}"
        )
    return [0], [size]


def scan_numpy(f: BinaryIO, location: str, size: int) -> tuple[list[int], list[int]]:
    """By content: `.npy` magic gives one sample, a zip signature gives concatenated archives."""
    head = f.read(6)
    f.seek(0)
    if head == NPY_MAGIC:
        return scan_npy(f, location, size)
    if head[:2] == b"PK":
        return scan_npz_stream(f, location, size)
    raise DataError(f"{location}: neither .npy (magic {NPY_MAGIC!r}) nor .npz (zip 'PK'): starts with {head!r}")
