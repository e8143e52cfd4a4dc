"""Point-to-point UCX transport between processes (`ucxx-cu12`, synchronous core API).

Design: one `UcxPeer` per process owns a UCX context and worker in *blocking* progress mode
(`init_blocking_progress_mode`). There is no progress thread and no event loop: every call
posts non-blocking UCX requests and then progresses the worker in the caller's thread with
`progress_worker_event(epoll_timeout)` (sleeping on the worker's epoll fd, waking at least every
100 ms) until the requests complete or the call's deadline passes. A peer is therefore used by
one thread at a time. Every wait has a deadline; on expiry a `TransportError` names the peer and
the operation, in-flight requests are cancelled and their buffers are kept alive (never freed
under UCX), and the peer should be closed.

Endpoints:
- `connect(address)`: from a worker address exchanged out of band (`peer.address`), without
  endpoint error handling, so UCX picks shared memory on one host (~memcpy speed). A dead peer
  is detected by timeouts only. Both sides connect to each other's address (a worker-address
  endpoint is one-way for replies).
- `listen()` / `accept()` and `connect_tcp(host, port)`: listener endpoints (TCP, with error
  handling, so a dead peer fails requests), for peers on different hosts; a fixed-size hello
  over the UCX stream API tells each side the other's id and name. TCP segments are 512 KiB.

Messages: `send(ep, buffer, tag)` sends a 40-byte header (message id, nbytes, sequence) and the
payload (zero copy; numpy or, where UCX has CUDA support, CUDA-array-interface objects);
`recv(ep_or_ANY, out, tag)` receives the header, then the payload straight into `out`.
Wire format: `ucx.wire`. `close(ep)` is acknowledged: each side sends FIN after its last
send and closes only after the other side's FIN arrived, so no close races a pending message.

Env: importing sets `UCX_WARN_UNUSED_ENV_VARS=n` (unless set); the context gets
`TCP_TX_SEG_SIZE`/`TCP_RX_SEG_SIZE=512k` unless `UCX_TCP_*_SEG_SIZE` are set in the environment.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from tenplex.runtime.transport.ucx.wire import (
    ANY_SOURCE_MASK,
    DATA,
    FIN,
    FULL_MASK,
    HDR,
    HEADER_SIZE,
    HELLO_SIZE,
    ID_BITS,
    TransportError,
    check_user_tag,
    make_tag,
    pack_address,
    pack_header,
    pack_hello,
    unpack_address,
    unpack_header,
    unpack_hello,
)

__all__ = ["ANY", "Received", "TransportError", "UcxEndpoint", "UcxPeer", "ucx_available"]

ANY = None  # `recv(ANY, ...)`: from any connected sender
_POLL_MS = 100
_DONE = object()
_SEG = "512k"


def import_ucx() -> Any:
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    try:
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array
    except ImportError as e:  # pragma: no cover - depends on the install
        raise TransportError(f"UCX transport needs ucxx-cu12 (pip install ucxx-cu12): {e}") from e
    return ucx_api, Array


def ucx_available() -> str | None:
    """None when ucxx imports, else the reason it does not."""
    try:
        import_ucx()
    except TransportError as e:
        return str(e)
    return None


class _Timeout(TransportError):
    """A wait reached its deadline."""


class Received(NamedTuple):
    message_id: int
    data: np.ndarray  # a view of the first nbytes of the out buffer (or the out object itself)
    sender: str


class UcxEndpoint:
    """A connection to one remote peer (from `UcxPeer.connect*` / `accept`)."""

    def __init__(self, ep: Any, remote_id: int, remote_name: str, mode: str):
        self._ep = ep
        self.remote_id = remote_id
        self.remote_name = remote_name
        self.mode = mode  # "address" (shared memory on one host) or "tcp"
        self.closed = False

    def __repr__(self) -> str:
        return f"UcxEndpoint({self.remote_name!r}, {self.mode})"


def _as_bytes(buf: Any, writable: bool, what: str) -> Any:
    """A zero-copy uint8 view of a contiguous numpy array; CUDA arrays pass through."""
    if hasattr(buf, "__cuda_array_interface__") and not isinstance(buf, np.ndarray):
        return buf
    if not isinstance(buf, np.ndarray):
        raise TransportError(f"{what}: expected a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise TransportError(f"{what}: buffer must be C-contiguous")
    if writable and not buf.flags.writeable:
        raise TransportError(f"{what}: buffer is read-only")
    return buf.reshape(-1).view(np.uint8)


class UcxPeer:
    """One process's UCX worker. `timeout` (s) bounds every wait unless a call overrides it."""

    def __init__(self, name: str = "", timeout: float = 30.0):
        api, self._Array = import_ucx()
        self._api = api
        self.name = name or f"pid{os.getpid()}"
        self.timeout = timeout
        self.id = secrets.randbits(ID_BITS) or 1
        config = {k: _SEG for k in ("TCP_TX_SEG_SIZE", "TCP_RX_SEG_SIZE") if f"UCX_{k}" not in os.environ}
        self._ctx = api.UCXContext(config, feature_flags=(api.Feature.TAG, api.Feature.WAKEUP, api.Feature.STREAM))
        self._worker = api.UCXWorker(self._ctx)
        self._worker.init_blocking_progress_mode()
        self._names: dict[int, str] = {}
        self._endpoints: list[UcxEndpoint] = []
        self._seq = 0
        self._listener: Any = None
        self._pending: collections.deque = collections.deque()
        self._abandoned: list = []  # buffers of cancelled requests, kept alive
        self.address = pack_address(self.id, self.name, bytes(self._worker.address.tobytes()))

    # ---- waiting -----------------------------------------------------------------------
    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _progress_until(self, done: Any, deadline: float, what: str, work: Iterator[Any] | None = None) -> None:
        """Progress the worker until `done()`; between progress calls, run `work` items one at a
        time (non-blocking progress while there is work, sleeping on the worker's fd after)."""
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout(f"{what}: timed out (peer {self.name!r})")
            if work is not None and next(work, _DONE) is not _DONE:
                self._worker.progress()
                continue
            work = None
            self._worker.progress_worker_event(epoll_timeout=max(1, min(_POLL_MS, int(left * 1000))))
        for _ in work or ():  # the transfers finished first: the rest of the work now
            pass

    def _wait(self, reqs: list, keep: list, deadline: float, what: str, peer: str) -> None:
        try:
            self._progress_until(lambda: all(r.completed for r in reqs), deadline, what)
        except _Timeout:
            self._abandon(keep)
            raise TransportError(f"{what}: no progress from peer {peer!r} before the timeout; it may be dead") from None
        for r in reqs:
            try:
                r.check_error()
            except Exception as e:  # UCXError subclasses: connection reset, canceled, truncated
                raise TransportError(f"{what} with peer {peer!r} failed: {type(e).__name__}: {e}") from e

    def _abandon(self, keep: list) -> None:
        self._abandoned.append(keep)
        with contextlib.suppress(Exception):  # best effort on a failure path
            self._worker.cancel_inflight_requests()

    # ---- endpoints ---------------------------------------------------------------------
    def connect(self, address: bytes) -> UcxEndpoint:
        """An endpoint from a peer's `address` (shared memory on one host; no error handling)."""
        remote_id, remote_name, ucx_addr = unpack_address(address)
        self._check_remote(remote_id, remote_name)
        addr = self._api.UCXAddress.create_from_buffer(np.frombuffer(ucx_addr, dtype=np.uint8))
        try:
            ep = self._api.UCXEndpoint.create_from_worker_address(self._worker, addr, False)
        except Exception as e:
            raise TransportError(f"connect to peer {remote_name!r} failed: {e}") from e
        self._worker.progress()
        return self._register(UcxEndpoint(ep, remote_id, remote_name, "address"))

    def listen(self, port: int = 0) -> int:
        """Start a TCP listener (all interfaces; port 0 picks a free one); returns the port."""
        if self._listener is None:

            def on_request(conn_request: int) -> None:
                self._pending.append(self._listener.create_endpoint_from_conn_request(conn_request, True))

            self._listener = self._api.UCXListener.create(worker=self._worker, port=port, cb_func=on_request)
        return int(self._listener.port)

    def accept(self, timeout: float | None = None) -> UcxEndpoint:
        """The next TCP connection to this peer's listener (after `listen`)."""
        if self._listener is None:
            raise TransportError(f"accept on peer {self.name!r} before listen()")
        deadline = self._deadline(timeout)
        self._progress_until(lambda: bool(self._pending), deadline, f"accept on peer {self.name!r}")
        return self._hello(self._pending.popleft(), deadline, "accepted connection")

    def connect_tcp(self, host: str, port: int, timeout: float | None = None) -> UcxEndpoint:
        """A TCP endpoint to a peer listening on host:port (between hosts)."""
        try:
            ep = self._api.UCXEndpoint.create(self._worker, host, port, True)
        except Exception as e:
            raise TransportError(f"connect to {host}:{port} failed: {e}") from e
        return self._hello(ep, self._deadline(timeout), f"{host}:{port}")

    def _hello(self, ep: Any, deadline: float, who: str) -> UcxEndpoint:
        mine = np.frombuffer(pack_hello(self.id, self.name), dtype=np.uint8).copy()
        theirs = np.zeros(HELLO_SIZE, dtype=np.uint8)
        A = self._Array
        reqs = [ep.stream_send(A(mine)), ep.stream_recv(A(theirs))]
        self._wait(reqs, [ep, mine, theirs], deadline, "TCP hello", who)
        remote_id, remote_name = unpack_hello(theirs.tobytes())
        self._check_remote(remote_id, remote_name)
        return self._register(UcxEndpoint(ep, remote_id, remote_name, "tcp"))

    def _check_remote(self, remote_id: int, remote_name: str) -> None:
        if remote_id == self.id:
            raise TransportError(f"peer {remote_name!r} has the same id as {self.name!r}; recreate one of them")

    def _register(self, ep: UcxEndpoint) -> UcxEndpoint:
        self._names[ep.remote_id] = ep.remote_name
        self._endpoints.append(ep)
        return ep

    # ---- messages ----------------------------------------------------------------------
    def send(
        self, ep: UcxEndpoint, buffer: Any, tag: int = 0, message_id: int | None = None, timeout: float | None = None
    ) -> int:
        """Send `buffer` (zero copy) as one message; returns its message id."""
        check_user_tag(tag)
        self._check_open(ep)
        A = self._Array
        payload = _as_bytes(buffer, False, f"send to {ep.remote_name!r}")
        arr = A(payload)
        self._seq += 1
        message_id = self._seq if message_id is None else message_id
        header = np.frombuffer(pack_header(self.id, message_id, arr.nbytes, self._seq), dtype=np.uint8).copy()
        T = self._api.UCXXTag
        reqs = [ep._ep.tag_send(A(header), T(make_tag(HDR, self.id, tag)))]
        if arr.nbytes:
            reqs.append(ep._ep.tag_send(arr, T(make_tag(DATA, self.id, self._seq))))
        self._wait(
            reqs,
            [header, arr, payload],
            self._deadline(timeout),
            f"send of message {message_id} ({arr.nbytes} B, tag {tag})",
            ep.remote_name,
        )
        return message_id

    def recv(self, source: UcxEndpoint | None, out: Any, tag: int = 0, timeout: float | None = None) -> Received:
        """Receive one message with `tag` from `source` (or ANY) into `out` (preallocated)."""
        check_user_tag(tag)
        A, T, M = self._Array, self._api.UCXXTag, self._api.UCXXTagMask
        src = 0 if source is None else source.remote_id
        peer = "any" if source is None else source.remote_name
        if source is not None:
            self._check_open(source)
        deadline = self._deadline(timeout)
        header = np.zeros(HEADER_SIZE, dtype=np.uint8)
        mask = ANY_SOURCE_MASK if source is None else FULL_MASK
        req = self._worker.tag_recv(A(header), T(make_tag(HDR, src, tag)), M(mask))
        self._wait([req], [header], deadline, f"recv of a header (tag {tag})", peer)
        sender, message_id, nbytes, seq = unpack_header(header.tobytes())
        peer = self._names.get(sender, f"id {sender}")
        view = _as_bytes(out, True, f"recv from {peer!r}")
        capacity = A(view).nbytes
        if nbytes > capacity:
            raise TransportError(
                f"message {message_id} from peer {peer!r} has {nbytes} B; the out buffer holds {capacity} B"
            )
        if isinstance(view, np.ndarray):
            view = view[:nbytes]
        if nbytes:
            arr = A(view)
            req = self._worker.tag_recv(arr, T(make_tag(DATA, sender, seq)), M(FULL_MASK))
            self._wait([req], [arr, view], deadline, f"recv of message {message_id} ({nbytes} B)", peer)
        return Received(message_id, view, peer)

    def exchange(self, sends: list[tuple[UcxEndpoint, Any, int]], recvs: list[tuple[UcxEndpoint, Any, int]],
                 timeout: float | None = None, work: Iterable[Any] | None = None) -> list[Received]:  # fmt: skip
        """Post every send `(ep, buffer, message id)` and receive `(ep, out, message id)` at once
        and progress them together until all complete (one deadline for the whole batch).
        `work`: an iterable that does a small piece of other work per item (e.g. local copies),
        consumed between progress calls so that it overlaps the transfers; always consumed fully.

        The message id is also the tag: each receive matches exactly the send with the same id
        from that peer. Returns the receives in order. Sends and receives overlap with each
        other and across peers, so a host exchanging with several peers keeps every link busy.
        """
        from tenplex.runtime.transport.ucx.exchange import Exchange

        return Exchange(self, timeout).run(sends, recvs, work)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ---- closing -----------------------------------------------------------------------
    def _check_open(self, ep: UcxEndpoint) -> None:
        if ep.closed:
            raise TransportError(f"endpoint to peer {ep.remote_name!r} is closed")

    def close(self, ep: UcxEndpoint, timeout: float | None = None) -> None:
        """Acknowledged close: send FIN, wait for the peer's FIN, then close the endpoint.

        Both sides call it after their last send/recv on the connection.
        """
        if ep.closed:
            return
        A, T = self._Array, self._api.UCXXTag
        mine = np.frombuffer(pack_header(self.id, 0, 0, 0), dtype=np.uint8).copy()
        theirs = np.zeros(HEADER_SIZE, dtype=np.uint8)
        reqs = [
            self._worker.tag_recv(A(theirs), T(make_tag(FIN, ep.remote_id, 0))),
            ep._ep.tag_send(A(mine), T(make_tag(FIN, self.id, 0))),
        ]
        try:
            self._wait(reqs, [mine, theirs], self._deadline(timeout), "acknowledged close", ep.remote_name)
        finally:
            self._drop(ep)

    def _drop(self, ep: UcxEndpoint) -> None:
        ep.closed = True
        with contextlib.suppress(Exception):  # closing a broken endpoint
            ep._ep.close_blocking()
        if ep in self._endpoints:
            self._endpoints.remove(ep)

    def shutdown(self) -> None:
        """Close every endpoint without acknowledgement (after errors) and stop listening."""
        for ep in list(self._endpoints):
            self._drop(ep)
        self._listener = None
        self._pending.clear()

    def __enter__(self) -> UcxPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
