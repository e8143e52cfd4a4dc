"""`UcxPeer.exchange`: a batch of sends and receives posted at once and progressed together.

No headers: both sides know every message of the batch (its id and exact size, from the plan),
so a send goes out as one tagged payload (tag MSG | sender | message id; or kind CTL where the
tuple names it, for control messages in their own id space) and a receive is posted straight
into the caller's buffer under the same tag, with no extra one-way hop. A message
longer than its receive buffer fails the receive (UCX truncation), named by message id; the
caller must give each receive exactly the message's size. A send whose buffer is a callable is
staged: every receive and every ready send is posted first, then each staged send's callable
makes its buffer (e.g. packs it) and it is posted at once, one per progress step, before any
`work` item: the links carry the ready sends while the staged ones are packed. The batch ends
when every request completed; on a timeout or a failure every in-flight request is cancelled
and its buffers are kept alive (never freed under UCX).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from tenplex.runtime.transport.errors import TransportError
from tenplex.runtime.transport.ucx.wire import CTL, FULL_MASK, MSG, check_user_tag, make_tag
from tenplex.runtime.transport.ucx.worker import Received, Timeout, UcxEndpoint, Worker, as_bytes


class Exchange:
    def __init__(self, peer: Worker, timeout: float | None):
        self.peer, self.deadline = peer, peer._deadline(timeout)
        self.A, self.T, self.M = peer._Array, peer._api.UCXXTag, peer._api.UCXXTagMask
        self.keep: list = []  # buffers UCX may still use
        self.reqs: list = []  # (request, what) of every send and receive

    def run(self, sends: list[tuple], recvs: list[tuple],
            work: Iterable[Any] | None, finish_work: bool = True) -> list[Received]:  # fmt: skip
        results = []
        for ep, out, message_id, *kind in recvs:  # receives first: a payload that arrives finds its buffer
            results.append(self._post(ep, out, message_id, False, kind[0] if kind else MSG))
        staged = [s for s in sends if callable(s[1])]
        for ep, buffer, message_id, *kind in sends:
            if not callable(buffer):
                self._post(ep, buffer, message_id, True, kind[0] if kind else MSG)
        what = f"exchange of {len(sends)} sends and {len(recvs)} receives"
        total = len(sends) + len(recvs)
        reqs = self.reqs

        def done() -> bool:
            return len(reqs) == total and all(r.completed for r, _ in reqs)

        try:
            self.peer._progress_until(done, self.deadline, what, self._staged(staged, work), finish_work)
        except TransportError as e:
            self.peer._abandon(self.keep + [r for r, _ in reqs])
            if not isinstance(e, Timeout):
                raise
            waiting = [name for r, name in self.reqs if not r.completed]
            raise TransportError(f"{what}: timed out (peer {self.peer.name!r}); still waiting for "
                                 f"{', '.join(waiting[:8])}{'...' if len(waiting) > 8 else ''}") from None  # fmt: skip
        except BaseException:  # the caller's work failed: UCX may still use the buffers
            self.peer._abandon(self.keep + [r for r, _ in reqs])
            raise
        for r, name in self.reqs:
            try:
                r.check_error()
            except Exception as e:
                raise TransportError(f"{name} failed: {type(e).__name__}: {e}") from e
        return results

    def _staged(self, staged: list[tuple], work: Iterable[Any] | None) -> Iterator[Any] | None:
        """Work items: make and post each staged send, then the caller's `work`."""
        if not staged:
            return iter(work) if work is not None else None
        return self._then(staged, iter(work) if work is not None else iter(()))

    def _then(self, staged: list[tuple], work: Iterator[Any]) -> Iterator[Any]:
        for ep, make, message_id, *kind in staged:
            self._post(ep, make(), message_id, True, kind[0] if kind else MSG)
            yield
        # not `yield from`: closing this generator (the batch done, `finish_work=False`) must
        # leave the rest of the caller's `work` to the caller, not close it
        for item in work:  # noqa: UP028 (see above)
            yield item

    def _post(self, ep: UcxEndpoint, buffer: Any, message_id: int, outgoing: bool, kind: int = MSG) -> Received:
        check_user_tag(message_id)
        self.peer._check_open(ep)
        direction = "to" if outgoing else "from"
        what = "control message" if kind == CTL else "message"
        name = f"{'send' if outgoing else 'recv'} of {what} {message_id} {direction} peer {ep.remote_name!r}"
        view = as_bytes(buffer, not outgoing, name)
        arr = self.A(view)
        name += f" ({arr.nbytes} B)"
        if outgoing:
            req = ep._ep.tag_send(arr, self.T(make_tag(kind, self.peer.id, message_id)))
        else:
            req = self.peer._worker.tag_recv(arr, self.T(make_tag(kind, ep.remote_id, message_id)), self.M(FULL_MASK))
        self.keep += [arr, view]
        self.reqs.append((req, name))
        return Received(message_id, view, ep.remote_name)
