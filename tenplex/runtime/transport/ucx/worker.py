"""The UCX worker under `UcxPeer`: context, worker, waiting with deadlines, endpoint bookkeeping.

One `Worker` per process owns a UCX context and worker in *blocking* progress mode
(`init_blocking_progress_mode`). There is no progress thread and no event loop: every call
posts non-blocking UCX requests and then progresses the worker in the caller's thread with
`progress_worker_event(epoll_timeout)` (sleeping on the worker's epoll fd, waking at least every
100 ms) until the requests complete or the call's deadline passes. A worker is therefore used by
one thread at a time. Every wait has a deadline; on expiry a `TransportError` names the peer and
the operation, in-flight requests are cancelled and their buffers are kept alive (never freed
under UCX), and the peer should be closed. A raised `cancel` flag (`transport.errors`: the runtime
says a peer of the running command failed) ends a wait the same way within a poll (`Cancelled`).

Env: importing ucxx sets `UCX_WARN_UNUSED_ENV_VARS=n` (unless set); the context gets
`TCP_TX_SEG_SIZE`/`TCP_RX_SEG_SIZE=512k` unless `UCX_TCP_*_SEG_SIZE` are set in the environment.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from tenplex.runtime.transport.errors import Cancel, Cancelled, TransportError
from tenplex.runtime.transport.ucx.wire import ID_BITS, pack_address

__all__ = ["Received", "Timeout", "UcxEndpoint", "Worker", "as_bytes", "import_ucx", "ucx_available"]

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


class Timeout(TransportError):
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


def as_bytes(buf: Any, writable: bool, what: str) -> Any:
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


class Worker:
    """One process's UCX worker. `timeout` (s) bounds every wait unless a call overrides it;
    `cancel` (`transport.errors`), once raised, ends every wait with `Cancelled` within a poll."""

    def __init__(self, name: str = "", timeout: float = 30.0, cancel: Cancel | None = None):
        api, self._Array = import_ucx()
        self._api = api
        self.name = name or f"pid{os.getpid()}"
        self.timeout = timeout
        self.cancel = cancel if cancel is not None else Cancel()
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

    def _progress_until(self, done: Any, deadline: float, what: str, work: Iterator[Any] | None = None,
                        finish_work: bool = True) -> None:  # fmt: skip
        """Progress the worker until `done()`; between progress calls, run `work` items one at a
        time (non-blocking progress while there is work, sleeping on the worker's fd after); the
        items left when `done()` are run then (`finish_work`) or left to the caller. The worker is
        progressed once before the first item: requests just posted (a rendezvous answered, the
        first bytes of a send) start moving before the work takes the CPU."""
        if work is not None:
            self._worker.progress()
        while not done():
            if self.cancel.why is not None:  # a cheap read per poll; the text only when raised
                self.cancel.check(f"{what} (peer {self.name!r})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{what}: timed out (peer {self.name!r})")
            if work is not None and next(work, _DONE) is not _DONE:
                self._worker.progress()
                continue
            work = None
            self._worker.progress_worker_event(epoll_timeout=max(1, min(_POLL_MS, int(left * 1000))))
        for _ in work if finish_work and work is not None else ():  # the transfers finished first: the rest now
            pass

    def _wait(self, reqs: list, keep: list, deadline: float, what: str, peer: str) -> None:
        try:
            self._progress_until(lambda: all(r.completed for r in reqs), deadline, what)
        except Timeout:
            self._abandon(keep)
            raise TransportError(f"{what}: no progress from peer {peer!r} before the timeout; it may be dead") from None
        except Cancelled:
            self._abandon(keep)
            raise
        for r in reqs:
            try:
                r.check_error()
            except Exception as e:  # UCXError subclasses: connection reset, canceled, truncated
                raise TransportError(f"{what} with peer {peer!r} failed: {type(e).__name__}: {e}") from e

    def _abandon(self, keep: list) -> None:
        self._abandoned.append(keep)
        with contextlib.suppress(Exception):  # best effort on a failure path
            self._worker.cancel_inflight_requests()

    # ---- endpoints -------------------------------------------------------------------
    def _check_remote(self, remote_id: int, remote_name: str) -> None:
        if remote_id == self.id:
            raise TransportError(f"peer {remote_name!r} has the same id as {self.name!r}; recreate one of them")

    def _register(self, ep: UcxEndpoint) -> UcxEndpoint:
        self._names[ep.remote_id] = ep.remote_name
        self._endpoints.append(ep)
        return ep

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _check_open(self, ep: UcxEndpoint) -> None:
        if ep.closed:
            raise TransportError(f"endpoint to peer {ep.remote_name!r} is closed")

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
