"""The runtime's end of its agents: a handle per agent, and the barrier that calls them all.

`call_all(agents, {host: (command, kwargs)}, timeout)` sends each host its command and waits for
every reply, for the agent's death, or for the deadline. A command's reply is `("ok", result)`
or `("err", text)` (`server.handle`). Failures are collected, not raised one by one: the caller
gets `AgentFailures` with every failed host and its reason in arrival order, so the first one is
the cause and later ones are usually peers timing out on it. An agent that misses the deadline is
killed (its reply would arrive out of order and answer the wrong call); a dead agent is never
called again (`AgentHandle.dead` says why).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from multiprocessing.connection import wait
from typing import Any

from tenplex.ir.errors import ExecutionError

__all__ = ["AgentFailures", "AgentHandle", "agent_of", "call_all", "close_all"]


class AgentFailures(Exception):
    """Hosts that failed a call, with their reasons, in the order the failures arrived."""

    def __init__(self, failures: list[tuple[str, str]]):
        super().__init__("; ".join(f"host {h!r}: {t}" for h, t in failures))
        self.failures = failures


class AgentHandle:
    """The runtime's end of one agent: a process it started (`proc`) or a `tenplex agent` it
    connected to (`proc` None; only the connection is ours)."""

    def __init__(self, host: str, proc: Any, conn: Any):
        self.host, self.proc, self.conn = host, proc, conn
        self.dead: str | None = None  # why it can no longer be used

    def mark_dead(self, why: str) -> None:
        self.dead = why
        if self.proc is None:
            with contextlib.suppress(OSError):
                self.conn.close()  # the agent sees EOF and aborts what it was doing
            return
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)

    def exit_code(self) -> str:
        return "connection lost" if self.proc is None else f"exit code {self.proc.exitcode}"


def agent_of(agents: Mapping[str, AgentHandle], host: str) -> AgentHandle:
    if host not in agents:
        raise ExecutionError(f"no agent for host {host!r} (agents: {sorted(agents)})")
    return agents[host]


def call_all(agents: Mapping[str, AgentHandle], calls: Mapping[str, tuple[str, dict]], timeout: float) -> dict[str, Any]:
    """Send each host its command, wait for every reply (or death, or the deadline).

    Raises AgentFailures with (host, reason) in arrival order if any host failed; hosts that
    missed the deadline are killed.
    """
    deadline = time.monotonic() + timeout
    failures: list[tuple[str, str]] = []
    results: dict[str, Any] = {}
    waiting: dict[Any, AgentHandle] = {}
    for host, (name, kwargs) in calls.items():
        agent = agent_of(agents, host)
        if agent.dead is not None:
            failures.append((host, f"agent unavailable ({agent.dead})"))
            continue
        try:
            agent.conn.send((name, kwargs))
            waiting[agent.conn] = agent
        except (BrokenPipeError, OSError, EOFError) as e:
            agent.mark_dead(f"pipe broken: {e}")
            failures.append((host, f"{name}: agent process died ({agent.exit_code()})"))
    names = {h: c[0] for h, c in calls.items()}
    sentinels = {a.proc.sentinel: a for a in waiting.values() if a.proc is not None}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            for agent in waiting.values():
                agent.mark_dead(f"missed the deadline of {names[agent.host]}")
                failures.append((agent.host, f"{names[agent.host]}: no reply within the deadline; agent killed"))
            break
        ready = wait([*waiting, *(s for s, a in sentinels.items() if a.conn in waiting)], timeout=left)
        for obj in ready:
            agent = waiting.get(obj) or sentinels.get(obj)
            if agent is None or agent.conn not in waiting:
                continue
            try:
                status, payload = agent.conn.recv() if agent.conn.poll() else ("dead", None)
            except (EOFError, OSError):
                status, payload = "dead", None
            del waiting[agent.conn]
            if status == "ok":
                results[agent.host] = payload
            elif status == "err":
                failures.append((agent.host, str(payload)))
            else:
                if agent.proc is not None:
                    agent.proc.join(5)
                agent.mark_dead(f"died ({agent.exit_code()})")
                failures.append((agent.host, f"{names[agent.host]}: agent process died ({agent.exit_code()})"))
    if failures:
        raise AgentFailures(failures)
    return results


def close_all(agents: Mapping[str, AgentHandle], timeout: float = 5.0) -> None:
    """Stop every agent (asking first, killing after `timeout`). Idempotent."""
    for agent in agents.values():
        if agent.dead is None and agent.proc is not None and agent.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                agent.conn.send(("stop", {}))
    deadline = time.monotonic() + timeout
    for agent in agents.values():
        if agent.proc is None:
            agent.dead = agent.dead or "closed"
            agent.conn.close()
            continue
        agent.proc.join(max(0.0, deadline - time.monotonic()))
        if agent.proc.is_alive():
            agent.proc.kill()
            agent.proc.join(5)
        agent.dead = agent.dead or "closed"
        agent.conn.close()
