"""The file system operations of the FUSE view (`StoreFS`): a TensorStore as a directory tree.

Layout: store directories are directories; an array leaf `<name>` is the file `<name>.npy` (see
`fuse.npy`: a `.npy` that `numpy.load` reads, also with `mmap_mode="r"`); a value leaf is
`<name>.json` holding its JSON. A bfloat16 or float8 leaf's header names its dtype (`descr:
'bfloat16'`, as `tenplex.save` writes them): `np.load` returns that dtype where ml_dtypes is
imported and refuses the file where it is not. `getxattr(path, "user.tenplex.dtype")` names the
stored dtype. Writing such a `.npy` over the leaf stores it as it is; writing raw bits in the
unsigned integer of the same width (`<u2`, `|u1`: how older versions served these leaves) over
it keeps the leaf's dtype, so read-modify-write round trips are exact either way.

Writes: `writes.Writes` (buffered in memory, stored on close; `read_only` refuses them with EROFS).

Page cache: with `keep_cache`, an open for reading keeps the file's cached pages unless the
file was rewritten through this view since its last open that dropped them; use it only when
nothing but this view changes the store (else a reader may see old bytes).

Invariants:
- a close that fails to parse returns EINVAL and leaves the store unchanged;
- a read serves the bytes of the leaf as it was when the file was opened (a handle holds it);
- with `read_only`, no operation changes the store.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
import time

from tenplex.runtime.fuse.npy import Handle, NpyFile
from tenplex.runtime.fuse.store.writes import JSON, NPY, Writes, oserror
from tenplex.runtime.store.tree import StoreError, TensorStore

__all__ = ["DTYPE_XATTR", "StoreFS"]

DTYPE_XATTR = "user.tenplex.dtype"


class StoreFS(Writes):
    """mfusepy operations over `store` rooted at `prefix` (see module doc). Thread-safe."""

    use_ns = True

    def __init__(self, store: TensorStore, prefix: str = "/", *, read_only: bool = False,
                 keep_cache: bool = False) -> None:  # fmt: skip
        self.store, self.prefix = store, prefix.rstrip("/")
        self.read_only, self.keep_cache = read_only, keep_cache
        self._handles: dict[int, Handle] = {}
        self._dirs: set[str] = set()  # mkdir'ed mount paths not (yet) in the store
        self._rewritten: set[str] = set()  # mount paths whose kernel page cache may be stale
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._time = time.time_ns()

    # -- paths ---------------------------------------------------------------------------------

    def _store_path(self, path: str, strip: bool = True) -> str:
        suffix = next((s for s in (NPY, JSON) if strip and path.endswith(s)), "")
        return (self.prefix + path[: len(path) - len(suffix)]) or "/"

    def _kind(self, path: str) -> str | None:
        """'dir', 'array', 'value' or 'pending' (a file being written) for a mount path, else None."""
        with self._lock:
            if path in self._dirs or any(d.startswith(path.rstrip("/") + "/") for d in self._dirs):
                return "dir"
            if any(h.writer and h.path == path for h in self._handles.values()):
                return "pending"
        try:
            if self.store.exists(self._store_path(path, strip=False)):
                with contextlib.suppress(StoreError):
                    self.store.meta(self._store_path(path, strip=False))
                    return None  # a leaf shows only under its suffixed name
                return "dir"
            want = "array" if path.endswith(NPY) else "value" if path.endswith(JSON) else None
            if want is not None and self.store.exists(sp := self._store_path(path)):
                return want if self.store.meta(sp).kind == want else None
        except StoreError:
            return None
        return None

    def _file(self, path: str, image: bool = False) -> NpyFile:
        """The file at `path`; with `image`, also whether a memory file holds its bytes exactly
        (`NpyFile.image`: only an open needs it, not a size)."""
        try:
            sp = self._store_path(path)
            return NpyFile.from_leaf(self.store.get(sp), self.store.shared(sp) if image else None)
        except StoreError:
            raise oserror(errno.ENOENT, path) from None

    def _need(self, path: str) -> str:
        kind = self._kind(path)
        if kind is None:
            raise oserror(errno.ENOENT, path)
        return kind

    def _writable(self, path: str) -> None:
        if self.read_only:
            raise oserror(errno.EROFS, path)

    # -- metadata ------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict:
        kind = self._need(path)
        t = {"st_atime": self._time, "st_mtime": self._time, "st_ctime": self._time}
        ids = {"st_uid": os.getuid(), "st_gid": os.getgid()}
        if kind == "dir":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, **t, **ids}
        return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": self._size(path), **t, **ids}

    def _size(self, path: str) -> int:
        with self._lock:
            for h in self._handles.values():
                if h.writer and h.path == path and h.buf is not None:
                    return len(h.buf)
        return self._file(path).size

    def readdir(self, path: str, fh: int) -> list[str]:
        if self._need(path) != "dir":
            raise oserror(errno.ENOTDIR, path)
        sp, names = self._store_path(path, strip=False), set()
        with contextlib.suppress(StoreError):
            for name in self.store.list(sp):
                child = sp.rstrip("/") + "/" + name
                kind = "dir" if not _is_leaf(self.store, child) else self.store.meta(child).kind
                names.add(name + {"dir": "", "array": NPY, "value": JSON}[kind])
        base = path.rstrip("/") + "/"
        with self._lock:
            extra = [p for p in self._dirs | {h.path for h in self._handles.values() if h.writer}]
        names.update(p[len(base) :].split("/")[0] for p in extra if p.startswith(base))
        return [".", "..", *sorted(names)]

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if name == DTYPE_XATTR and self._need(path) == "array":
            return self.store.meta(self._store_path(path)).dtype.encode()
        raise oserror(errno.ENODATA, f"{path} has no attribute {name}")

    def listxattr(self, path: str) -> list[str]:
        return [DTYPE_XATTR] if self._need(path) == "array" else []

    def utimens(self, path: str, times: object = None) -> int:
        self._need(path)
        return 0

    # -- opening and reading -------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        kind = self._need(path)
        if kind == "dir":
            raise oserror(errno.EISDIR, path)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return self._add(Handle(path, file=self._file(path, image=True)))
        self._writable(path)
        return self._add(Handle(path, buf=bytearray() if flags & os.O_TRUNC else None, writer=True))

    def open_flags(self, fh: int) -> tuple[bool, bool]:
        """(direct_io, keep_cache) for an open file: the page cache stays on (mmap works)."""
        return False, self.keep_cached_pages(fh)

    def keep_cached_pages(self, fh: int) -> bool:
        """Whether the kernel may keep the cached pages of the file open as `fh` (see module doc)."""
        with self._lock:
            h = self._handles[fh]
            stale = h.path in self._rewritten
            self._rewritten.discard(h.path)  # an open that does not keep them drops them
            return self.keep_cache and not h.writer and not stale

    def backing(self, fh: int) -> int | None:
        """An open descriptor of a memory file holding exactly the bytes of the file open as `fh`
        (its leaf is a `store.image`), which FUSE passthrough can serve instead; else None."""
        h = self._handles[fh]
        return None if h.writer or h.file is None or h.file.image is None else h.file.image.fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        h = self._handles[fh]
        if h.writer:
            self._materialize(h)
            return bytes(h.buf[offset : offset + size])
        return h.file.read(size, offset)

    def read_buf(self, path: str | None, size: int, offset: int, fh: int) -> list:
        """Where the bytes of `read` are (`fuse.splice` segments: views of the stored array)."""
        h = self._handles[fh]
        return [self.read(h.path, size, offset, fh)] if h.writer else h.file.segments(size, offset)

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._handles.pop(fh)
        if h.writer and h.dirty:
            with contextlib.suppress(OSError):  # close() already saw the error from flush
                self._commit(h)
        return 0

    def _add(self, handle: Handle) -> int:
        with self._lock:
            fh = next(self._ids)
            self._handles[fh] = handle
            return fh


def _is_leaf(store: TensorStore, path: str) -> bool:
    try:
        store.meta(path)
        return True
    except StoreError:
        return False
