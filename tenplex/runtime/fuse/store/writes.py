"""The write half of the FUSE view's operations (`StoreFS`): files and directory changes.

Writes: creating or opening `<name>.npy` (or `<name>.json`) for writing buffers the bytes in
memory; each close parses the buffer (`parse_npy` or `json`) and stores the leaf at `<name>`,
replacing any old one. Other file names cannot be created (EPERM). `mkdir` makes a directory that
lives only in this view until a leaf is written under it (the store has no empty directories of
its own); `unlink`/`rmdir` (empty directories only) map to `store.delete`, `rename` to
`store.rename`. With `read_only`, every change fails with EROFS. A `.npy` whose header names
bfloat16 or float8 is stored with that dtype; raw bits (`<u2`, `|u1`) or the opaque `|V2`/`|V1`
that `np.save` writes for an ml_dtypes array, written over a bfloat16/float8 leaf, keep the
leaf's dtype.

`Writes` is mixed into `StoreFS` and uses its path resolution (`_store_path`, `_kind`, `_need`,
`_file`, `_writable`), handle table (`_handles`, `_add`, `_lock`) and view state (`_dirs`,
`_rewritten`).

Invariants: a close that fails to parse returns EINVAL and leaves the store unchanged; with
`read_only`, no operation changes the store.
"""

from __future__ import annotations

import contextlib
import errno
import os

import numpy as np

from tenplex.runtime.arrays import np_dtype, npy_dtype
from tenplex.runtime.fuse.npy import Handle
from tenplex.runtime.store.tree import StoreError

__all__ = ["JSON", "NPY", "Writes", "oserror"]

NPY, JSON = ".npy", ".json"


def oserror(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


class Writes:
    """`create`, `write`, `truncate`, `flush`, the commit on close, and the namespace changes of `StoreFS`."""

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        self._writable(path)
        if not path.endswith((NPY, JSON)) or path.endswith(("/" + NPY, "/" + JSON)):
            raise oserror(errno.EPERM, f"{path}: only <name>.npy and <name>.json files can be created")
        return self._add(Handle(path, buf=bytearray(), writer=True, dirty=True))

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self._handles[fh]
        self._materialize(h)
        h.write(data, offset)
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._writable(path)
        with self._lock:
            handles = [h for h in self._handles.values() if h.writer and h.path == path]
        if not handles:
            raise oserror(errno.EPERM, f"{path}: truncate a file only while it is open for writing")
        for h in handles:
            if length == 0:
                h.buf = bytearray()  # skip copying the old contents of a file about to be rewritten
            self._materialize(h)
            h.truncate(length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        h = self._handles[fh]
        if h.writer and h.dirty:
            self._commit(h)
        return 0

    def _materialize(self, h: Handle) -> None:
        if h.buf is None:  # opened for writing without O_TRUNC: start from the current bytes
            f = self._file(h.path)
            h.buf = bytearray(f.read(f.size, 0))

    def _commit(self, h: Handle) -> None:
        sp = self._store_path(h.path)
        try:
            data = h.parse()
            if isinstance(data, np.ndarray):
                data = self._keep_raw_dtype(sp, data)
            self.store.put(sp, data, replace=True)
        except (ValueError, UnicodeDecodeError, StoreError) as e:
            raise oserror(errno.EINVAL, f"{h.path}: {e}") from None
        h.dirty = False
        with self._lock:
            self._rewritten.add(h.path)

    def _keep_raw_dtype(self, sp: str, array: np.ndarray) -> np.ndarray:
        """Raw bits written over a bfloat16/float8 leaf stay that dtype (see module doc)."""
        with contextlib.suppress(StoreError):
            meta = self.store.meta(sp)
            old = np_dtype(meta.dtype) if meta.kind == "array" else None
            raw = () if old is None or npy_dtype(old) == old else (npy_dtype(old), np.dtype(f"V{old.itemsize}"))
            if array.dtype in raw:
                return array.view(old)
        return array

    # -- namespace ---------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int) -> int:
        self._writable(path)
        if self._kind(path) is not None:
            raise oserror(errno.EEXIST, path)
        with self._lock:
            self._dirs.add(path)
        return 0

    def unlink(self, path: str) -> int:
        self._writable(path)
        if self._need(path) not in ("array", "value"):
            raise oserror(errno.EISDIR if self._kind(path) == "dir" else errno.EBUSY, path)
        self.store.delete(self._store_path(path))
        return 0

    def rmdir(self, path: str) -> int:
        self._writable(path)
        if self._need(path) != "dir":
            raise oserror(errno.ENOTDIR, path)
        if path == "/":
            raise oserror(errno.EBUSY, "the mount root cannot be removed")
        if len(self.readdir(path, 0)) > 2:
            raise oserror(errno.ENOTEMPTY, path)
        with self._lock:
            self._dirs.discard(path)
        with contextlib.suppress(StoreError):
            self.store.delete(self._store_path(path, strip=False))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._writable(old)
        kind = self._need(old)
        strip = kind != "dir"
        if (
            kind == "pending"
            or (strip and old.endswith(NPY) != new.endswith(NPY))
            or (strip and not new.endswith((NPY, JSON)))
        ):
            raise oserror(errno.EPERM, f"cannot rename {old} to {new}: keep the suffix and close the file first")
        try:
            self.store.rename(self._store_path(old, strip), self._store_path(new, strip), replace=True)
        except StoreError as e:
            raise oserror(errno.EINVAL, str(e)) from None
        with self._lock:  # the kernel moves cached pages with the file
            self._rewritten |= {new + p[len(old) :] for p in self._rewritten if p == old or p.startswith(old + "/")}
        return 0
