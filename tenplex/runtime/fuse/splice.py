"""Read replies without copying in user space: a FUSE view's operations name where a read's bytes
are (`segments`), and `reply` hands them to libfuse as a pipe, which the kernel copies once into
the reader's pages (its buffer with O_DIRECT, else the page cache).

A segment is a buffer (memory: a stored array, a `.npy` header, a prefetched sample) or a
`FileRange` (bytes of an open file: a dataset sample in its source file). `reply` fills the
calling thread's pipe with them, memory by `vmsplice` (the pipe references the pages) and file
ranges by `splice` (the pipe references the file's page cache), and returns a `fuse_bufvec`
naming the pipe: libfuse splices it into `/dev/fuse` (with `FUSE_CAP_SPLICE_WRITE`, which
`SPLICE_WRITE` asks for at init). A reply that is one file range within its file (a dataset
sample) skips the pipe: the `fuse_bufvec` names the file and offset, and libfuse splices from
the file itself (in C: no Python splice per reply). Where that cannot work (a read under two
pages, a pipe too small, a refused splice), the bytes are copied into one `malloc`ed buffer
instead, the one-copy path of earlier versions. `send` is the same without libfuse: a whole
message (a `fuse.session` reply, its header first) spliced from the pipe into `/dev/fuse`.

Invariants:
- the bytes replied are exactly the segments' bytes in order (`copy_into` gives the same);
- a pipe holds nothing between replies (leftovers of a failed reply are drained first);
- segment memory is referenced, not copied, until libfuse has replied: the operations keep it
  alive while the file is open (replies complete before `read_buf` returns to the kernel).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import termios
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SPLICE_WRITE = 1 << 7  # FUSE_CAP_SPLICE_WRITE in fuse_common.h
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _pipe_max() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


PIPE_BYTES = min(_pipe_max(), 1 << 20)  # what a pipe may hold without CAP_SYS_RESOURCE
# The largest read to ask for: libfuse splices a reply only when its pipe holds 3 pages more
# than the reply, and unaligned bytes take one more page (pipe buffer) than their length.
MAX_READ = PIPE_BYTES - 4 * _PAGE
_BUF_IS_FD, _BUF_FD_SEEK, _BUF_FD_RETRY = 1 << 1, 1 << 2, 1 << 3  # enum fuse_buf_flags
_NONBLOCK = 2  # SPLICE_F_NONBLOCK

_libc = ctypes.CDLL(None, use_errno=True)
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.vmsplice.restype = ctypes.c_ssize_t


class FileRange(NamedTuple):
    """`size` bytes at `pos` of the open file `fd`."""

    fd: int
    pos: int
    size: int


Segment = FileRange | bytes | bytearray | memoryview | np.ndarray


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Buf(ctypes.Structure):  # struct fuse_buf
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]  # fmt: skip


class _Bufvec(ctypes.Structure):  # struct fuse_bufvec with one buffer
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t), ("buf", _Buf)]


def _memory(segment: bytes | bytearray | memoryview | np.ndarray) -> tuple[int, int]:
    """(address, size) of a buffer segment (read-only buffers too)."""
    a = np.frombuffer(segment, np.uint8)
    return a.__array_interface__["data"][0], a.size


def size_of(segments: Sequence[Segment]) -> int:
    return sum(s.size if isinstance(s, FileRange) else _memory(s)[1] for s in segments)


def gather(segments: Sequence[Segment]) -> memoryview:
    """The segments' bytes copied into one new buffer (the path without a splice)."""
    buf = (ctypes.c_char * max(size_of(segments), 1))()
    return memoryview(buf).cast("B")[: copy_into(ctypes.addressof(buf), segments)]


def copy_into(address: int, segments: Sequence[Segment]) -> int:
    """Copy the segments' bytes to memory at `address`; the byte count. Raises OSError on a short file."""
    n = 0
    for s in segments:
        if isinstance(s, FileRange):
            dst = (ctypes.c_char * s.size).from_address(address + n)
            if os.preadv(s.fd, [dst], s.pos) != s.size:
                raise OSError(errno.EIO, f"short read of {s.size} bytes at {s.pos} (file changed or truncated?)")
            n += s.size
        else:
            src, size = _memory(s)
            ctypes.memmove(address + n, src, size)
            n += size
    return n


class Pipes:
    """One pipe per libfuse thread (by OS thread id: libfuse's own threads get a fresh Python
    thread state per callback), holding one reply at a time; the pipes of threads that have
    exited are closed when a new thread opens one, the rest by `close` at unmount."""

    def __init__(self) -> None:
        self._pipes: dict[int, tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def _pipe(self) -> tuple[int, int, int]:
        tid = threading.get_native_id()
        pipe = self._pipes.get(tid)
        if pipe is None:
            r, w = os.pipe2(os.O_CLOEXEC)
            try:
                capacity = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:  # pipes over the user's limit (/proc/sys/fs/pipe-user-pages-soft)
                capacity = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
            pipe = (r, w, capacity // _PAGE)
            with self._lock:
                for gone in [t for t in self._pipes if not os.path.exists(f"/proc/self/task/{t}")]:
                    _close(self._pipes.pop(gone))
                self._pipes[tid] = pipe
        return pipe

    def fill(self, segments: Sequence[Segment], size: int) -> int | None:
        """The read end of this thread's pipe holding the segments' `size` bytes, or None (drained)."""
        r, w, slots = self._pipe()
        if _queued(r):
            _drain(r)
        pages = 0
        spans = []
        for s in segments:
            start, length = (s.pos, s.size) if isinstance(s, FileRange) else _memory(s)
            pages += (start % _PAGE + length + _PAGE - 1) // _PAGE
            spans.append((s, start, length))
        if pages > slots:
            return None
        try:
            for s, start, length in spans:
                if length and not _splice(w, s, start, length):
                    raise BlockingIOError
        except OSError:
            _drain(r)
            return None
        return r

    def close(self) -> None:
        with self._lock:
            for pipe in self._pipes.values():
                _close(pipe)
            self._pipes.clear()

    def __len__(self) -> int:
        return len(self._pipes)


def _close(pipe: tuple[int, int, int]) -> None:
    os.close(pipe[0])
    os.close(pipe[1])


def _splice(w: int, s: Segment, start: int, length: int) -> bool:
    """Move `length` bytes of `s` (starting at `start`) into pipe `w`; False if they did not all fit."""
    done = 0
    while done < length:
        if isinstance(s, FileRange):
            n = os.splice(s.fd, w, length - done, offset_src=start + done, flags=_NONBLOCK)
        else:
            iov = _Iovec(start + done, length - done)
            n = _libc.vmsplice(w, ctypes.byref(iov), 1, _NONBLOCK)
            if n < 0:
                raise OSError(ctypes.get_errno(), "vmsplice")
        if n <= 0:
            return False
        done += n
    return True


def _queued(fd: int) -> int:
    n = ctypes.c_int()
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n.value


def send(pipes: Pipes, dev: int, segments: Sequence[Segment]) -> bool:
    """Write one whole message of the segments' bytes to `dev` (`/dev/fuse`: a reply, its header
    first) through this thread's pipe, so the kernel copies file ranges once, from their page
    cache into the reader's pages; False (nothing sent) where they do not fit the pipe or a
    splice is refused. An interrupted request (ENOENT: no one waits for it) counts as sent."""
    size = size_of(segments)
    r = pipes.fill(segments, size)
    if r is None:
        return False
    try:
        return os.splice(r, dev, size) == size
    except OSError as e:
        return e.errno == errno.ENOENT
    finally:
        _drain(r)


def _drain(fd: int) -> None:
    while (n := _queued(fd)) > 0:
        os.read(fd, n)


def _whole_file_range(segments: Sequence[Segment]) -> bool:
    """Whether the segments are one file range that lies within its file (else a short file
    takes the pipe or copy path, whose short read is an EIO)."""
    if len(segments) != 1 or not isinstance(s := segments[0], FileRange):
        return False
    return s.pos + s.size <= os.fstat(s.fd).st_size


def reply(bufpp: object, segments: Sequence[Segment], pipes: Pipes) -> int:
    """Point libfuse's `*bufpp` at a new `fuse_bufvec` of the segments' bytes (module doc); 0."""
    size = size_of(segments)
    vec = _libc.malloc(ctypes.sizeof(_Bufvec))
    if not vec:
        raise MemoryError("malloc of a fuse_bufvec")
    buf = _Bufvec.from_address(vec)
    buf.count, buf.idx, buf.off = 0, 0, 0  # libfuse frees the bufvec (and a memory buffer in it)
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = vec
    if size >= 2 * _PAGE and _whole_file_range(segments):
        s = segments[0]
        buf.buf = _Buf(size, _BUF_IS_FD | _BUF_FD_SEEK | _BUF_FD_RETRY, None, s.fd, s.pos)
    elif (fd := pipes.fill(segments, size) if size >= 2 * _PAGE else None) is not None:
        buf.buf = _Buf(size, _BUF_IS_FD, None, fd, 0)
    else:
        if not (mem := _libc.malloc(max(size, 1))):
            raise MemoryError(f"malloc of {size} bytes for a read reply")
        buf.buf = _Buf(size, 0, mem, -1, 0)
        buf.count = 1
        copy_into(mem, segments)
    buf.count = 1
    return 0
