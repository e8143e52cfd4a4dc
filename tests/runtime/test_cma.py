"""`transport.cma`: agents on one machine moving bytes by reading each other's memory
(`process_vm_readv`) instead of UCX: strided views both ways without packing, offers of a
peer that is ahead kept until their receive is posted, a wrong size failing both sides by
message, and `Runtime.local(transport="cma")` agents executing a plan without loading UCX.

Real processes (spawned peers, `Runtime.local` agents), real system calls."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from tenplex.compiler.compile import compile_plan
from tenplex.frontends.spec import ptc_from_spec
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_state
from tenplex.runtime.runtime import Runtime
from tenplex.runtime.transport import cma
from tenplex.runtime.transport.errors import TransportError

_REASON = cma.unusable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"cross memory attach unusable: {_REASON}")


def _matrix(seed: int) -> np.ndarray:
    return np.arange(seed, seed + 64 * 48, dtype=np.float32).reshape(64, 48)


def test_read_merges_the_runs_of_both_sides_beyond_iov_max():
    src = np.arange(3000 * 8, dtype=np.int32).reshape(3000, 8)
    out = np.zeros((8, 3000), np.int32).T  # columns of a transposed array: other runs than src's
    n = cma.read(os.getpid(), cma.iovecs([out[:, 2:6]]), cma.iovecs([src[:, 1:5]]))
    assert n == 3000 * 4 * 4 and len(cma.iovecs([out[:, 2:6]])) > cma.IOV_MAX
    assert np.array_equal(out[:, 2:6], src[:, 1:5]) and not out[:, :2].any() and not out[:, 6:].any()
    with pytest.raises(TransportError, match="16 B offered for 8 B"):
        cma.read(os.getpid(), cma.iovecs([np.zeros(2, np.int32)]), cma.iovecs([np.zeros(4, np.int32)]))


def _child(conn) -> None:
    peer = cma.CmaPeer("child", timeout=10.0)
    conn.send(peer.address)
    ep = peer.accept()
    a = np.zeros((64, 24), np.float32)
    peer.exchange([(ep, [_matrix(1000)[::2, 5:9], _matrix(2000)[3]], 2)], [(ep, [a], 1)])
    peer.exchange([(ep, [_matrix(3000)[:, 40:]], 3)], [])  # round 2: ahead of the parent's receive
    try:
        peer.exchange([], [(ep, [np.zeros(4, np.float32)], 9)])
    except TransportError as e:
        conn.send(("error", str(e), np.array_equal(a, _matrix(0)[:, ::2])))
    peer.shutdown()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_two_processes_exchange_strided_views_and_refuse_a_wrong_size():
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(theirs,), daemon=True)
    proc.start()
    try:
        peer = cma.CmaPeer("parent", timeout=10.0)
        ep = peer.connect(mine.recv(), "child")
        assert ep.pid == proc.pid and ep.mode == "cma"
        b, c = np.zeros((32, 4), np.float32), np.zeros(48, np.float32)
        peer.exchange([(ep, [_matrix(0)[:, ::2]], 1)], [(ep, [b, c], 2)])
        assert np.array_equal(b, _matrix(1000)[::2, 5:9]) and np.array_equal(c, _matrix(2000)[3])
        late = np.zeros((64, 8), np.float32)
        peer.exchange([], [(ep, late.T.T, 3)], work=iter(range(3)))
        assert np.array_equal(late, _matrix(3000)[:, 40:])
        with pytest.raises(TransportError, match="send of message 9 to peer 'child': the peer could not receive it"):
            peer.exchange([(ep, np.zeros(2, np.float32), 9)], [])
        kind, text, first_ok = mine.recv()
        assert kind == "error" and "message 9" in text and "8 B offered for 16 B" in text and first_ok
        peer.shutdown()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_cma_agents_execute_a_plan_without_loading_ucx():
    src, dst = ptc_from_spec("gpt-tiny:tp2,pp1,dp1@2x1"), ptc_from_spec("gpt-tiny:tp1,pp1,dp2@2x1")
    plan = compile_plan(src, dst)
    assert plan.stats.network_bytes > 0
    tensors = arange_tensors(src)
    with Runtime.local(["h0", "h1"], timeout=20.0, round_timeout=30.0, transport="cma") as rt:
        assert rt.links == {"h0": {"h1": "cma"}, "h1": {"h0": "cma"}}
        rt.load("j", "v0", src, materialize_all(src, tensors), arange_values(src))
        sent = rt.execute(plan, src, dst, "j", "v0", "v1")
        assert sum(sent.values()) == plan.stats.network_bytes
        assert check_state(dst.with_allocation(plan.allocation), tensors, rt.fetch("j", "v1")[0]) > 0
        for agent in rt.agents.values():
            with open(f"/proc/{agent.proc.pid}/maps") as f:
                assert "libucp" not in f.read()


def _silent_child(conn) -> None:
    peer = cma.CmaPeer("quiet", timeout=10.0)
    conn.send(peer.address)
    peer.accept()
    conn.recv()  # until the parent's exchange timed out; then exit without a word
    peer.shutdown()


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_a_silent_peer_times_out_and_a_gone_one_is_named():
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_silent_child, args=(theirs,), daemon=True)
    proc.start()
    try:
        peer = cma.CmaPeer("parent", timeout=0.5)
        ep = peer.connect(mine.recv(), "quiet")
        with pytest.raises(
            TransportError, match=r"exchange timed out; still waiting for receive of message 5 from 'quiet'"
        ):
            peer.exchange([], [(ep, np.zeros(4), 5)])
        mine.send("go")
        proc.join(10)
        peer.timeout = 10.0
        with pytest.raises(TransportError, match="peer 'quiet' closed the connection"):
            peer.exchange([], [(ep, np.zeros(4), 6)])
        peer.shutdown()
    finally:
        if proc.is_alive():
            proc.kill()
