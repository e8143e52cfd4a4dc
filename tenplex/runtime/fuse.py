"""FUSE view of a TensorStore: a store (or a subtree of it) mounted as a directory.

Layout: store directories are directories; an array leaf `<name>` is the file `<name>.npy`, a
valid `.npy` (format 1.0, numpy's own header for its dtype and shape, generated on open) that
`numpy.load` reads, also with `mmap_mode="r"`; a value leaf is `<name>.json` holding its JSON.
Reads serve the byte range asked for from a view of the stored array (a slice of its bytes for
C- or Fortran-contiguous arrays, a run of elements otherwise), never a copy of the whole tensor.

bfloat16 and float8 have no `.npy` name that numpy can load without ml_dtypes, so they appear as
raw bits in the unsigned integer of the same width (`<u2`, `|u1`), as `tenplex.save` stores them;
`getxattr(path, "user.tenplex.dtype")` names the stored dtype (e.g. `bfloat16`), and writing the
raw-bits file over such a leaf keeps its dtype, so read-modify-write round trips are exact.

Writes: creating or opening `<name>.npy` (or `<name>.json`) for writing buffers the bytes in
memory; each close parses the buffer with numpy's format reader (or `json`) and stores the leaf
at `<name>`, replacing any old one. Other file names cannot be created (EPERM). `mkdir` makes a
directory that lives only in this view until a leaf is written under it (the store has no empty
directories of its own); `unlink`/`rmdir` (empty directories only) map to `store.delete`,
`rename` to `store.rename`. Attributes are cached by the kernel for 1 s, so changes made to the
store directly show in sizes and listings within a second.

Invariants:
- a file's bytes are exactly what `np.save` (`json.dumps` + newline) writes for the leaf;
- a close that fails to parse returns EINVAL and leaves the store unchanged;
- `mount` returns only once the directory is a live mount point, and on exit unmounts it and
  joins the FUSE thread whatever happened inside the block.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator

import attrs
import numpy as np

from tenplex.ir.errors import TenplexError
from tenplex.runtime.arrays import np_dtype
from tenplex.runtime.store import StoreError, TensorStore

__all__ = ["DTYPE_XATTR", "FuseError", "StoreFS", "fuse_unavailable_reason", "mount", "serve"]

NPY, JSON = ".npy", ".json"
DTYPE_XATTR = "user.tenplex.dtype"
log = logging.getLogger(__name__)


class FuseError(TenplexError):
    """FUSE cannot be used here (no /dev/fuse, fusermount3 or libfuse3) or a mount failed."""


# -- .npy bytes ----------------------------------------------------------------------------------


def npy_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a `.npy` file names for arrays of `dtype`: itself, or same-width raw bits."""
    fmt = np.lib.format
    if fmt.descr_to_dtype(fmt.dtype_to_descr(dtype)) == dtype:
        return dtype
    return np.dtype(f"u{dtype.itemsize}")


@attrs.frozen
class NpyFile:
    """The bytes of one leaf's file: a header and the data bytes of `array` in file order."""

    header: bytes
    array: np.ndarray | None  # None for a JSON value (all bytes are in `header`)

    @classmethod
    def from_leaf(cls, data: np.ndarray | object) -> NpyFile:
        if not isinstance(data, np.ndarray):
            return cls((json.dumps(data) + "\n").encode(), None)
        array = data.view(npy_dtype(data.dtype))
        fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
        out = io.BytesIO()
        d = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": fortran, "shape": array.shape}
        np.lib.format.write_array_header_1_0(out, d)
        return cls(out.getvalue(), array)

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

    def _data(self, start: int, stop: int) -> bytes:
        a = self.array
        if a.flags.c_contiguous or a.flags.f_contiguous:
            flat = (a if a.flags.c_contiguous else a.T).reshape(-1).view(np.uint8)
            return flat[start:stop].tobytes()
        size = a.itemsize  # strided view: copy just the elements that cover [start, stop)
        first, last = start // size, -(-stop // size)
        run = np.ascontiguousarray(a.flat[first:last]).view(np.uint8)
        return run[start - first * size : stop - first * size].tobytes()


def parse_npy(buf: bytes | bytearray) -> np.ndarray:
    """The array in `.npy` bytes, C- or F-contiguous, viewing `buf` where aligned.

    Raises: ValueError if the bytes are not a complete `.npy` of a non-object dtype.
    """
    f = io.BytesIO(buf)
    version = np.lib.format.read_magic(f)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f".npy format version {version} is not supported (1.0 and 2.0 are)")
    shape, fortran, dtype = readers[version](f)
    if dtype.hasobject:
        raise ValueError(f"object arrays ({dtype}) cannot be stored")
    count = int(np.prod(shape, dtype=np.int64))
    if len(buf) - f.tell() != count * dtype.itemsize:
        raise ValueError(
            f"{len(buf) - f.tell()} data bytes for shape {shape} of {dtype} (needs {count * dtype.itemsize})"
        )
    flat = np.frombuffer(buf, dtype=dtype, count=count, offset=f.tell())
    array = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    return array if array.flags.aligned else array.copy(order="K")


# -- the file system -------------------------------------------------------------------------------


@attrs.define
class _Handle:
    path: str  # mount path
    file: NpyFile | None = None  # what a reader reads
    buf: bytearray | None = None  # a writer's bytes; None until materialized from the old file
    writer: bool = False
    dirty: bool = False


def _oserror(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


class StoreFS:
    """mfusepy operations over `store` rooted at `prefix` (see module doc). Thread-safe."""

    use_ns = True

    def __init__(self, store: TensorStore, prefix: str = "/") -> None:
        self.store, self.prefix = store, prefix.rstrip("/")
        self._handles: dict[int, _Handle] = {}
        self._dirs: set[str] = set()  # mkdir'ed mount paths not (yet) in the store
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

    def _file(self, path: str) -> NpyFile:
        try:
            return NpyFile.from_leaf(self.store.get(self._store_path(path)))
        except StoreError:
            raise _oserror(errno.ENOENT, path) from None

    def _need(self, path: str) -> str:
        kind = self._kind(path)
        if kind is None:
            raise _oserror(errno.ENOENT, path)
        return kind

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
            raise _oserror(errno.ENOTDIR, path)
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
        raise _oserror(errno.ENODATA, f"{path} has no attribute {name}")

    def listxattr(self, path: str) -> list[str]:
        return [DTYPE_XATTR] if self._need(path) == "array" else []

    def utimens(self, path: str, times: object = None) -> int:
        self._need(path)
        return 0

    # -- reading and writing ------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        kind = self._need(path)
        if kind == "dir":
            raise _oserror(errno.EISDIR, path)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return self._add(_Handle(path, file=self._file(path)))
        return self._add(_Handle(path, buf=bytearray() if flags & os.O_TRUNC else None, writer=True))

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        if not path.endswith((NPY, JSON)) or path.endswith(("/" + NPY, "/" + JSON)):
            raise _oserror(errno.EPERM, f"{path}: only <name>.npy and <name>.json files can be created")
        return self._add(_Handle(path, buf=bytearray(), writer=True, dirty=True))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        h = self._handles[fh]
        if h.writer:
            self._materialize(h)
            return bytes(h.buf[offset : offset + size])
        return h.file.read(size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self._handles[fh]
        self._materialize(h)
        if offset > len(h.buf):
            h.buf.extend(bytes(offset - len(h.buf)))
        h.buf[offset : offset + len(data)] = data
        h.dirty = True
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._lock:
            handles = [h for h in self._handles.values() if h.writer and h.path == path]
        if not handles:
            raise _oserror(errno.EPERM, f"{path}: truncate a file only while it is open for writing")
        for h in handles:
            if length == 0:
                h.buf = bytearray()  # skip copying the old contents of a file about to be rewritten
            self._materialize(h)
            del h.buf[length:]
            h.buf.extend(bytes(length - len(h.buf)))
            h.dirty = True
        return 0

    def flush(self, path: str, fh: int) -> int:
        h = self._handles[fh]
        if h.writer and h.dirty:
            self._commit(h)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._handles.pop(fh)
        if h.writer and h.dirty:
            with contextlib.suppress(OSError):  # close() already saw the error from flush
                self._commit(h)
        return 0

    def _add(self, handle: _Handle) -> int:
        with self._lock:
            fh = next(self._ids)
            self._handles[fh] = handle
            return fh

    def _materialize(self, h: _Handle) -> None:
        if h.buf is None:  # opened for writing without O_TRUNC: start from the current bytes
            f = self._file(h.path)
            h.buf = bytearray(f.read(f.size, 0))

    def _commit(self, h: _Handle) -> None:
        sp = self._store_path(h.path)
        try:
            data = parse_npy(h.buf) if h.path.endswith(NPY) else json.loads(h.buf.decode())
            if isinstance(data, np.ndarray):
                data = self._keep_raw_dtype(sp, data)
            self.store.put(sp, data, replace=True)
        except (ValueError, UnicodeDecodeError, StoreError) as e:
            raise _oserror(errno.EINVAL, f"{h.path}: {e}") from None
        h.dirty = False

    def _keep_raw_dtype(self, sp: str, array: np.ndarray) -> np.ndarray:
        """Raw bits written over a bfloat16/float8 leaf stay that dtype (see module doc)."""
        with contextlib.suppress(StoreError):
            meta = self.store.meta(sp)
            if meta.kind == "array" and npy_dtype(old := np_dtype(meta.dtype)) == array.dtype != old:
                return array.view(old)
        return array

    # -- namespace ---------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int) -> int:
        if self._kind(path) is not None:
            raise _oserror(errno.EEXIST, path)
        with self._lock:
            self._dirs.add(path)
        return 0

    def unlink(self, path: str) -> int:
        if self._need(path) not in ("array", "value"):
            raise _oserror(errno.EISDIR if self._kind(path) == "dir" else errno.EBUSY, path)
        self.store.delete(self._store_path(path))
        return 0

    def rmdir(self, path: str) -> int:
        if self._need(path) != "dir":
            raise _oserror(errno.ENOTDIR, path)
        if path == "/":
            raise _oserror(errno.EBUSY, "the mount root cannot be removed")
        if len(self.readdir(path, 0)) > 2:
            raise _oserror(errno.ENOTEMPTY, path)
        with self._lock:
            self._dirs.discard(path)
        with contextlib.suppress(StoreError):
            self.store.delete(self._store_path(path, strip=False))
        return 0

    def rename(self, old: str, new: str) -> int:
        kind = self._need(old)
        strip = kind != "dir"
        if (
            kind == "pending"
            or (strip and old.endswith(NPY) != new.endswith(NPY))
            or (strip and not new.endswith((NPY, JSON)))
        ):
            raise _oserror(errno.EPERM, f"cannot rename {old} to {new}: keep the suffix and close the file first")
        try:
            self.store.rename(self._store_path(old, strip), self._store_path(new, strip), replace=True)
        except StoreError as e:
            raise _oserror(errno.EINVAL, str(e)) from None
        return 0


def _is_leaf(store: TensorStore, path: str) -> bool:
    try:
        store.meta(path)
        return True
    except StoreError:
        return False


# -- mounting --------------------------------------------------------------------------------------


def fuse_unavailable_reason() -> str | None:
    """Why FUSE cannot be used on this machine, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (load the fuse module or run the container with --device /dev/fuse)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (apt-get install -y fuse3)"
    try:
        _mfusepy()
    except FuseError as e:
        return str(e)
    return None


def _mfusepy():
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    try:
        import mfusepy
    except (ImportError, OSError, AttributeError) as e:
        raise FuseError(
            f"cannot load mfusepy on libfuse3 ({e}); install fuse3 (apt-get install -y fuse3) and mfusepy"
        ) from e
    return mfusepy


def serve(store: TensorStore, directory: str, *, prefix: str = "/") -> None:
    """Mount `store` at `directory` in the calling thread and block until it is unmounted.

    Raises: FuseError if FUSE is unavailable or libfuse fails to mount.
    """
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseError(reason)
    try:
        _mfusepy().FUSE(StoreFS(store, prefix), directory, foreground=True, fsname="tenplex", attr_timeout=1.0)
    except RuntimeError as e:
        raise FuseError(f"libfuse failed to mount {directory}: error {e}") from e


@contextlib.contextmanager
def mount(store: TensorStore, directory: str, *, prefix: str = "/", timeout: float = 10.0) -> Iterator[str]:
    """Mount `store` (its subtree `prefix`) at `directory` in a background thread; yield the path.

    The mount is live when the block starts and gone (unmounted, thread joined) when it ends.
    The view serves other processes. In this process, plain Python file I/O works, but numpy's
    C-level I/O on the mount (`np.load`, `np.save`, `np.fromfile`, and page faults of a
    `mmap_mode` array) holds the GIL that the FUSE thread needs and deadlocks: use `serve` in a
    separate process, or read the store directly, for that. libfuse installs its SIGINT/SIGTERM/SIGHUP handlers while mounted: they unmount the view.
    Raises: FuseError if FUSE is unavailable or the mount is not live within `timeout` seconds.
    """
    directory = os.path.realpath(directory)
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseError(reason)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve(store, directory, prefix=prefix)
        except BaseException as e:  # reported to the caller below
            failure.append(e)

    thread = threading.Thread(target=run, name=f"tenplex-fuse:{directory}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not _is_mounted(directory):
        if not thread.is_alive() or time.monotonic() > deadline:
            _unmount(directory, thread)
            why = failure[0] if failure else f"not mounted after {timeout} s"
            raise FuseError(f"cannot mount the store at {directory}: {why}")
        time.sleep(0.01)
    try:
        yield directory
    finally:
        _unmount(directory, thread)


def _unmount(directory: str, thread: threading.Thread) -> None:
    for args in (["-u"], ["-u", "-z"]):  # lazy unmount if a file is still open
        if not _is_mounted(directory):
            break
        subprocess.run(["fusermount3", *args, directory], capture_output=True, check=False)
    thread.join(timeout=10)
    if thread.is_alive():
        log.warning("FUSE thread for %s did not stop within 10 s", directory)


def _is_mounted(directory: str) -> bool:
    """Whether `directory` is a mount point, read from the mount table (a stat could hang)."""
    escaped = directory.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == escaped for line in f)
