"""An agent connection's beat thread (`agent.beat`): it reads the runtime's cancel while a command
runs, and never a frame that belongs to the command loop. In-process, over a socket pair: the
test thread plays the command loop (`server.handle`) and the runtime."""

from __future__ import annotations

import fcntl
import select
import socket
import threading
import time
import types

import pytest

from tenplex.runtime.agent import beat as heartbeat
from tenplex.runtime.agent.agent import Agent
from tenplex.runtime.agent.channel import Channel
from tenplex.runtime.transport.errors import Cancelled


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    agent_end, runtime_end = Channel(a, "runtime"), Channel(b, "agent")
    yield agent_end, runtime_end
    agent_end.close()
    runtime_end.close()


@pytest.fixture
def agent():
    agent = Agent("h0")
    yield agent
    agent.stop()


def test_a_cancel_while_a_command_runs_raises_the_flag_and_one_after_it_is_left_to_the_loop(pair, agent, monkeypatch):
    """A cancel while a command runs raises the agent's flag (which transports check between
    polls); one that comes after the command is left to the command loop (which drops it), and
    the next command starts with the flag down. The agent's end is a descriptor above 1024, as in
    an agent with many arenas: `select` cannot wait on it (the beat thread then blocked in a read,
    holding the lock that ends a command)."""
    monkeypatch.setattr(heartbeat, "BEAT_S", 0.2)
    low, runtime_end = pair
    agent_end = Channel(socket.socket(fileno=fcntl.fcntl(low.fileno(), fcntl.F_DUPFD, 1100)), "runtime")
    low.close()
    try:
        with heartbeat.Heartbeat(agent_end, agent) as beat:
            with beat.busy():
                runtime_end.send({"cancel": "host 'h1' failed"}, 5.0)
                deadline = time.monotonic() + 5.0
                while agent.cancel.why is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                with pytest.raises(Cancelled, match="exchange: cancelled: host 'h1' failed"):
                    agent.cancel.check("exchange")
            runtime_end.send({"cancel": "late"}, 5.0)
            time.sleep(0.3)  # idle: the beat thread does not read it
            assert heartbeat.is_cancel(agent_end.recv(5.0, 5.0)) and beat.pending == []
            with beat.busy():
                agent.cancel.check("the next command")  # the flag is down
                time.sleep(0.3)  # the beat thread waits on the channel meanwhile
            assert runtime_end.recv(5.0, 5.0) == {"beat": 1, "done": 0}
    finally:
        agent_end.close()


class _LatePoll:
    """`select` for the beat module whose first wait on the channel is slow to return: it polls
    once the test says the next command was sent (`sent`), says it woke (`woke`), and returns
    only when the test lets it (`go`), as a beat thread that lost the CPU (the GIL) between its
    poll and its lock does on a loaded machine. Later waits are plain polls."""

    POLLIN = select.POLLIN

    def __init__(self) -> None:
        self.polling, self.sent, self.woke, self.go = (threading.Event() for _ in range(4))

    def poll(self) -> types.SimpleNamespace:
        real = select.poll()
        return types.SimpleNamespace(register=real.register, poll=lambda ms: self._first(real, ms))

    def _first(self, real, ms: float) -> list:
        if self.polling.is_set():
            return real.poll(ms)
        self.polling.set()
        assert self.sent.wait(10.0)
        ready = real.poll(ms)
        self.woke.set()
        assert self.go.wait(10.0)
        return ready


def test_the_beat_thread_leaves_the_next_command_to_the_loop(pair, agent, monkeypatch):
    """The beat thread's poll began while one command ran and woke on the next command's frame,
    which the loop read and started before the beat thread got its lock: the beat thread must
    not read then. It did (the command running was all it checked): it waited `REPLY_IDLE_S`
    (60 s) for bytes that never came, holding the lock that ends a command, so no beat went out
    and the reply waited, then it closed the channel. `tenplex agent`s linked by
    `Runtime.connect` (an `address` that starts UCX, then `connect` at once) failed so in the
    elastic host tests: "connect: ... closed by the peer" after 60 s."""
    late = _LatePoll()
    monkeypatch.setattr(heartbeat, "select", late)
    monkeypatch.setattr(heartbeat, "BEAT_S", 0.2)
    monkeypatch.setattr(heartbeat, "REPLY_IDLE_S", 2.0)  # what a wrong read waits before closing
    agent_end, runtime_end = pair
    nxt = {"cmd": "connect", "args": {"peers": {}}}
    with heartbeat.Heartbeat(agent_end, agent) as beat:
        with beat.busy():  # a command ("address"); the beat thread waits on the channel
            assert late.polling.wait(10.0)
        agent_end.send({"ok": "its reply"}, 5.0)
        runtime_end.send(nxt, 5.0)  # the runtime sends the next command at once
        late.sent.set()
        assert late.woke.wait(10.0)  # the beat thread's poll saw it arrive
        assert agent_end.recv(5.0, 5.0) == nxt  # the loop reads it first and starts it
        with beat.busy():
            late.go.set()  # only now the beat thread goes on
            time.sleep(0.5)  # the command runs; beats go out meanwhile
        assert not agent_end.closed and agent.cancel.why is None and beat.pending == []
        agent_end.send({"ok": "the next reply"}, 5.0)
    assert runtime_end.recv(5.0, 5.0) == {"ok": "its reply"}
    got = [runtime_end.recv(5.0, 5.0)]
    while "ok" not in got[-1]:
        got.append(runtime_end.recv(5.0, 5.0))
    assert got[-1] == {"ok": "the next reply"} and all("beat" in m for m in got[:-1])
