"""`fuse.splice` without a mount: a read reply (`reply`) carries exactly its segments' bytes, in
order, whether they go through the thread's pipe (memory by vmsplice, file ranges by splice) or
a malloc'ed buffer (small replies, too many pages for the pipe); leftovers of a failed reply are
drained first; `copy_into` gives the same bytes; the pipes of finished threads are closed."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenplex.runtime.fuse import splice

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
FILE = bytes(range(256)) * 4096  # 1 MiB of a known pattern


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("splice") / "source.bin"
    path.write_bytes(FILE)
    fd = os.open(path, os.O_RDONLY)
    yield fd
    os.close(fd)


@pytest.fixture(scope="module")
def pipes():
    p = splice.Pipes()
    yield p
    p.close()


def replied(segments: list, pipes: splice.Pipes) -> tuple[bytes, bool]:
    """(the bytes of the reply to `segments`, whether libfuse gets them as an fd to splice: the
    thread's pipe, or the source file at an offset), freed as libfuse does."""
    vec = ctypes.c_void_p()
    assert splice.reply(ctypes.byref(vec), segments, pipes) == 0
    buf = splice._Bufvec.from_address(vec.value)
    assert (buf.count, buf.idx, buf.off) == (1, 0, 0)
    spliced, b = bool(buf.buf.flags & splice._BUF_IS_FD), buf.buf
    if b.flags & splice._BUF_FD_SEEK:
        data = os.pread(b.fd, b.size, b.pos)
    else:
        data = os.read(b.fd, b.size) if spliced else ctypes.string_at(b.mem, b.size)
    if not spliced:
        _libc.free(b.mem)
    _libc.free(vec.value)
    return data, spliced


def expected(segments: list) -> bytes:
    return b"".join(FILE[s.pos : s.pos + s.size] if isinstance(s, splice.FileRange) else bytes(s) for s in segments)


segment = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.integers(0, 40000), st.integers(0, 20000)).map(lambda t: np.arange(t[0] + t[1], dtype=np.uint8)[t[0] :]),
    st.tuples(st.integers(0, len(FILE) - 1), st.integers(0, 30000)).map(
        lambda t: (t[0], min(t[1], len(FILE) - t[0]))
    ),
)  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(st.lists(segment, max_size=4))
def test_a_reply_carries_its_segments_bytes_in_order(source, pipes, parts):
    segments = [splice.FileRange(source, *p) if isinstance(p, tuple) else p for p in parts]
    data, through_pipe = replied(segments, pipes)
    assert data == expected(segments)
    assert through_pipe == (len(data) >= 2 * os.sysconf("SC_PAGE_SIZE"))
    out = ctypes.create_string_buffer(max(len(data), 1))
    assert splice.copy_into(ctypes.addressof(out), segments) == len(data) and out.raw[: len(data)] == data


def test_leftovers_are_drained_and_oversized_replies_copied(source, pipes):
    big = np.arange(splice.PIPE_BYTES + 8192, dtype=np.uint64).view(np.uint8)[: splice.PIPE_BYTES + 5]
    assert replied([b"head", big], pipes) == (b"head" + big.tobytes(), False)  # more pages than the pipe holds
    r, w, _ = pipes._pipe()
    os.write(w, b"junk a failed reply left")
    assert replied([b"h", splice.FileRange(source, 5, 9000)], pipes) == (b"h" + FILE[5:9005], True)
    assert splice._queued(r) == 0


def test_one_file_range_is_handed_over_as_the_file_itself(source, pipes):
    """libfuse splices a lone file range from the source fd at its offset (no pipe); a range past
    the file's end takes the pipe and copy path, whose short read is an EIO."""
    vec = ctypes.c_void_p()
    assert splice.reply(ctypes.byref(vec), [splice.FileRange(source, 5, 9000)], pipes) == 0
    b = splice._Bufvec.from_address(vec.value).buf
    assert (b.fd, b.pos, b.size) == (source, 5, 9000) and b.flags & splice._BUF_FD_SEEK
    _libc.free(vec.value)
    with pytest.raises(OSError, match="short read of 9000 bytes") as e:
        splice.reply(ctypes.byref(vec), [splice.FileRange(source, len(FILE) - 8, 9000)], pipes)
    assert e.value.errno == 5


def test_a_short_file_range_is_an_eio(source):
    out = ctypes.create_string_buffer(16)
    with pytest.raises(OSError, match="short read of 16 bytes") as e:
        splice.copy_into(ctypes.addressof(out), [splice.FileRange(source, len(FILE) - 8, 16)])
    assert e.value.errno == 5


def test_the_pipes_of_finished_threads_are_closed(source):
    pipes, got, tids = splice.Pipes(), [], []

    def read() -> None:
        tids.append(threading.get_native_id())
        got.append(replied([b"h", splice.FileRange(source, 3, 9000)], pipes))  # two segments: through the pipe

    for _ in range(5):
        t = threading.Thread(target=read)
        t.start()
        t.join()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/self/task/{tids[-1]}") and time.monotonic() < deadline:
            time.sleep(0.001)  # join returns a moment before the OS thread is gone
    assert got == [(b"h" + FILE[3:9003], True)] * 5 and len(pipes) == 1  # each new thread closed the finished ones'
    pipes.close()
    assert len(pipes) == 0
