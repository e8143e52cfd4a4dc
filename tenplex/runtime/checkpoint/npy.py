"""`.npy` files of a checkpoint: read only what the file holds, write so that errors keep their errno.

`load_npy(path, what, error)` reads the header first (`np.lib.format.read_magic`,
`read_array_header_1_0`/`_2_0`) and refuses a header whose shape and dtype need more bytes than
the file has after it, before anything is allocated: a header claiming 10^12 elements is a
one-line error, not a MemoryError. The file must be a regular file (`tenplex.ir.files.open_regular`).

`write_npy(f, array)` writes the `.npy` header and the array's bytes through `f.write` (numpy's
own `tofile` reports a full disk as "4096 requested and 992 written", without an errno); the
bytes are those `np.save` writes, except the header of a bfloat16 or float8 array.

bfloat16 and float8 (`NAMED`): the header's `descr` is the dtype's name (`'bfloat16'`,
`'float8_e4m3fn'`, `'float8_e5m2'`), which `np.load` turns into that dtype where ml_dtypes is
imported and refuses ("descr is not a valid dtype descriptor: 'bfloat16'") where it is not:
never the silent uint16 that `np.save`'s `'<V2'` or the raw bits of older tenplex versions
give. Files written by tenplex before this hold the raw bits (`<u2`, `|u1`); `as_dtype`
accepts them where the manifest or ptc.json names the real dtype.

Invariants:
- `load_npy` never allocates more than the file's size, never unpickles (object dtypes refused);
- every read error is `error(message)` naming the file and `what` it holds;
- `load_npy(write_npy(a))` has `a`'s dtype, shape and bytes, for every dtype `NAMED` too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import BinaryIO

import ml_dtypes  # noqa: F401 (registers the NAMED dtypes with numpy, so headers naming them parse)
import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.ir.files import one_line, open_regular, read_npy_header
from tenplex.runtime.arrays import EXTRA_DTYPES, npy_descr

__all__ = ["NAMED", "as_dtype", "load_npy", "npy_descr", "write_npy"]

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
        size = os.fstat(f.fileno()).st_size
        try:
            shape, _, dtype = read_npy_header(f)
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
        f.seek(0)
        try:
            return _fmt.read_array(f, allow_pickle=False)
        except (ValueError, EOFError, OSError) as e:
            raise error(f"{path}: not a readable .npy file ({what}): {one_line(e)}") from None


def write_npy(f: BinaryIO, array: np.ndarray) -> None:
    """Write `array` as a `.npy` file into the open binary file `f` (see the module docstring)."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    header = {"descr": npy_descr(a.dtype), "fortran_order": False, "shape": a.shape}
    try:
        _fmt.write_array_header_1_0(f, header)
    except ValueError:  # a header past 64 KiB needs format 2.0, as np.save would choose
        _fmt.write_array_header_2_0(f, header)
    if a.size:
        f.write(memoryview(a.reshape(-1).view(np.uint8)))
