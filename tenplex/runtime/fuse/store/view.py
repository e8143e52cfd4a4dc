"""FUSE view of a TensorStore: a store (or a subtree of it) mounted as a directory.

What the view shows and how writes map to the store is `StoreFS` (`fuse.store.ops`); the bytes of a
file are `NpyFile` (`fuse.npy`). This module mounts it, one of two ways:

- read-only, where the process may mount(2) (root): `fuse.session`, the kernel's protocol served
  without libfuse. A leaf held as a `.npy` image (`store.image`: a memory file that is exactly
  the file's bytes; `put_image`, and `tenplex store mount` loads arrays so) is opened with FUSE
  passthrough: the kernel reads and maps the memory file itself, so a buffered read, `mmap` or
  `load_npy` of it costs what it costs on tmpfs and never reaches this process. Other leaves
  are answered from the stored array's memory (one `writev` per request); files of
  `DIRECT_IO_FROM` bytes and more (without `keep_cache`) with direct I/O, so the kernel copies a
  reply once, into the reader's buffer (a `read` call costs a request, however small: readers
  of such files read large blocks), and maps them shared through its page cache
  (FUSE_DIRECT_IO_ALLOW_MMAP), smaller ones through the page cache;
- otherwise (writable, or not root) mfusepy on libfuse3 (`fuse.mount`): a read request names views
  of the stored array (`NpyFile.segments`), which the mount splices into the reply
  (`fuse.splice`), and the kernel copies them once, into the page cache or, with O_DIRECT,
  straight into the reader's buffer.

`np.load(mmap_mode="r")` works either way; with `keep_cache` an open keeps the pages that
earlier reads cached (see `StoreFS`), and the mount's kernel read-ahead is raised to `read_ahead_kb` (its
backing device's `/sys/class/bdi/<major:minor>/read_ahead_kb`; FUSE starts at 128 KiB), so
sequential reads arrive as requests of `splice.MAX_READ` (1 MiB less 4 pages), several at a
time. Without permission to write it (not root), the mount keeps the kernel's default.

Buffered reads through the page cache are bound by the reader's side (the kernel copies each
byte twice: into the page cache, then out of it); a reader that opens with O_DIRECT
(`load_npy`) gets one copy, as from tmpfs. Attributes and names are cached by the kernel for
1 s, so changes made to the store directly show in sizes and listings within a second. Numbers:
bench/results/fuse.md (`python -m bench --only fuse`).

Invariants:
- `mount` returns only once the directory is a live mount point, and on exit unmounts it and
  joins the FUSE threads whatever happened inside the block;
- a mount with `read_only` is mounted `ro` and its `StoreFS` refuses every change (EROFS).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from tenplex.runtime.fuse import mount as fusemount
from tenplex.runtime.fuse.mount import (
    READ_AHEAD_KB,
    FuseUnavailable,
    fuse_unavailable_reason,
    is_mounted,
    read_ahead_of,
)
from tenplex.runtime.fuse.npy import NpyFile, load_npy, npy_descr, parse_npy
from tenplex.runtime.fuse.session import SessionUnavailable, mount_session
from tenplex.runtime.fuse.store.ops import DTYPE_XATTR, StoreFS
from tenplex.runtime.store.tree import TensorStore

__all__ = [
    "DTYPE_XATTR", "READ_AHEAD_KB", "FuseError", "NpyFile", "StoreFS", "fuse_unavailable_reason",
    "is_mounted", "load_npy", "mount", "npy_descr", "parse_npy", "read_ahead_of", "serve",
]  # fmt: skip

FuseError = FuseUnavailable  # FUSE cannot be used here, or a mount failed
log = logging.getLogger(__name__)
DIRECT_IO_FROM = 1 << 20  # files not passed through, of this size and up: direct I/O (module doc)


def serve(store: TensorStore, directory: str, *, prefix: str = "/", read_only: bool = False,
          keep_cache: bool = False) -> None:  # fmt: skip
    """Mount `store` at `directory` in the calling thread and block until it is unmounted.

    Raises: FuseError if FUSE is unavailable or libfuse fails to mount.
    """
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseError(reason)
    ops = StoreFS(store, prefix, read_only=read_only, keep_cache=keep_cache)
    # max_idle_threads: libfuse 3.14 warns about its own default (UINT_MAX) on every mount
    fusemount.serve(ops, directory, fsname="tenplex", attr_timeout=1.0, max_idle_threads=10, ro=read_only)


@contextlib.contextmanager
def mount(store: TensorStore, directory: str, *, prefix: str = "/", timeout: float = 10.0, read_only: bool = False,
          keep_cache: bool = False, read_ahead_kb: int | None = READ_AHEAD_KB,
          lowlevel: bool | None = None) -> Iterator[str]:  # fmt: skip
    """Mount `store` (its subtree `prefix`) at `directory` in a background thread; yield the path.

    The mount is live when the block starts and gone (unmounted, threads joined) when it ends.
    A read-only mount is served by `fuse.session` (the kernel protocol without libfuse: leaves
    held as `store.image`s are passed through to their memory files) where the process may
    mount(2) (root); `lowlevel=False` always uses libfuse (mfusepy), `True` refuses to fall back.
    The view serves other processes. In this process, plain Python file I/O works, but numpy's
    C-level I/O on the mount (`np.load`, `np.save`, `np.fromfile`, and page faults of a
    `mmap_mode` array) holds the GIL that the FUSE threads need and deadlocks: use `serve` in a
    separate process, or read the store directly, for that. While mounted by libfuse, it handles
    SIGTERM and SIGHUP (SIGINT too where it is at its default) unless the process has its own
    handlers, as `tenplex store mount` does. `read_ahead_kb=None` keeps the kernel's read-ahead.
    Raises: FuseError if FUSE is unavailable or the mount is not live within `timeout` seconds.
    """
    if read_only and lowlevel is not False and (lowlevel or os.geteuid() == 0):
        ops = StoreFS(store, prefix, read_only=True, keep_cache=keep_cache)
        try:
            with mount_session(ops, directory, read_ahead_kb=read_ahead_kb, what="store",
                               direct_io_from=DIRECT_IO_FROM) as session:  # fmt: skip
                yield session.directory
            return
        except SessionUnavailable as e:
            if lowlevel:
                raise FuseError(f"cannot mount the store at {directory}: {e}") from None
            log.info("serving %s with libfuse: %s", directory, e)

    def serve_here(path: str) -> None:
        serve(store, path, prefix=prefix, read_only=read_only, keep_cache=keep_cache)

    with fusemount.mount(serve_here, directory, timeout=timeout, read_ahead_kb=read_ahead_kb, what="store") as path:
        yield path
