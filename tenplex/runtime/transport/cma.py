"""Agents on one machine without UCX: the receiver copies each message straight out of the
sender's memory (`process_vm_readv`, cross memory attach), one copy and no packing.

`CmaPeer` is what an agent started by `Runtime.local(transport="cma")` uses in place of a
`UcxPeer` when every peer is on its machine: it costs a Unix socket, not the ~0.3 CPU s of
loading UCX. Peers pair up over abstract Unix sockets (`connect` / `accept`; the peer's pid
comes from the kernel, `SO_PEERCRED`). `exchange(sends, recvs, work)` has `UcxPeer.exchange`'s
contract, but a buffer may be a list of strided numpy views (`takes_views`): the sender offers
each message as the (address, length) runs of its views (an OFFER frame, tag and runs), the
receiver reads them into the runs of its own views, merging both sides' runs, at most
`IOV_MAX` per system call, and answers DONE (status 0, or 1 when its views have another size,
which fails the sender's exchange too). A sender's views stay in place until their DONE
arrived. Offers for later rounds (a peer may be ahead: there is no barrier between rounds) wait
on the endpoint until their receive is posted. Every wait has the peer's deadline; a closed
peer, a timeout or a failed copy raise `TransportError` naming the peer and the message tag, a
raised `cancel` flag (`transport.errors`) `Cancelled` within a poll.

`unusable()` tells where the kernel forbids it (seccomp, Yama `ptrace_scope` >= 2); with
`ptrace_scope` 1 each peer allows processes of its user to read it (`PR_SET_PTRACER_ANY`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from tenplex.runtime.transport.errors import Cancel, TransportError

__all__ = ["CmaEndpoint", "CmaPeer", "iovecs", "pair", "unusable"]

IOV_MAX = 1024  # runs per process_vm_readv call (Linux UIO_MAXIOV)
HEAD = struct.Struct("<BxxxIQ")  # kind, count (runs of an OFFER, status of a DONE), tag
OFFER, DONE = 1, 2
_POLL_S = 0.1
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)

_libc = ctypes.CDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_readv.restype = ctypes.c_ssize_t
_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]


def unusable() -> str | None:
    """None when this process can read its peers' memory and be read by them, else why not."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except (OSError, ValueError):
        scope = 0
    if scope >= 2:
        return f"Yama ptrace_scope is {scope}"
    if scope == 1:  # siblings may read this process only if it says so
        _libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)
    src, dst = np.frombuffer(b"tenplex!", np.uint8), np.zeros(8, np.uint8)
    try:
        read(os.getpid(), iovecs([dst]), iovecs([src]))
    except TransportError as e:
        return str(e)
    return None if dst.tobytes() == b"tenplex!" else "process_vm_readv copied other bytes"


def iovecs(buffers: Iterable[Any]) -> np.ndarray:
    """The (address, length) runs of contiguous bytes of numpy views, in C order: int64 (n, 2)."""
    rows = []
    for buf in buffers:
        a = np.asarray(buf)
        if a.size == 0:
            continue
        run, k = a.itemsize, a.ndim
        while k > 0 and (a.shape[k - 1] == 1 or a.strides[k - 1] == run):  # the contiguous tail
            run *= a.shape[k - 1]
            k -= 1
        offsets = np.zeros(1, np.int64)
        for axis in range(k):
            offsets = (offsets[:, None] + np.arange(a.shape[axis], dtype=np.int64) * a.strides[axis]).ravel()
        rows.append(np.stack([offsets + a.__array_interface__["data"][0], np.full_like(offsets, run)], 1))
    return np.concatenate(rows) if rows else np.zeros((0, 2), np.int64)


def read(pid: int, local: np.ndarray, remote: np.ndarray) -> int:
    """Copy the bytes of `remote` runs in process `pid` into the `local` runs (same total)."""
    ca, cb = np.cumsum(local[:, 1]), np.cumsum(remote[:, 1])
    if (ca[-1] if len(ca) else 0) != (cb[-1] if len(cb) else 0):
        raise TransportError(
            f"{int(cb[-1]) if len(cb) else 0} B offered for {int(ca[-1]) if len(ca) else 0} B of views"
        )
    ends = np.union1d(ca, cb)  # both sides cut at every run end of either: equal segments
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    lens = ends - starts
    segs = []
    for runs, cum in ((local, ca), (remote, cb)):
        i = np.searchsorted(cum, starts, side="right")
        segs.append(np.ascontiguousarray(np.stack([runs[i, 0] + starts - (cum[i] - runs[i, 1]), lens], 1)))
    for at in range(0, len(lens), IOV_MAX):
        lo, ro = segs[0][at : at + IOV_MAX], segs[1][at : at + IOV_MAX]
        want = int(lo[:, 1].sum())
        got = _readv(pid, lo.ctypes.data, len(lo), ro.ctypes.data, len(ro), 0)
        if got != want:
            err = ctypes.get_errno()
            raise TransportError(
                f"process_vm_readv from pid {pid}: {got} of {want} B ({os.strerror(err) if got < 0 else 'short'})"
            )
    return int(lens.sum())


class CmaEndpoint:
    """One peer: a connected Unix socket, its pid, and the frames waiting either way."""

    mode = "cma"

    def __init__(self, sock: socket.socket, remote_name: str):
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        self.sock, self.remote_name, self.pid = sock, remote_name, pid
        self.inbox, self.outbox = bytearray(), bytearray()
        self.offers: dict[int, np.ndarray] = {}  # tag -> the sender's runs, until received
        self.acks: dict[int, int] = {}  # tag -> status of a DONE not yet taken
        sock.setblocking(False)

    def __repr__(self) -> str:
        return f"CmaEndpoint({self.remote_name!r}, pid {self.pid})"

    def pump(self, readable: bool, writable: bool) -> None:
        """Move bytes: queued frames out, arrived frames parsed into offers and acks."""
        if writable and self.outbox:
            try:
                del self.outbox[: self.sock.send(self.outbox)]
            except BlockingIOError:
                pass
            except OSError as e:  # the peer died: name it
                raise TransportError(f"connection to peer {self.remote_name!r} failed: {e}") from None
        if readable:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError as e:
                raise TransportError(f"connection to peer {self.remote_name!r} failed: {e}") from None
            if not data:
                raise TransportError(f"peer {self.remote_name!r} closed the connection")
            self.inbox += data
            self._parse()

    def _parse(self) -> None:
        while len(self.inbox) >= HEAD.size:
            kind, count, tag = HEAD.unpack_from(self.inbox)
            if kind == DONE:
                self.acks[tag] = count
                del self.inbox[: HEAD.size]
            elif kind == OFFER:
                end = HEAD.size + 16 * count
                if len(self.inbox) < end:
                    return
                self.offers[tag] = np.frombuffer(bytes(self.inbox[HEAD.size : end]), np.int64).reshape(count, 2)
                del self.inbox[:end]
            else:
                raise TransportError(f"peer {self.remote_name!r} sent a frame of unknown kind {kind}")


class CmaPeer:
    """This process's end (see the module docstring)."""

    takes_views = True

    def __init__(self, name: str, timeout: float = 30.0, cancel: Cancel | None = None):
        self.name, self.timeout = name, timeout
        self.cancel = cancel if cancel is not None else Cancel()  # raised: every exchange gives up within a poll
        self.path = f"\0tenplex-cma-{os.getpid()}-{secrets.token_hex(8)}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.endpoints: list[CmaEndpoint] = []

    @property
    def address(self) -> str:
        return self.path[1:]  # abstract socket name, without its leading NUL

    def connect(self, address: str, remote_name: str) -> CmaEndpoint:
        """Dial the peer `remote_name` at its `address` and say who this is."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect("\0" + address)
            name = self.name.encode()
            sock.sendall(struct.pack("<I", len(name)) + name)
        except OSError as e:
            sock.close()
            raise TransportError(f"peer {self.name!r}: connecting to {address!r} failed: {e}") from None
        return self._add(CmaEndpoint(sock, remote_name))

    def accept(self) -> CmaEndpoint:
        """The next peer that dialled in, named as it said."""
        self.listener.settimeout(self.timeout)
        try:
            sock, _ = self.listener.accept()
            sock.settimeout(self.timeout)
            (n,) = struct.unpack("<I", _recv_exactly(sock, 4))
            name = _recv_exactly(sock, n).decode()
        except (OSError, UnicodeDecodeError) as e:
            raise TransportError(f"peer {self.name!r}: accepting a peer failed: {e}") from None
        return self._add(CmaEndpoint(sock, name))

    def _add(self, ep: CmaEndpoint) -> CmaEndpoint:
        self.endpoints.append(ep)
        return ep

    def exchange(self, sends: list[tuple[CmaEndpoint, Any, int]], recvs: list[tuple[CmaEndpoint, Any, int]],
                 work: Iterable[Any] | None = None) -> None:  # fmt: skip
        """Send and receive a batch at once (see the module docstring); `work` runs meanwhile."""
        deadline = time.monotonic() + self.timeout
        wanted = {(ep, tag): (iovecs(_views(bufs, True)), ep) for ep, bufs, tag in recvs}
        waiting = {}
        for ep, bufs, tag in sends:
            runs = iovecs(_views(bufs, False))
            ep.outbox += HEAD.pack(OFFER, len(runs), tag) + runs.tobytes()
            waiting[(ep, tag)] = f"send of message {tag} to peer {ep.remote_name!r}"
        steps = iter(work) if work is not None else None
        while True:
            for ep, tag in [k for k in wanted if k[1] in k[0].offers]:
                self._receive(ep, tag, wanted.pop((ep, tag))[0])
            for ep, tag in [k for k in waiting if k[1] in k[0].acks]:
                if ep.acks.pop(tag):
                    raise TransportError(f"{waiting[(ep, tag)]}: the peer could not receive it")
                del waiting[(ep, tag)]
            if not wanted and not waiting and not any(ep.outbox for ep in self.endpoints):
                break
            if self.cancel.why is not None:
                self.cancel.check(f"peer {self.name!r}: exchange")
            if time.monotonic() > deadline:
                left = [f"receive of message {t} from {e.remote_name!r}" for e, t in wanted] + list(waiting.values())
                raise TransportError(f"peer {self.name!r}: exchange timed out; still waiting for {', '.join(left[:8])}")
            if steps is not None and next(steps, StopIteration) is StopIteration:
                steps = None
            self._poll(0.0 if steps is not None else _POLL_S)
        for _ in steps or ():
            pass

    def _receive(self, ep: CmaEndpoint, tag: int, runs: np.ndarray) -> None:
        try:
            read(ep.pid, runs, ep.offers.pop(tag))
        except TransportError as e:
            ep.outbox += HEAD.pack(DONE, 1, tag)
            with contextlib.suppress(TransportError):
                ep.pump(False, True)
            raise TransportError(f"receive of message {tag} from peer {ep.remote_name!r} failed: {e}") from None
        ep.outbox += HEAD.pack(DONE, 0, tag)

    def _poll(self, timeout: float) -> None:
        socks = {ep.sock: ep for ep in self.endpoints}
        readable, writable, _ = select.select(list(socks), [s for s, ep in socks.items() if ep.outbox], [], timeout)
        for sock in {*readable, *writable}:
            socks[sock].pump(sock in readable, sock in writable)

    def shutdown(self) -> None:
        for ep in self.endpoints:
            ep.sock.close()
        self.endpoints.clear()
        self.listener.close()


def _views(bufs: Any, writable: bool) -> list[np.ndarray]:
    views = list(bufs) if isinstance(bufs, (list, tuple)) else [bufs]
    if writable and not all(np.asarray(v).flags.writeable for v in views):
        raise TransportError("a receive buffer is read-only")
    return views


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def pair(peer: CmaPeer, me: str, addresses: dict[str, Any]) -> dict[str, CmaEndpoint]:
    """Endpoints to every host of `addresses` ({host: its `CmaPeer.address`}, this machine's
    other agents): dial those named after `me`, then accept those named before it, so the
    dialling order has no cycle and every pair connects once."""
    endpoints = {host: peer.connect(addresses[host], host) for host in sorted(h for h in addresses if h > me)}
    for _ in (h for h in addresses if h < me):
        ep = peer.accept()
        if ep.remote_name not in addresses or ep.remote_name in endpoints:
            raise TransportError(f"agent {me!r} accepted an unexpected peer {ep.remote_name!r}")
        endpoints[ep.remote_name] = ep
    return endpoints
