"""Messages between a store and the processes of its machine: a Unix stream socket carrying
frames of `<u4 length><u2 fd count>` + JSON, with the frame's file descriptors attached to its
first bytes (`SCM_RIGHTS`).

Invariants:
- a frame's JSON is at most MAX_BYTES and carries at most MAX_FDS descriptors;
- a received descriptor is owned by the receiver (closed on every error path here);
- `recv` returns None at a clean end of stream (the peer closed between frames).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import struct
from typing import Any

from tenplex.ir.errors import ExecutionError

HEADER = struct.Struct("<IH")
MAX_BYTES = 64 << 20
MAX_FDS = 250


class ShmError(ExecutionError):
    """The store's local connection failed or a request was refused; names the socket or path."""


def send(sock: socket.socket, message: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send one frame. Raises ShmError for a frame over the limits or a broken connection."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_BYTES or len(fds) > MAX_FDS:
        raise ShmError(f"a message of {len(body)} bytes with {len(fds)} descriptors is over the limits "
                       f"({MAX_BYTES} bytes, {MAX_FDS} descriptors)")  # fmt: skip
    head = HEADER.pack(len(body), len(fds))
    try:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sent = sock.sendmsg([head + body], ancillary)
        if sent < len(head) + len(body):
            sock.sendall((head + body)[sent:])
    except OSError as e:
        raise ShmError(f"sending to the store's local socket failed: {e}") from None


def recv(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One frame: (message, descriptors), or None at a clean end of stream. Raises ShmError."""
    fds: list[int] = []
    try:
        data, ancdata, _, _ = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", raw[: len(raw) - len(raw) % 4]).tolist()
        if not data:
            return None
        data += _exactly(sock, HEADER.size - len(data))
        length, count = HEADER.unpack(data)
        if length > MAX_BYTES or count != len(fds):
            raise ShmError(f"a frame of {length} bytes announcing {count} descriptors arrived with {len(fds)}")
        message = json.loads(_exactly(sock, length))
        return message, fds
    except BaseException as e:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if isinstance(e, ShmError):
            raise
        if isinstance(e, (OSError, ValueError)):
            raise ShmError(f"receiving from the store's local socket failed: {e}") from None
        raise


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ShmError(f"the peer closed the connection in the middle of a frame ({len(out)} of {n} bytes)")
        out += chunk
    return bytes(out)
