"""FUSE view of a TensorStore: a store (or a subtree of it) mounted as a directory.

What the view shows and how writes map to the store is `StoreFS` (`fuse_ops`); the bytes of a
file are `NpyFile` (`fuse_npy`). This module mounts it (mfusepy on libfuse3) and tunes reads:

- reads copy once: a read request is served by one `memmove` from the stored array into
  libfuse's reply buffer (mfusepy's own `read` goes through a `bytes` object, a second copy);
- the page cache stays on (no `direct_io`, so `np.load(mmap_mode="r")` works), and with
  `keep_cache` an open keeps the pages that earlier reads cached (see `StoreFS`);
- kernel read-ahead for the mount is raised to `read_ahead_kb` (its backing device's
  `/sys/class/bdi/<major:minor>/read_ahead_kb`; FUSE starts at 128 KiB), so sequential reads
  arrive as 1 MiB requests (the largest a FUSE request gets, 256 pages) several at a time.
  Without permission to write it (not root), the mount keeps the kernel's default.

Buffered reads are bound by the reader's side (page-cache pages filled by FUSE, then copied
out); a reader that opens with O_DIRECT (`load_npy`) skips both and is 3-4x faster. Attributes
and names are cached by the kernel for 1 s, so changes made to the store directly show in sizes
and listings within a second. Numbers: bench/results/fuse.md (`python -m bench --only fuse`).

Invariants:
- `mount` returns only once the directory is a live mount point, and on exit unmounts it and
  joins the FUSE thread whatever happened inside the block;
- a mount with `read_only` is mounted `ro` and its `StoreFS` refuses every change (EROFS).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

from tenplex.ir.errors import TenplexError
from tenplex.runtime.fuse_npy import NpyFile, load_npy, npy_dtype, parse_npy
from tenplex.runtime.fuse_ops import DTYPE_XATTR, StoreFS
from tenplex.runtime.store import TensorStore

__all__ = [
    "DTYPE_XATTR", "READ_AHEAD_KB", "FuseError", "NpyFile", "StoreFS", "fuse_unavailable_reason",
    "is_mounted", "load_npy", "mount", "npy_dtype", "parse_npy", "read_ahead_of", "serve",
]  # fmt: skip

READ_AHEAD_KB = 8192  # see bench/results/fuse.md: 1 MiB requests, several in flight
log = logging.getLogger(__name__)


class FuseError(TenplexError):
    """FUSE cannot be used here (no /dev/fuse, fusermount3 or libfuse3) or a mount failed."""


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


@functools.cache
def _fuse_class() -> type:
    """mfusepy's FUSE with the two fast paths of the module doc (defined once mfusepy loads)."""

    class StoreFUSE(_mfusepy().FUSE):
        def open(self, path: bytes, fip) -> int:
            fi = fip.contents
            fi.fh = self.operations.open(path.decode(self.encoding, self.errors), fi.flags)
            fi.keep_cache = self.operations.keep_cached_pages(fi.fh)
            return 0

        def read(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
            return self.operations.read_into(fip.contents.fh, ctypes.addressof(buf.contents), size, offset)

    return StoreFUSE


def serve(store: TensorStore, directory: str, *, prefix: str = "/", read_only: bool = False,
          keep_cache: bool = False) -> None:  # fmt: skip
    """Mount `store` at `directory` in the calling thread and block until it is unmounted.

    Raises: FuseError if FUSE is unavailable or libfuse fails to mount.
    """
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseError(reason)
    ops = StoreFS(store, prefix, read_only=read_only, keep_cache=keep_cache)
    # max_idle_threads: libfuse 3.14 warns about its own default (UINT_MAX) on every mount
    options = {"fsname": "tenplex", "attr_timeout": 1.0, "max_idle_threads": 10, "ro": read_only}
    try:
        _fuse_class()(ops, directory, foreground=True, **options)
    except RuntimeError as e:
        raise FuseError(f"libfuse failed to mount {directory}: error {e}") from e


@contextlib.contextmanager
def mount(store: TensorStore, directory: str, *, prefix: str = "/", timeout: float = 10.0, read_only: bool = False,
          keep_cache: bool = False, read_ahead_kb: int | None = READ_AHEAD_KB) -> Iterator[str]:  # fmt: skip
    """Mount `store` (its subtree `prefix`) at `directory` in a background thread; yield the path.

    The mount is live when the block starts and gone (unmounted, thread joined) when it ends.
    The view serves other processes. In this process, plain Python file I/O works, but numpy's
    C-level I/O on the mount (`np.load`, `np.save`, `np.fromfile`, and page faults of a
    `mmap_mode` array) holds the GIL that the FUSE thread needs and deadlocks: use `serve` in a
    separate process, or read the store directly, for that. While mounted, libfuse handles
    SIGTERM and SIGHUP (SIGINT too where it is at its default) unless the process has its own
    handlers, as `tenplex store mount` does. `read_ahead_kb=None` keeps the kernel's read-ahead.
    Raises: FuseError if FUSE is unavailable or the mount is not live within `timeout` seconds.
    """
    directory = os.path.realpath(directory)
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseError(reason)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve(store, directory, prefix=prefix, read_only=read_only, keep_cache=keep_cache)
        except BaseException as e:  # reported to the caller below
            failure.append(e)

    thread = threading.Thread(target=run, name=f"tenplex-fuse:{directory}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not is_mounted(directory):
        if not thread.is_alive() or time.monotonic() > deadline:
            _unmount(directory, thread)
            why = failure[0] if failure else f"not mounted after {timeout} s"
            raise FuseError(f"cannot mount the store at {directory}: {why}")
        time.sleep(0.01)
    try:
        if read_ahead_kb is not None:
            _set_read_ahead(directory, read_ahead_kb)
        yield directory
    finally:
        _unmount(directory, thread)


def read_ahead_of(directory: str) -> int | None:
    """The kernel read-ahead (KiB) of the file system mounted at `directory`; None if unknown."""
    try:
        with open(_bdi_file(directory)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _bdi_file(directory: str) -> str:
    return f"/sys/class/bdi/{_mount_entry(directory)}/read_ahead_kb"


def _set_read_ahead(directory: str, kb: int) -> None:
    """Raise the mount's read-ahead to `kb` KiB; log (and go on) where sysfs does not allow it."""
    os.stat(directory)  # waits for FUSE's INIT reply, which would cap an earlier setting at 128 KiB
    try:
        with open(_bdi_file(directory), "w") as f:
            f.write(str(kb))
    except OSError as e:
        log.info("cannot set the read-ahead of the FUSE mount %s: %s", directory, e)


def _unmount(directory: str, thread: threading.Thread) -> None:
    for args in (["-u"], ["-u", "-z"]):  # lazy unmount if a file is still open
        if not is_mounted(directory):
            break
        subprocess.run(["fusermount3", *args, directory], capture_output=True, check=False)
    thread.join(timeout=10)
    if thread.is_alive():
        log.warning("FUSE thread for %s did not stop within 10 s", directory)


def is_mounted(directory: str) -> bool:
    """Whether `directory` (an absolute, resolved path) is a mount point, from the mount table (a
    stat could hang on a dead FUSE mount)."""
    return _mount_entry(directory) is not None


def _mount_entry(directory: str) -> str | None:
    """The `major:minor` of the file system mounted at `directory` (the last one), or None."""
    escaped = directory.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    with open("/proc/self/mountinfo") as f:
        devices = [fields[2] for line in f if (fields := line.split(" "))[4] == escaped]
    return devices[-1] if devices else None
