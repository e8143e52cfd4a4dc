"""`UcxPeer.exchange`: a batch of sends and receives posted at once and progressed together.

Sends post the 40-byte header (tag HDR | sender | message id) and the payload (tag DATA |
sender | sequence) at once. Receives post the header first; when a header arrives, the payload
receive is posted straight into the caller's buffer (checked against the header's size). The
batch ends when every request completed; on a timeout or a failure every in-flight request is
cancelled and its buffers are kept alive (never freed under UCX).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tenplex.runtime.transport.ucx.wire import (
    DATA,
    FULL_MASK,
    HDR,
    HEADER_SIZE,
    TransportError,
    check_user_tag,
    make_tag,
    pack_header,
    unpack_header,
)
from tenplex.runtime.transport.ucx.worker import Received, Timeout, UcxEndpoint, Worker, as_bytes


class Exchange:
    def __init__(self, peer: Worker, timeout: float | None):
        self.peer, self.deadline = peer, peer._deadline(timeout)
        self.A, self.T, self.M = peer._Array, peer._api.UCXXTag, peer._api.UCXXTagMask
        self.keep: list = []  # buffers UCX may still use
        self.reqs: list = []
        self.pending: list[list] = []  # [header request, header, ep, out, message id] until the payload is posted
        self.results: list[Received | None] = []

    def run(self, sends: list[tuple[UcxEndpoint, Any, int]], recvs: list[tuple[UcxEndpoint, Any, int]],
            work: Iterable[Any] | None) -> list[Received]:  # fmt: skip
        for ep, buffer, message_id in sends:
            self._send(ep, buffer, message_id)
        for ep, out, message_id in recvs:
            self._post_header(ep, out, message_id)
        self.results = [None] * len(recvs)
        what = f"exchange of {len(sends)} sends and {len(recvs)} receives"
        try:
            self.peer._progress_until(self._post_payloads, self.deadline, what, iter(work) if work is not None else None)
        except TransportError as e:
            self.peer._abandon(self.keep + self.reqs)
            if not isinstance(e, Timeout):
                raise
            waiting = [item[4] for item in self.pending if item[0] is not None]
            raise TransportError(f"{what}: timed out (peer {self.peer.name!r}); headers still missing for messages "
                                 f"{waiting[:8]}{'...' if len(waiting) > 8 else ''}") from None  # fmt: skip
        except BaseException:  # the caller's work failed: UCX may still use the buffers
            self.peer._abandon(self.keep + self.reqs)
            raise
        for r in self.reqs:
            try:
                r.check_error()
            except Exception as e:
                raise TransportError(f"{what} failed: {type(e).__name__}: {e}") from e
        return self.results  # type: ignore[return-value]

    def _send(self, ep: UcxEndpoint, buffer: Any, message_id: int) -> None:
        A, T, peer = self.A, self.T, self.peer
        check_user_tag(message_id)
        peer._check_open(ep)
        arr = A(as_bytes(buffer, False, f"send of message {message_id} to {ep.remote_name!r}"))
        seq = peer._next_seq()
        header = np.frombuffer(pack_header(peer.id, message_id, arr.nbytes, seq), dtype=np.uint8).copy()
        self.keep += [arr, header]
        self.reqs.append(ep._ep.tag_send(A(header), T(make_tag(HDR, peer.id, message_id))))
        if arr.nbytes:
            self.reqs.append(ep._ep.tag_send(arr, T(make_tag(DATA, peer.id, seq))))

    def _post_header(self, ep: UcxEndpoint, out: Any, message_id: int) -> None:
        check_user_tag(message_id)
        self.peer._check_open(ep)
        header = np.zeros(HEADER_SIZE, dtype=np.uint8)
        tag = self.T(make_tag(HDR, ep.remote_id, message_id))
        req = self.peer._worker.tag_recv(self.A(header), tag, self.M(FULL_MASK))
        self.keep.append(header)
        self.pending.append([req, header, ep, out, message_id])

    def _post_payloads(self) -> bool:
        """Post the payload receive of every header that arrived; True once everything completed."""
        for i, item in enumerate(self.pending):
            req, header, ep, out, message_id = item
            if req is None or not req.completed:
                continue
            try:
                req.check_error()
            except Exception as e:
                raise TransportError(f"recv of message {message_id} from peer {ep.remote_name!r} failed: "
                                     f"{type(e).__name__}: {e}") from e  # fmt: skip
            self.results[i] = self._post_payload(header, ep, out, message_id)
            item[0] = None
        return all(item[0] is None for item in self.pending) and all(r.completed for r in self.reqs)

    def _post_payload(self, header: np.ndarray, ep: UcxEndpoint, out: Any, message_id: int) -> Received:
        A = self.A
        _, got_id, nbytes, seq = unpack_header(header.tobytes())
        view = as_bytes(out, True, f"recv of message {message_id} from {ep.remote_name!r}")
        if got_id != message_id or nbytes > A(view).nbytes:
            raise TransportError(f"message {got_id} of {nbytes} B from peer {ep.remote_name!r} does not fit "
                                 f"the receive of message {message_id} ({A(view).nbytes} B)")  # fmt: skip
        if isinstance(view, np.ndarray):
            view = view[:nbytes]
        if nbytes:
            arr = A(view)
            self.keep.append(arr)
            self.reqs.append(self.peer._worker.tag_recv(arr, self.T(make_tag(DATA, ep.remote_id, seq)), self.M(FULL_MASK)))
        return Received(message_id, view, ep.remote_name)
