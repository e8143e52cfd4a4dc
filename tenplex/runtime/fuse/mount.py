"""Mounting FUSE operations (mfusepy on libfuse3) in a background thread: shared by the tensor
store's view (`tenplex.runtime.fuse.store`) and the dataset's per-rank view (`tenplex.runtime.fuse.dataset`).

- reads copy nothing in user space: `ops.read_buf(path, size, offset, fh)` names where the bytes
  are (`splice` segments: memory or file ranges) and the reply hands them to the kernel through
  a pipe, or a lone file range as its file and offset (`splice.reply`), which it copies once,
  into the reader's pages;
- with `ops.readdir_plus(path, fh) -> [(name, attrs)]`, a listing hands the kernel every entry's
  attributes (READDIRPLUS), so opening the listed files needs no LOOKUP each;
- `open` lets the operations choose per file whether the kernel bypasses or keeps its cached
  pages (`ops.open_flags(fh) -> (direct_io, keep_cache)`);
- the mount's kernel read-ahead is raised to `READ_AHEAD_KB`, so sequential reads of large files
  arrive as 1 MiB requests, several in flight (needs root; else the default stays, logged).

Invariants:
- `mount` returns only once the directory is a live mount point, and on exit unmounts it and
  joins the FUSE thread whatever happened inside the block.
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
from collections.abc import Callable, Iterator
from typing import Any

from tenplex.ir.errors import TenplexError
from tenplex.runtime.fuse import splice

READ_AHEAD_KB = 8192  # see bench/results/fuse.md: 1 MiB requests, several in flight
_READDIR_PLUS, _FILL_DIR_PLUS = 1, 2  # FUSE_READDIR_PLUS, FUSE_FILL_DIR_PLUS (fuse.h)
log = logging.getLogger(__name__)


class FuseUnavailable(TenplexError):
    """FUSE cannot be used here (no /dev/fuse, fusermount3 or libfuse3) or a mount failed."""


def fuse_unavailable_reason() -> str | None:
    """Why FUSE cannot be used on this machine, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (load the fuse module or run the container with --device /dev/fuse)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (apt-get install -y fuse3)"
    try:
        fuse_class()
    except FuseUnavailable as e:
        return str(e)
    return None


@functools.cache
def fuse_class() -> type:
    """mfusepy's FUSE with the fast paths of the module doc (defined once mfusepy loads)."""
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    try:
        import mfusepy
    except (ImportError, OSError, AttributeError) as e:
        raise FuseUnavailable(f"cannot load mfusepy on libfuse3 ({e}); install fuse3 (apt-get install -y fuse3) "
                              "and mfusepy") from None  # fmt: skip

    class FastFUSE(mfusepy.FUSE):
        def __init__(self, operations: Any, mountpoint: str, **options: Any) -> None:
            self.pipes = splice.Pipes()
            try:
                super().__init__(operations, mountpoint, **options)  # returns once unmounted
            finally:
                self.pipes.close()

        def init_fuse_3(self, conn: Any, config: Any) -> None:
            conn.contents.want |= conn.contents.capable & splice.SPLICE_WRITE
            conn.contents.max_read = splice.MAX_READ  # libfuse checks it against the mount option
            super().init_fuse_3(conn, config)

        def open(self, path: bytes, fip: Any) -> int:
            fi = fip.contents
            fi.fh = self.operations.open(path.decode(self.encoding, self.errors), fi.flags)
            fi.direct_io, fi.keep_cache = self.operations.open_flags(fi.fh)
            return 0

        def readdir_fuse_3(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
            plus = getattr(self.operations, "readdir_plus", None)
            if plus is None:
                return super().readdir_fuse_3(path, buf, filler, offset, fip, flags)
            st, fill = mfusepy.c_stat(), _FILL_DIR_PLUS if flags & _READDIR_PLUS else 0
            entries = plus(path.decode(self.encoding, self.errors), fip.contents.fh)
            for k in range(offset, len(entries)):  # with offsets: libfuse links plus entries only then
                name, attrs = entries[k]
                ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
                mfusepy.set_st_attrs(st, attrs, use_ns=True)
                if filler(buf, name.encode(self.encoding, self.errors), st, k + 1, fill) != 0:
                    break
            return 0

        def read_buf(self, path: bytes | None, bufpp: Any, size: int, offset: int, fip: Any) -> int:
            return splice.reply(bufpp, self.operations.read_buf(None, size, offset, fip.contents.fh), self.pipes)

    return FastFUSE


def serve(ops: Any, directory: str, **options: Any) -> None:
    """Mount `ops` at `directory` in the calling thread; return once it is unmounted. Reads are
    asked for in requests of at most `splice.MAX_READ` bytes, the most a reply pipe splices.
    Raises: FuseUnavailable if libfuse fails to mount."""
    try:
        fuse_class()(ops, directory, foreground=True, max_read=splice.MAX_READ, **options)
    except RuntimeError as e:
        raise FuseUnavailable(f"libfuse failed to mount {directory}: error {e}") from None


@contextlib.contextmanager
def mount(serve_here: Callable[[str], None], directory: str, *, timeout: float = 10.0,
          read_ahead_kb: int | None = READ_AHEAD_KB, what: str = "FUSE view") -> Iterator[str]:  # fmt: skip
    """Run `serve_here(directory)` in a background thread until the block ends; yield the
    resolved directory once it is a live mount point. Raises: FuseUnavailable naming the
    directory and why (FUSE unavailable, or not live within `timeout` s)."""
    directory = os.path.realpath(directory)
    if (reason := fuse_unavailable_reason()) is not None:
        raise FuseUnavailable(f"cannot mount the {what} at {directory}: {reason}")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve_here(directory)
        except BaseException as e:  # reported to the caller below
            failure.append(e)

    thread = threading.Thread(target=run, name=f"tenplex-fuse:{directory}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not is_mounted(directory):
        if not thread.is_alive() or time.monotonic() > deadline:
            unmount(directory, thread)
            why = failure[0] if failure else f"not mounted after {timeout} s"
            raise FuseUnavailable(f"cannot mount the {what} at {directory}: {why}")
        time.sleep(0.01)
    try:
        if read_ahead_kb is not None:
            set_read_ahead(directory, read_ahead_kb)
        yield directory
    finally:
        unmount(directory, thread)


def unmount(directory: str, thread: threading.Thread | None = None) -> None:
    for args in (["-u"], ["-u", "-z"]):  # lazy unmount if a file is still open
        if not is_mounted(directory):
            break
        subprocess.run(["fusermount3", *args, directory], capture_output=True, check=False)
    if thread is not None:
        thread.join(timeout=10)
        if thread.is_alive():
            log.warning("FUSE thread for %s did not stop within 10 s", directory)


def read_ahead_of(directory: str) -> int | None:
    """The kernel read-ahead (KiB) of the file system mounted at `directory`; None if unknown."""
    try:
        with open(_bdi_file(directory)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _bdi_file(directory: str) -> str:
    return f"/sys/class/bdi/{mount_entry(directory)}/read_ahead_kb"


def set_read_ahead(directory: str, kb: int) -> None:
    """Raise the mount's read-ahead to `kb` KiB; log (and go on) where sysfs does not allow it."""
    os.stat(directory)  # waits for FUSE's INIT reply, which would cap an earlier setting at 128 KiB
    try:
        with open(_bdi_file(directory), "w") as f:
            f.write(str(kb))
    except OSError as e:
        log.info("cannot set the read-ahead of the FUSE mount %s: %s", directory, e)


def is_mounted(directory: str) -> bool:
    """Whether `directory` (an absolute, resolved path) is a mount point, from the mount table (a
    stat could hang on a dead FUSE mount)."""
    return mount_entry(directory) is not None


def mount_entry(directory: str) -> str | None:
    """The `major:minor` of the file system mounted at `directory` (the last one), or None."""
    mounted = _mountinfo(directory)
    return mounted[0] if mounted else None


def mount_type(directory: str) -> str | None:
    """The file system type mounted at `directory` (the last one; "fuse.tenplex" where
    `fuse.session` serves it, "fuse" for libfuse), or None."""
    mounted = _mountinfo(directory)
    return mounted[1] if mounted else None


def _mountinfo(directory: str) -> tuple[str, str] | None:
    """(major:minor, type) of the last mount at `directory` in /proc/self/mountinfo, or None."""
    escaped = directory.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
    with open("/proc/self/mountinfo") as f:
        found = [(fields[2], line.split(" - ", 1)[1].split()[0]) for line in f if (fields := line.split(" "))[4] == escaped]
    return found[-1] if found else None
