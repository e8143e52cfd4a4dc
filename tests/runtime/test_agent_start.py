"""Agents forked from the runtime's process (`Runtime.local(fork=True)`, as `tenplex reshard
--workers N` starts them): they start without importing anything, hold none of the parent's
descriptors, and the runtime falls back to spawning where a fork is not safe.

Real agent processes (`Runtime.local`), real pipes and threads."""

from __future__ import annotations

import os
import select
import threading

import pytest

from tenplex.runtime.agent.client import fork_safe
from tenplex.runtime.runtime import Runtime


def _spawned(rt: Runtime) -> dict[str, bool]:
    """Per host, whether its agent runs a fresh interpreter (`spawn`) rather than a fork of this one."""
    out = {}
    for host, agent in rt.agents.items():
        with open(f"/proc/{agent.proc.pid}/cmdline", "rb") as f:
            out[host] = b"spawn_main" in f.read()
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_forked_agents_answer_and_hold_no_descriptor_of_the_parent():
    if fork_safe() is not None:
        pytest.skip(f"this test process cannot fork agents: {fork_safe()}")
    r, w = os.pipe()
    try:
        with Runtime.local(["w0", "w1"], timeout=20.0, fork=True, link=False) as rt:
            assert _spawned(rt) == {"w0": False, "w1": False}
            assert rt._all({h: ("name", {}) for h in rt.agents}, 20.0) == {"w0": "w0", "w1": "w1"}
            os.close(w)
            w = -1
            assert select.select([r], [], [], 5.0)[0], "an agent kept the pipe's write end open"
            assert os.read(r, 1) == b""  # EOF: no agent holds the write end
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_process_with_threads_spawns_its_agents():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert "threads" in (fork_safe() or "")
        with Runtime.local(["w0"], timeout=20.0, start_timeout=60.0, fork=True, link=False) as rt:
            assert _spawned(rt) == {"w0": True}
            assert rt.call("w0", "name", 60.0) == "w0"
    finally:
        stop.set()
        thread.join()
