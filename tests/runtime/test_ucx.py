"""UCX transport between two real processes (spawned), shared memory and TCP on loopback.

Every test has a hard timeout, every wait a deadline, and the child is always joined or killed.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import time

import numpy as np
import pytest

from tenplex.ir.errors import TenplexError
from tenplex.runtime.transport.ucx import ANY, TransportError, UcxPeer, ucx_available
from tenplex.runtime.transport.ucx import wire as ucx_wire

_REASON = ucx_available()
needs_ucx = pytest.mark.skipif(_REASON is not None, reason=f"ucxx cannot be imported: {_REASON}")
SIZES = (1, 1 << 20, 64 << 20)
WAIT = 20.0  # seconds for any single transfer or pipe message


def pattern(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint32) * 7 + seed) % 251).astype(np.uint8)


def _pipe_recv(conn, timeout: float = WAIT):
    if not conn.poll(timeout):
        raise TimeoutError("no message from the other process over the pipe")
    return conn.recv()


# ---- children (top level: the spawn context imports this module) ----------------------
def _child_sender(conn, mode: str) -> None:
    peer = UcxPeer("child", timeout=WAIT)
    if mode == "tcp":
        ep = peer.connect_tcp("127.0.0.1", _pipe_recv(conn))
    else:
        conn.send(peer.address)
        ep = peer.connect(_pipe_recv(conn))
    for i, n in enumerate(SIZES):
        peer.send(ep, pattern(n, i), tag=5, message_id=100 + i)
    got = np.zeros(16, dtype=np.uint8)
    reply = peer.recv(ep, got, tag=6)  # the other direction too
    assert np.array_equal(reply.data, pattern(3, 9))
    peer.close(ep)
    conn.send("closed")


def _child_exchanger(conn) -> None:
    """Sends messages 10..12 and receives 20..22 from the parent, all posted at once."""
    peer = UcxPeer("xchild", timeout=WAIT)
    conn.send(peer.address)
    ep = peer.connect(_pipe_recv(conn))
    outs = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    got = peer.exchange([(ep, pattern(n, i), 10 + i) for i, n in enumerate(SIZES)],
                        [(ep, out, 20 + i) for i, out in enumerate(outs)])  # fmt: skip
    ok = all(
        np.array_equal(g.data, pattern(n, 50 + i)) and g.message_id == 20 + i
        for i, (g, n) in enumerate(zip(got, SIZES))
    )
    conn.send(ok)
    peer.close(ep)


def _child_idle(conn) -> None:
    peer = UcxPeer("doomed-child", timeout=WAIT)
    conn.send(peer.address)
    peer.connect(_pipe_recv(conn))
    conn.send("ready")
    time.sleep(60)  # killed by the parent long before


def _start(target, *args):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    return proc, parent


def _stop(proc) -> None:
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def _receive_all(peer: UcxPeer, ep, conn) -> None:
    out = np.zeros(max(SIZES), dtype=np.uint8)
    for i, n in enumerate(SIZES):
        out[:] = 0
        got = peer.recv(ANY if i == 0 else ep, out, tag=5)
        assert (got.message_id, got.data.nbytes, got.sender) == (100 + i, n, "child")
        assert np.shares_memory(got.data, out)  # received in place, no copy
        assert np.array_equal(got.data, pattern(n, i))
    peer.send(ep, pattern(3, 9), tag=6)
    peer.close(ep)  # acknowledged: returns only after the child's FIN
    assert ep.closed
    assert _pipe_recv(conn) == "closed"


@contextlib.contextmanager
def _connected(target, timeout: float = WAIT):
    """A spawned child running `target`, this process's peer, and an endpoint to the child
    (worker addresses exchanged over the pipe); the child is always joined or killed."""
    proc, conn = _start(target)
    try:
        with UcxPeer("parent", timeout=timeout) as peer:
            child_address = _pipe_recv(conn)
            conn.send(peer.address)
            yield proc, conn, peer, peer.connect(child_address)
    finally:
        _stop(proc)


# ---- tests --------------------------------------------------------------------------------
@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_shared_memory_messages_and_acknowledged_close():
    with _connected(functools.partial(_child_sender, mode="address")) as (proc, conn, peer, ep):
        assert (ep.remote_name, ep.mode) == ("child", "address")
        _receive_all(peer, ep, conn)
        proc.join(WAIT)
        assert proc.exitcode == 0


@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_tcp_listener_on_loopback():
    proc, conn = _start(_child_sender, "tcp")
    try:
        with UcxPeer("parent", timeout=WAIT) as peer:
            conn.send(peer.listen(0))
            ep = peer.accept()
            assert (ep.remote_name, ep.mode) == ("child", "tcp")
            _receive_all(peer, ep, conn)
        proc.join(WAIT)
        assert proc.exitcode == 0
    finally:
        _stop(proc)


@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_exchange_posts_both_directions_at_once_and_matches_by_message_id():
    with _connected(_child_exchanger) as (proc, conn, peer, ep):
        # receives listed in the reverse order of the sends: matching is by id, not arrival
        outs = {i: np.zeros(n, dtype=np.uint8) for i, n in enumerate(SIZES)}
        done: list = []
        work = (done.append(k) for k in range(50))  # other work between progress calls, all of it run

        def staged(i: int, n: int):  # a send whose buffer is made (packed) once the ready ones are posted
            return lambda: done.append(f"made {i}") or pattern(n, 50 + i)

        sends = [(ep, staged(i, n) if i != 1 else pattern(n, 50 + i), 20 + i) for i, n in enumerate(SIZES)]
        got = peer.exchange(sends, [(ep, outs[i], 10 + i) for i in reversed(range(len(SIZES)))], work=work)
        assert done == ["made 0", "made 2", *range(50)]  # staged sends first, in order, then the work
        for g, i in zip(got, reversed(range(len(SIZES)))):
            assert g.message_id == 10 + i and np.shares_memory(g.data, outs[i])
            assert np.array_equal(g.data, pattern(SIZES[i], i))
        assert _pipe_recv(conn) is True
        peer.close(ep)
        proc.join(WAIT)
        assert proc.exitcode == 0


@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_exchange_into_a_too_small_buffer_names_the_message():
    message = r"recv of message 11 from peer .xchild. \(16 B\) failed: .*[Tt]runcat"
    with _connected(_child_exchanger, timeout=5.0) as (_, _, peer, ep), pytest.raises(TransportError, match=message):
        peer.exchange([], [(ep, np.zeros(1, np.uint8), 10), (ep, np.zeros(16, np.uint8), 11)])


@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_exchange_whose_staged_send_fails_raises_its_error_and_abandons_the_batch():
    def broken():
        raise ValueError("pack failed")

    with _connected(_child_idle) as (proc, conn, peer, ep):
        assert _pipe_recv(conn) == "ready"
        out = np.zeros(1 << 20, np.uint8)
        with pytest.raises(ValueError, match="pack failed"):
            peer.exchange([(ep, pattern(64, 1), 30), (ep, broken, 31)], [(ep, out, 32)], work=iter(range(3)))
        assert len(peer._abandoned) == 1  # the posted send and receive stay referenced, never freed under UCX
        proc.kill()


@needs_ucx
@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_dead_peer_raises_transport_error_within_timeout():
    with _connected(_child_idle) as (proc, conn, peer, ep):
        assert _pipe_recv(conn) == "ready"
        proc.kill()
        proc.join(5)
        start = time.monotonic()
        with pytest.raises(TransportError, match="doomed-child") as info:
            peer.recv(ep, np.zeros(8, dtype=np.uint8), tag=1, timeout=1.5)
        assert 1.4 < time.monotonic() - start < 5
        assert isinstance(info.value, TenplexError)
        with pytest.raises(TransportError, match="doomed-child"):
            peer.close(ep, timeout=0.5)


# ---- one process -----------------------------------------------------------------------
@needs_ucx
@pytest.mark.timeout(30)
def test_bad_inputs_are_transport_errors():
    with UcxPeer("solo", timeout=1) as peer:
        with pytest.raises(TransportError, match="not a tenplex UCX peer address"):
            peer.connect(b"garbage")
        with pytest.raises(TransportError, match="same id"):
            peer.connect(peer.address)
        with pytest.raises(TransportError, match="before listen"):
            peer.accept(timeout=0.1)
        with pytest.raises(TransportError, match="timed out|no progress"):
            peer.recv(ANY, np.zeros(4, dtype=np.uint8), tag=3, timeout=0.2)
        with pytest.raises(TransportError, match="out of range"):
            peer.recv(ANY, np.zeros(4, dtype=np.uint8), tag=-1)


def test_wire_format_round_trips():
    header = ucx_wire.pack_header(5, 9, 1 << 40, 77)
    assert len(header) == ucx_wire.HEADER_SIZE
    assert ucx_wire.unpack_header(header) == (5, 9, 1 << 40, 77)
    assert ucx_wire.unpack_address(ucx_wire.pack_address(3, "h0/a1", b"\x01\x02")) == (3, "h0/a1", b"\x01\x02")
    assert ucx_wire.unpack_hello(ucx_wire.pack_hello(4, "x")) == (4, "x")
    t = ucx_wire.make_tag(ucx_wire.HDR, 0xABCDEF, 12)
    assert t & ucx_wire.ANY_SOURCE_MASK == ucx_wire.make_tag(ucx_wire.HDR, 0, 12)
    with pytest.raises(TransportError, match="corrupt"):
        ucx_wire.unpack_header(b"\0" * ucx_wire.HEADER_SIZE)


@needs_ucx
def test_work_left_when_a_batch_ends_stays_with_the_caller_after_staged_sends():
    """`finish_work=False` (the direct path's offers overlap round 0's copies): the work left when
    the batch completes is the caller's to run, also when staged sends wrapped it; closing the
    wrapper must not close the caller's generator (it did: round 0's last copies were lost)."""
    from tenplex.runtime.transport.ucx.exchange import Exchange

    batch, posted = Exchange.__new__(Exchange), []
    batch._post = lambda ep, buffer, message_id, outgoing, kind=None: posted.append((message_id, buffer))
    work = (k for k in range(5))
    items = batch._staged([(None, lambda: b"packed", 7)], work)
    assert [next(items), next(items)] == [None, 0] and posted == [(7, b"packed")]
    items.close()  # what dropping the wrapper does when the exchange returns
    assert list(work) == [1, 2, 3, 4]
