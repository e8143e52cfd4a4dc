"""The agent control connection: framed messages (`wire`) over a socket, every operation with a
deadline, and a mutual HMAC handshake that is itself bounded in time.

Addresses: a filesystem path is a Unix socket (mode 0600; reachable from other network namespaces
of the same machine), `HOST:PORT` (IPv6 as `[::1]:PORT`) is TCP and needs a token. A runtime
`dial`s, an agent `listen`s and `accept`s; both then run the handshake (`HANDSHAKE_S` at most):

    agent   -> runtime  {"hello": "tenplex-agent", "version": 1, "name", "challenge", "token": bool}
    runtime -> agent    {"hello": "tenplex-runtime", "version": 1, "proof", "challenge"}
    agent   -> runtime  {"ok": true, "proof"}  or  {"ok": false, "error"}

`proof` is HMAC-SHA256(token, role + challenge): each side proves it knows the token without
sending it. Without a token (Unix sockets) the proofs are empty and file permissions protect.

Invariants:
- `send` and `recv` return, or raise `ChannelError` once the peer made no progress for their
  `idle` seconds or their `total` passed; after an error the channel is closed (a half-sent
  frame cannot be continued);
- a peer that does not complete the handshake in time, or fails it, is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from tenplex.runtime.agent.wire import MAGIC, PREFIX, WireError, decode, encode, parse_prefix

__all__ = ["HANDSHAKE_S", "Channel", "ChannelError", "accept", "dial", "frame", "listen", "parse_address"]

VERSION = 1
HANDSHAKE_S = 5.0


class ChannelError(WireError):
    """The control connection failed: a deadline passed, the peer closed it, or it sent garbage."""


def parse_address(address: str) -> tuple[int, Any]:
    """(socket family, address) of a control address. Raises ChannelError naming it."""
    if "/" in address or ":" not in address:
        return socket.AF_UNIX, address
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port.isdecimal() or not 0 <= int(port) <= 65535 or not host:
        raise ChannelError(f"control address {address!r}: expected a socket path or HOST:PORT with a port in 0..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, int(port))


class Channel:
    """One end of a control connection. `send` may be called from two threads (a reply and
    heartbeats); `recv` from one. Every wait is bounded: `idle` is the longest the peer may make
    no progress (None: no bound), `total` bounds the whole operation."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self._send_lock = threading.Lock()
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, value: Any, idle: float, total: float | None = None) -> None:
        """Send one message. Raises WireError (nothing sent) for a value the wire cannot carry,
        ChannelError (channel closed) when the peer stops taking bytes for `idle` seconds."""
        self.send_frame(frame(value), idle, total)

    def send_frame(self, parts: list[Any], idle: float, total: float | None = None) -> None:
        """Send one message encoded by `frame` (as `send`, which encodes and sends at once)."""
        deadline = None if total is None else time.monotonic() + total
        with self._send_lock:
            for part in parts:
                self._send_all(memoryview(part).cast("B"), idle, deadline)

    def recv(self, idle: float | None, total: float | None = None) -> Any:
        """The next message, once its first byte came within `idle` seconds (None: wait forever)."""
        deadline = None if total is None else time.monotonic() + total
        try:
            size, count = parse_prefix(bytes(self._recv_exact(PREFIX.size, idle, deadline)))
            header = bytes(self._recv_exact(size, idle, deadline))
            sizes = _buffer_sizes(header, count)
            return decode(header, [self._recv_exact(n, idle, deadline) for n in sizes])
        except WireError as e:
            self.close()
            raise ChannelError(f"control connection to {self.peer}: {e}") from None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()

    @staticmethod
    def _wait(idle: float | None, deadline: float | None) -> float | None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return 0.0
        return left if idle is None else idle if left is None else min(idle, left)

    def _send_all(self, view: memoryview, idle: float, deadline: float | None) -> None:
        while view.nbytes:
            wait = self._wait(idle, deadline)
            if wait == 0.0 or self.closed:
                self.close()
                raise ChannelError(f"control connection to {self.peer}: send not finished before its deadline")
            self.sock.settimeout(wait)
            try:
                view = view[self.sock.send(view) :]
            except TimeoutError:
                self.close()
                raise ChannelError(f"control connection to {self.peer}: the peer took no bytes for {wait:.0f} s "
                                   "(stopped or hung?)") from None  # fmt: skip
            except OSError as e:
                self.close()
                raise ChannelError(f"control connection to {self.peer} broken: {e.strerror or e}") from None

    def _recv_exact(self, n: int, idle: float | None, deadline: float | None) -> memoryview:
        out = memoryview(bytearray(n))
        got = 0
        while got < n:
            wait = self._wait(idle, deadline)
            if wait == 0.0 or self.closed:
                raise WireError("no message before the deadline")
            self.sock.settimeout(wait)
            try:
                k = self.sock.recv_into(out[got:])
            except TimeoutError:
                raise WireError(f"the peer sent nothing for {wait:.0f} s (stopped or hung?)") from None
            except OSError as e:
                raise WireError(f"broken ({e.strerror or e})") from None
            if k == 0:
                raise WireError("closed by the peer" if got == 0 else "closed by the peer in the middle of a frame")
            got += k
        return out


def frame(value: Any) -> list[Any]:
    """The parts of one message's frame (prefix, header, buffers) for `Channel.send_frame`.
    Raises WireError for a value the wire cannot carry."""
    header, buffers = encode(value)
    return [PREFIX.pack(MAGIC, len(header), len(buffers)), header, *buffers]


def _buffer_sizes(header: bytes, count: int) -> list[int]:
    try:
        sizes = json.loads(header).get("n")
    except (ValueError, AttributeError):
        raise WireError("frame header is not a JSON object") from None
    if not isinstance(sizes, list) or len(sizes) != count or not all(type(n) is int and 0 <= n < 1 << 40 for n in sizes):
        raise WireError(f"frame header lists buffer sizes {str(sizes)[:80]} for {count} buffers")
    return sizes


def _proof(token: str | None, role: bytes, challenge: bytes) -> str:
    if not token:
        return ""
    return hmac.new(token.encode(), b"tenplex-control/1 " + role + challenge, hashlib.sha256).hexdigest()


def listen(address: str, token: str | None) -> socket.socket:
    """A listening socket for an agent. A Unix socket left behind by a dead agent is replaced;
    one that another agent still listens on is an error. Raises ChannelError naming the address."""
    family, addr = parse_address(address)
    if family != socket.AF_UNIX and not token:
        raise ChannelError(f"control address {address}: TCP needs a token (--token-file or $TENPLEX_AGENT_TOKEN)")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_UNIX:
            _claim_unix_path(addr)
            old = os.umask(0o177)
            try:
                sock.bind(addr)
            finally:
                os.umask(old)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        sock.listen(16)
    except OSError as e:
        sock.close()
        raise ChannelError(f"control address {address}: cannot listen: {e.strerror or e}") from None
    return sock


def _claim_unix_path(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # a socket file whose agent is gone
        return
    except OSError as e:
        raise ChannelError(f"control socket {path} exists and is not usable ({e.strerror or e}); remove it") from None
    finally:
        probe.close()
    raise ChannelError(f"control socket {path} is in use by another agent")


def accept(listener: socket.socket, name: str, token: str | None, poll: float = 0.5) -> Channel | None:
    """The next runtime that completes the handshake within `HANDSHAKE_S`, or None after `poll`
    seconds without one (so that the caller's signal handlers run; see `server`). Raises
    ChannelError for a client that failed the handshake (the caller logs it and goes on)."""
    listener.settimeout(poll)
    try:
        sock, where = listener.accept()
    except TimeoutError:
        return None
    channel = Channel(sock, str(where or "unix socket"))
    try:
        challenge = secrets.token_bytes(32)
        channel.send({"hello": "tenplex-agent", "version": VERSION, "name": name, "challenge": challenge,
                      "token": bool(token)}, HANDSHAKE_S, HANDSHAKE_S)  # fmt: skip
        reply = channel.recv(HANDSHAKE_S, HANDSHAKE_S)
        if not isinstance(reply, dict) or reply.get("hello") != "tenplex-runtime" or reply.get("version") != VERSION:
            raise ChannelError(f"{channel.peer}: not a tenplex runtime (hello {str(reply)[:60]})")
        if not hmac.compare_digest(str(reply.get("proof", "")), _proof(token, b"runtime", challenge)):
            channel.send({"ok": False, "error": "wrong token"}, HANDSHAKE_S, HANDSHAKE_S)
            raise ChannelError(f"{channel.peer}: wrong token")
        their = reply.get("challenge")
        if not isinstance(their, bytes) or len(their) != 32:
            raise ChannelError(f"{channel.peer}: malformed challenge")
        channel.send({"ok": True, "proof": _proof(token, b"agent", their)}, HANDSHAKE_S, HANDSHAKE_S)
    except ChannelError:
        channel.close()
        raise
    return channel


def dial(address: str, token: str | None, timeout: float) -> tuple[Channel, str]:
    """(channel, agent name) of the agent at `address`, retried until `timeout` while it starts.
    Raises ChannelError naming the address."""
    family, addr = parse_address(address)
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
        try:
            sock.connect(addr)
            break
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError) as e:
            sock.close()
            if time.monotonic() > deadline:
                raise ChannelError(f"no agent answers at {address}: {e.strerror or e}") from None
            time.sleep(0.05)
        except OSError as e:
            sock.close()
            raise ChannelError(f"cannot reach the agent at {address}: {e.strerror or e}") from None
    channel = Channel(sock, address)
    try:
        wait = max(HANDSHAKE_S, deadline - time.monotonic())  # the agent may be busy with another client
        hello = channel.recv(wait, wait)
        if not isinstance(hello, dict) or hello.get("hello") != "tenplex-agent" or hello.get("version") != VERSION:
            raise ChannelError(f"{address}: not a tenplex agent (hello {str(hello)[:60]})")
        if not isinstance(hello.get("challenge"), bytes) or len(hello["challenge"]) != 32:
            raise ChannelError(f"{address}: malformed agent challenge")
        if hello.get("token") and not token:
            raise ChannelError(f"the agent at {address} needs a token (TENPLEX_AGENT_TOKEN)")
        mine = secrets.token_bytes(32)
        channel.send({"hello": "tenplex-runtime", "version": VERSION, "challenge": mine,
                      "proof": _proof(token, b"runtime", hello["challenge"])}, HANDSHAKE_S, HANDSHAKE_S)  # fmt: skip
        answer = channel.recv(HANDSHAKE_S, HANDSHAKE_S)
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise ChannelError(f"the agent at {address} rejected the connection (wrong token?)")
        if not hmac.compare_digest(str(answer.get("proof", "")), _proof(token, b"agent", mine)):
            raise ChannelError(f"the agent at {address} did not prove it knows the token")
    except ChannelError as e:
        channel.close()
        if "rejected" in str(e) or "token" in str(e) or "not a tenplex" in str(e):
            raise
        raise ChannelError(f"the agent at {address} rejected the connection (wrong token?): {e}") from None
    return channel, str(hello.get("name"))
