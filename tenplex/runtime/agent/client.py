"""The runtime's end of its agents: a handle per agent, and the barrier that calls them all.

`call_all(agents, {host: (command, kwargs)}, timeout)` sends each host its command (all encoded
before the first is sent) and waits for every reply, for the agent's death, or for the deadline.
A busy agent sends a heartbeat every second (`beat.BEAT_S`); one that sends nothing for
`liveness` seconds is taken for stopped or hung and killed, so a SIGSTOPped agent costs
`liveness` seconds, not the whole deadline.
Failures are collected, not raised one by one: the caller gets `AgentFailures` with every failed
host and its reason in arrival order, so the first one is the cause and later ones are usually
peers giving up on it: at the first failure, the agents still working are sent a one-way
`{"cancel": "host 'h1' failed"}` (`server`), and their transports' waits fail within a poll
instead of waiting for the failed host's messages until their own timeout. An agent that misses the deadline is killed (its reply would arrive out
of order and answer the wrong call); a dead agent is never called again (`AgentHandle.dead`).

Every operation here returns by its deadline; none blocks on a peer that stopped reading.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import wait
from typing import Any

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.agent import tunables
from tenplex.runtime.agent.channel import Channel, ChannelError, dial, frame
from tenplex.runtime.agent.forked import Forked
from tenplex.runtime.agent.server import serve
from tenplex.runtime.agent.wire import WireError

__all__ = ["LIVENESS_S", "AgentFailures", "AgentHandle", "Clock", "Progress", "agent_of", "by_host", "call_all",
           "close_all", "connect"]

LIVENESS_S = 30.0  # no heartbeat or reply for this long: the agent is stopped or hung
SEND_IDLE_S = 30.0  # an agent that takes no command bytes for this long is gone
WAKE_S = 0.5
CANCEL_S = 1.0  # the longest a cancel frame may take to send


class AgentFailures(Exception):
    """Hosts that failed a call, with their reasons, in the order the failures arrived."""

    def __init__(self, failures: list[tuple[str, str]]):
        super().__init__("; ".join(f"host {h!r}: {t}" for h, t in failures))
        self.failures = failures


class AgentHandle:
    """The runtime's end of one agent: a process it started (`proc`) or a `tenplex agent` it
    connected to (`proc` None; only the connection is ours)."""

    def __init__(self, host: str, proc: Any, channel: Channel):
        self.host, self.proc, self.channel = host, proc, channel
        self.dead: str | None = None  # why it can no longer be used
        self.kept: list[str] = []  # ids of the slices the agent keeps, oldest first (`agent.slicing`)

    @property
    def slice_id(self) -> str | None:
        """The id of the slice sent last (None: none kept)."""
        return self.kept[-1] if self.kept else None

    def mark_dead(self, why: str) -> None:
        self.dead = why
        self.channel.close()  # a connected agent sees EOF and aborts what it was doing
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()  # also ends a stopped process
            self.proc.join(5)

    def exit_code(self) -> str:
        return "connection lost" if self.proc is None else f"exit code {self.proc.exitcode}"


def connect(address: str, token: str | None, timeout: float) -> tuple[Channel, str]:
    """(channel, agent name) of a running `tenplex agent`. Raises ExecutionError naming the address."""
    try:
        return dial(address, token, timeout)
    except ChannelError as e:
        raise ExecutionError(str(e)) from None


def spawn_local(agents: dict[str, AgentHandle], hosts: Iterable[str], timeout: float, local_dir: str | None,
                fork: bool = False, transport: str = "ucx") -> None:  # fmt: skip
    """Start one agent process per host on this machine (a socket pair each) and add its handle to
    `agents` as it starts, so a failure part-way leaves the started ones to close; with
    `local_dir`, each also serves its store on `local_dir/<host>.store`. Processes are `spawn`ed
    (a fresh interpreter that imports the agent, with glibc's copy tunables for agents:
    `tunables`), or with `fork` forked from this one, which has the modules already (see
    `fork_safe`) and keeps this process's tunables. `transport`: see `Agent`."""
    hosts = list(dict.fromkeys(hosts))
    if local_dir:
        os.makedirs(local_dir, exist_ok=True)
    forked = fork and fork_safe() is None
    ctx = mp.get_context("spawn")
    for host in hosts:
        mine, theirs = socket.socketpair()
        local = os.path.join(local_dir, f"{host}.store") if local_dir else None
        args = (theirs, host, timeout, local, transport)
        if forked:
            proc: Any = Forked(serve, args, keep=theirs)
        else:
            proc = ctx.Process(target=serve, args=args, name=f"tenplex-agent-{host}", daemon=True)
            with tunables.spawning():  # its copies with non-temporal stores from 1 MiB
                proc.start()
        theirs.close()
        agents[host] = AgentHandle(host, proc, Channel(mine, f"agent {host}"))


def fork_safe() -> str | None:
    """None when this process may fork agents, else why not: forking is safe only from a process
    with one thread (a lock another thread held stays locked in the child) that has not loaded
    UCX (whose context and threads do not survive a fork), on a system with `fork` and pidfds
    (`forked.Forked`'s sentinel)."""
    if "fork" not in mp.get_all_start_methods() or not hasattr(os, "pidfd_open"):
        return "no fork or no pidfd_open on this system"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as e:
        return f"pidfd_open: {e.strerror}"
    if threading.active_count() != 1:
        return f"{threading.active_count()} threads"
    if any(name == "ucxx" or name.startswith("ucxx.") for name in sys.modules):
        return "UCX is loaded"
    return None


def agent_of(agents: Mapping[str, AgentHandle], host: str) -> AgentHandle:
    if host not in agents:
        raise ExecutionError(f"no agent for host {host!r} (agents: {sorted(agents)})")
    return agents[host]


def by_host(agents: Mapping[str, AgentHandle], host_of: Callable[[int], str], arrays: Mapping[tuple[str, int], Any],
            values: Mapping[tuple[str, int], Any]) -> dict[str, tuple[dict, dict]]:  # fmt: skip
    """{agent's host: (its arrays, its values)} of a state keyed (id, device), by each device's host."""
    out: dict[str, tuple[dict, dict]] = {h: ({}, {}) for h in agents}
    for side, items in enumerate((arrays, values)):
        for (key, device), item in items.items():
            out[agent_of(agents, host_of(device)).host][side][(key, device)] = item
    return out


def call_all(agents: Mapping[str, AgentHandle], calls: Mapping[str, tuple[str, dict]], timeout: float,
             liveness: float = LIVENESS_S, on_beat: Callable[[str, dict], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Send each host its command, wait for every reply (or death, silence, or the deadline);
    `on_beat(host, beat)` sees each heartbeat (`{"beat": n, "done": rounds done}`).

    Raises AgentFailures with (host, reason) in arrival order if any host failed; hosts that
    missed the deadline or went silent are killed; at the first failure the others are told to
    give up (`_cancel`) and their replies are still awaited, so none is left out of order.
    """
    deadline = time.monotonic() + timeout
    failures: list[tuple[str, str]] = []
    results: dict[str, Any] = {}
    waiting: dict[Channel, AgentHandle] = {}
    names = {h: c[0] for h, c in calls.items()}
    for host, agent, parts in _frames(agents, calls, failures):  # every frame encoded before the first is sent
        try:
            agent.channel.send_frame(parts, SEND_IDLE_S, max(0.0, deadline - time.monotonic()))
            waiting[agent.channel] = agent
        except ChannelError as e:
            agent.mark_dead(f"command not delivered: {e}")
            failures.append((host, f"{names[host]}: agent process died ({agent.exit_code()}): {e}"))
    seen = {agent.host: time.monotonic() for agent in waiting.values()}
    sentinels = {a.proc.sentinel: a for a in waiting.values() if a.proc is not None}
    told = False  # the agents still working were told to give up
    while waiting:
        if failures and not told:
            told = _cancel(waiting, failures[0][0])
        now = time.monotonic()
        for agent in list(waiting.values()):
            if now >= deadline or now - seen[agent.host] > liveness:
                why = "no reply within the deadline" if now >= deadline else f"silent for {liveness:.0f} s (stopped or hung?)"
                del waiting[agent.channel]
                agent.mark_dead(f"{why} during {names[agent.host]}")
                failures.append((agent.host, f"{names[agent.host]}: {why}; agent killed"))
        if not waiting:
            break
        # wake at least every WAKE_S: a signal the kernel hands to another thread still ends the wait
        ready = wait([*waiting, *(s for s, a in sentinels.items() if a.channel in waiting)], timeout=WAKE_S)
        for obj in ready:
            agent = waiting.get(obj) or sentinels.get(obj)
            if agent is None or agent.channel not in waiting:
                continue
            try:
                message = agent.channel.recv(liveness, max(0.01, deadline - time.monotonic()))
            except ChannelError as e:
                del waiting[agent.channel]
                if agent.proc is not None:
                    agent.proc.join(5)
                agent.mark_dead(f"died ({agent.exit_code()})")
                failures.append((agent.host, f"{names[agent.host]}: agent process died ({agent.exit_code()}): {e}"))
                continue
            seen[agent.host] = time.monotonic()
            if isinstance(message, dict) and "beat" in message:
                if on_beat is not None:
                    on_beat(agent.host, message)
                continue
            del waiting[agent.channel]
            if isinstance(message, dict) and "ok" in message:
                results[agent.host] = message["ok"]
            else:
                failures.append((agent.host, str(message.get("err") if isinstance(message, dict) else message)))
    if failures:
        raise AgentFailures(failures)
    return results


def _cancel(waiting: Mapping[Channel, AgentHandle], failed: str) -> bool:
    """Tell the agents still running this call that `failed` failed: a call is collective, and
    their transports would otherwise wait for its messages until their own timeout (one-way
    frames, `server`; an agent that cannot take one fails the call's wait by itself)."""
    cancel = frame({"cancel": f"host {failed!r} failed"})
    for agent in waiting.values():
        with contextlib.suppress(ChannelError):
            agent.channel.send_frame(cancel, CANCEL_S, CANCEL_S)
    return True


def _frames(agents: Mapping[str, AgentHandle], calls: Mapping[str, tuple[str, dict]],
            failures: list[tuple[str, str]]) -> list[tuple[str, AgentHandle, list]]:  # fmt: skip
    """(host, agent, encoded command) per call to a live agent; the others' failures appended.
    All are encoded before any is sent: an agent that got its command competes for the CPU with
    the encoding of the next ones (a plan's slices: ~1.5 ms each), so sending each as it is
    encoded let the last agent start its work tens of ms after the first on a loaded machine."""
    out = []
    for host, (name, kwargs) in calls.items():
        agent = agent_of(agents, host)
        if agent.dead is not None:
            failures.append((host, f"agent unavailable ({agent.dead})"))
            continue
        try:
            out.append((host, agent, frame({"cmd": name, "args": kwargs})))
        except WireError as e:  # the arguments cannot travel: a bug of the caller, nothing is sent
            failures.append((host, f"{name}: {e}"))
    return out


class Clock:
    """Adds the seconds since the previous lap to `phases[name]` (a given dict is cleared first)."""

    def __init__(self, phases: dict[str, float] | None = None):
        self.phases = {} if phases is None else phases
        self.phases.clear()
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now


class Progress:
    """Calls `on_round(done, total)` as the slowest host finishes rounds (from its heartbeats)."""

    def __init__(self, hosts: list[str], total: int, on_round: Callable[[int, int], None] | None):
        self.done, self.total, self.on_round, self.reported = dict.fromkeys(hosts, 0), total, on_round, 0

    def beat(self, host: str, beat: dict) -> None:
        if isinstance(beat.get("done"), int) and host in self.done:
            self.done[host] = beat["done"]
            self._report(min(self.done.values()))

    def finish(self) -> None:
        self._report(self.total)

    def _report(self, done: int) -> None:
        while self.on_round is not None and self.reported < min(done, self.total):
            self.reported += 1
            self.on_round(self.reported, self.total)


def close_all(agents: Mapping[str, AgentHandle], timeout: float = 5.0) -> None:
    """Stop every agent we started (asking first, killing after `timeout`) and close every
    connection. Returns within about `timeout` seconds whatever the agents do. Idempotent."""
    for agent in agents.values():
        if agent.dead is None and agent.proc is not None and agent.proc.is_alive():
            with contextlib.suppress(ChannelError):
                agent.channel.send({"cmd": "stop", "args": {}}, 1.0, 1.0)
    deadline = time.monotonic() + timeout
    for agent in agents.values():
        if agent.proc is not None:
            agent.proc.join(max(0.0, deadline - time.monotonic()))
            if agent.proc.is_alive():
                agent.proc.kill()
                agent.proc.join(5)
            if isinstance(agent.proc, Forked):
                agent.proc.close()
        agent.dead = agent.dead or "closed"
        agent.channel.close()
