"""`read_npy_header(f)`: (shape, fortran order, dtype) of a `.npy` header, none of it trusted.

The header numpy (and tenplex) writes is matched by one regular expression (~12 us); any other
is left to numpy's own parser (`ast.literal_eval` after a tokenizer pass, ~90 us a header), so
what is accepted and every error are numpy's. Headers longer than numpy's `max_header_size` go
to numpy, which refuses them.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["read_npy_header"]

_NPY_DICT = re.compile(r"\{'descr': '([^'\\]+)', 'fortran_order': (True|False), 'shape': \((|\d+,|\d+(?:, \d+)+)\), \} *\n")
_NPY_MAX_HEADER = 10000  # numpy's own limit (`max_header_size`) on what it parses


def read_npy_header(f: Any) -> tuple[tuple[int, ...], bool, Any]:
    """(shape, fortran order, dtype) of the `.npy` header at `f`'s position (format 1.0 or 2.0),
    leaving `f` at the data. Raises ValueError for anything else, whatever numpy's parser raised
    (it raises ValueError, SyntaxError, TokenError, ... on a malformed header)."""
    import numpy as np

    fast = _canonical_npy_header(f)
    if fast is not None:
        return fast
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        return read(f)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 (see the docstring)
        raise ValueError(f"{type(e).__name__}: {e}") from None


def _canonical_npy_header(f: Any) -> tuple[tuple[int, ...], bool, Any] | None:
    """`read_npy_header`'s answer for a header in numpy's own spelling, `f` left at the data;
    None (and `f` where it was) for any other header."""
    import numpy as np

    start = f.tell()
    magic = f.read(8)
    size = {b"\x93NUMPY\x01\x00": 2, b"\x93NUMPY\x02\x00": 4}.get(magic, 0)
    n = int.from_bytes(f.read(size), "little") if size else _NPY_MAX_HEADER + 1
    m = _NPY_DICT.fullmatch(f.read(n).decode("latin1")) if n <= _NPY_MAX_HEADER else None
    if m is None or f.tell() != start + 8 + size + n:
        f.seek(start)
        return None
    try:
        dtype = np.dtype(m[1])
    except TypeError:  # not a dtype: numpy's parser says so in its words
        f.seek(start)
        return None
    return tuple(int(d) for d in m[3].replace(",", " ").split()), m[2] == "True", dtype
