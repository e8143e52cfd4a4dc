"""Point-to-point UCX transport between processes (`ucxx-cu12`, synchronous core API).

Design: one `UcxPeer` per process, a `Worker` (`worker`: the UCX context and worker in blocking
progress mode, every wait with a deadline; used by one thread at a time) with endpoints and
messages on top.

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
"""


from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tenplex.runtime.transport.ucx.exchange import Exchange
from tenplex.runtime.transport.ucx.wire import (
    ANY_SOURCE_MASK,
    DATA,
    FIN,
    FULL_MASK,
    HDR,
    HEADER_SIZE,
    HELLO_SIZE,
    TransportError,
    check_user_tag,
    make_tag,
    pack_header,
    pack_hello,
    unpack_address,
    unpack_header,
    unpack_hello,
)
from tenplex.runtime.transport.ucx.worker import Received, UcxEndpoint, Worker, as_bytes

__all__ = ["ANY", "UcxPeer"]

ANY = None  # `recv(ANY, ...)`: from any connected sender


class UcxPeer(Worker):
    """One process's UCX endpoint of the transport: connects, sends and receives (see the module doc)."""

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

    # ---- messages ----------------------------------------------------------------------
    def send(
        self, ep: UcxEndpoint, buffer: Any, tag: int = 0, message_id: int | None = None, timeout: float | None = None
    ) -> int:
        """Send `buffer` (zero copy) as one message; returns its message id."""
        check_user_tag(tag)
        self._check_open(ep)
        A = self._Array
        payload = as_bytes(buffer, False, f"send to {ep.remote_name!r}")
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
        view = as_bytes(out, True, f"recv from {peer!r}")
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

    def exchange(self, sends: list[tuple], recvs: list[tuple],
                 timeout: float | None = None, work: Iterable[Any] | None = None,
                 finish_work: bool = True) -> list[Received]:  # fmt: skip
        """Post every send `(ep, buffer, message id)` and receive `(ep, out, message id)` at once
        (a fourth item, `wire.CTL`, puts a control message in its own id space) and progress them
        together until all complete (one deadline for the whole batch).
        `work`: an iterable that does a small piece of other work per item (e.g. local copies),
        consumed between progress calls so that it overlaps the transfers; consumed fully unless
        `finish_work` is False (then what is left when the batch completes stays in the iterator).
        A send whose buffer is a callable is staged: called (to pack its buffer) and posted one per
        progress step after every ready send and before `work`, so the ready ones travel meanwhile.

        The message id is also the tag: each receive matches exactly the send with the same id
        from that peer, and must be exactly its size (no header travels: `exchange`). Returns the
        receives in order, each the whole out buffer. Sends and receives overlap with each other
        and across peers, so a host exchanging with several peers keeps every link busy.
        """
        return Exchange(self, timeout).run(sends, recvs, work, finish_work)

    # ---- closing -----------------------------------------------------------------------
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

    def __enter__(self) -> UcxPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
