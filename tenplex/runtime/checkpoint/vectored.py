"""A strided array's bytes into a file without gathering them first: `pwritev(2)` of its runs.

A column block of a src file (`a[:, 512:1024]` of a mapped `.npy`) is many runs of bytes, one
per row. Gathering them into a buffer and writing that copies every byte twice (the second time
in the kernel); `write_runs(fd, a, at)` hands the kernel the runs themselves (`iovec`s built
with numpy, up to `IOV_MAX` per call, the call made through ctypes with the GIL released), so
each byte is copied once, from the mapped src page into the file.

`runs(a)` is the decomposition: the start address of each run in C order and the run's length
(the trailing dimensions that are contiguous). Arrays whose runs are shorter than `MIN_RUN` are
left to the caller (a gather is cheaper than an iovec per few bytes).

Invariants: `write_runs` writes exactly `a.nbytes` bytes at `at`, in `a`'s C order, or raises
OSError with the errno of the failed write (a short write is continued, `EINTR` retried).
"""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

__all__ = ["MIN_RUN", "runs", "write_runs"]

IOV_MAX = 1024  # Linux's limit of iovecs per call
MIN_RUN = 1024  # bytes; shorter runs are gathered by the caller (an iovec each cost more, measured)
_IOVEC = np.dtype([("base", np.uintp), ("len", np.uintp)])


def _libc_pwritev():
    try:
        fn = ctypes.CDLL(None, use_errno=True).pwritev
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong]
    fn.restype = ctypes.c_ssize_t
    return fn


_pwritev = _libc_pwritev()


def runs(a: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(start address of each run of `a` in C order, run length in bytes), or None where there
    is no `pwritev` or the runs are shorter than `MIN_RUN`."""
    run, k = a.itemsize, a.ndim
    while k > 0 and (a.shape[k - 1] == 1 or a.strides[k - 1] == run):
        run, k = run * a.shape[k - 1], k - 1
    if _pwritev is None or run < MIN_RUN or a.size == 0:
        return None
    offsets = np.zeros(1, np.intp)
    for n, stride in zip(a.shape[:k], a.strides[:k]):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.intp) * stride).reshape(-1)
    return offsets + a.ctypes.data, run


def write_runs(fd: int, starts: np.ndarray, run: int, at: int) -> None:
    """Write the runs (`runs(a)`) at `at` in `fd`, in order. Raises OSError."""
    iov = np.empty(len(starts), _IOVEC)
    iov["base"], iov["len"] = starts, run
    total, done = len(starts) * run, 0
    while done < total:
        i, part = divmod(done, run)
        if part:  # a short write stopped inside run i: continue from its middle
            iov[i] = (starts[i] + part, run - part)
        n = _pwritev(fd, iov[i:].ctypes.data, min(IOV_MAX, len(iov) - i), at + done)
        if n < 0:
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            raise OSError(code, os.strerror(code))
        if n == 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        done += n
