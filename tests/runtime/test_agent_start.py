"""Agents forked from the runtime's process (`Runtime.local(fork=True)`, as `tenplex reshard
--workers N` starts them): they start without importing anything, hold none of the parent's
descriptors, and the runtime falls back to spawning where a fork is not safe, starting the
spawned interpreter with the agents' copy tunables (`tunables`).

Real agent processes (`Runtime.local`), real pipes and threads."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import threading

import pytest

from tenplex.runtime.agent import tunables
from tenplex.runtime.agent.client import fork_safe
from tenplex.runtime.runtime import Runtime


def _spawned(rt: Runtime) -> dict[str, bool]:
    """Per host, whether its agent runs a fresh interpreter (`spawn`) rather than a fork of this one."""
    with open("/proc/self/cmdline", "rb") as f:
        mine = f.read()
    out = {}
    for host, agent in rt.agents.items():
        with open(f"/proc/{agent.proc.pid}/cmdline", "rb") as f:
            out[host] = f.read() != mine  # a fork runs this process's command line
    return out


def _forked_agents(conn) -> None:
    """In a fresh interpreter (one thread, no UCX): fork two agents with a pipe open, then report
    (whether they were spawned, their names, whether the pipe reads EOF once this process closed
    its write end)."""
    r, w = os.pipe()
    with Runtime.local(["w0", "w1"], timeout=20.0, fork=True, link=False) as rt:
        names = rt._all({h: ("name", {}) for h in rt.agents}, 20.0)
        spawned = _spawned(rt)
        os.close(w)
        eof = bool(select.select([r], [], [], 5.0)[0]) and os.read(r, 1) == b""
    conn.send((spawned, names, eof, fork_safe()))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_forked_agents_answer_and_hold_no_descriptor_of_the_parent():
    ctx = mp.get_context("spawn")  # a process that can fork agents, whatever this one loaded
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_forked_agents, args=(theirs,))  # not a daemon: it starts children
    proc.start()
    try:
        assert mine.poll(30), "the helper process did not report"
        spawned, names, eof, why = mine.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    assert spawned == {"w0": False, "w1": False}, why
    assert names == {"w0": "w0", "w1": "w1"}
    assert eof, "an agent kept the parent's pipe open"


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_process_with_threads_spawns_its_agents():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    before = dict(os.environ)
    try:
        assert "threads" in (fork_safe() or "")
        with Runtime.local(["w0"], timeout=20.0, start_timeout=60.0, fork=True, link=False) as rt:
            assert rt.call("w0", "name", 60.0) == "w0"  # first: a spawned child has exec'd once it answers
            assert _spawned(rt) == {"w0": True}
            # a spawned agent starts with the agents' copy tunables; this process's environment is as it was
            with open(f"/proc/{rt.agents['w0'].proc.pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            assert env[b"GLIBC_TUNABLES"].decode() == tunables.environ(before)["GLIBC_TUNABLES"]
            assert dict(os.environ) == before
    finally:
        stop.set()
        thread.join()
