"""An agent connection's heartbeat thread: beats while a command runs, and reads the runtime's
one-way `{"cancel": why}` meanwhile (`server` runs the commands).

While a command runs, the agent sends `{"beat": n, "done": rounds the execution finished}` every
`BEAT_S` seconds, so a runtime tells a busy agent from a stopped or hung one. A cancel frame (the
runtime says a peer of the call failed) or EOF raises the agent's `cancel` flag, which the
transport's waits check between polls (`transport.errors`), so the command fails at once.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

from tenplex.runtime.agent.agent import Agent
from tenplex.runtime.agent.channel import Channel, ChannelError

__all__ = ["BEAT_S", "REPLY_IDLE_S", "Heartbeat", "is_cancel"]

BEAT_S = 1.0
REPLY_IDLE_S = 60.0  # a runtime that takes no reply bytes for this long is gone


def is_cancel(message: Any) -> bool:
    """Whether a frame is the runtime's `{"cancel": why}` (one way: it gets no reply)."""
    return isinstance(message, dict) and set(message) == {"cancel"} and isinstance(message["cancel"], str)


class Heartbeat:
    """The beat thread of one connection (see the module), not one per command: starting and
    joining a thread around every command put a thread wakeup on the path of every reply. It
    keeps a frame other than a cancel, read while a command ran, in `pending` for the command loop.

    Invariants: this thread reads only under the lock and only while the command that was running
    when its poll began still runs (`started` unchanged), the loop only between commands, so no
    frame is split between them and this thread never waits for bytes the loop already took; a
    beat is sent under the lock that `busy` takes to end, so no beat follows its command's reply;
    `busy` lowers the flag as the command starts, and the runtime sends a cancel only after its
    command, so a cancel is for the running command or, read by the loop after it, dropped."""

    def __init__(self, channel: Channel, agent: Agent):
        self.channel, self.agent = channel, agent
        self.lock, self.stop, self.since = threading.Lock(), threading.Event(), None  # since: the command's start
        self.started = 0  # commands started on this connection: tells the running one from the next
        self.pending: list[Any] = []  # requests read while a command ran, for the loop
        self.thread = threading.Thread(target=self._run, name="tenplex-agent-beat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self.lock:
            self.since = time.monotonic()
            self.started += 1
            self.agent.cancel.clear()
        try:
            yield
        finally:
            with self.lock:
                self.since = None

    def _run(self) -> None:
        n, current = 0, None  # beats sent for the command that started at `current`
        while not self._listen(BEAT_S / 4):
            with self.lock:
                if self.since != current:
                    n, current = 0, self.since
                if current is None or time.monotonic() - current < BEAT_S * (n + 1):
                    continue
                n += 1
                try:
                    self.channel.send({"beat": n, "done": _rounds_done(self.agent)}, REPLY_IDLE_S)
                except ChannelError:
                    return

    def _listen(self, wait: float) -> bool:
        """Wait up to `wait` s, reading what the runtime sends while a command runs (see the
        class); True once the connection's loop ended."""
        with self.lock:
            command = self.started if self.since is not None else None
        if command is None or self.channel.closed:
            return self.stop.wait(wait)
        try:  # poll, not select: an agent's descriptors (arenas, UCX) may number beyond select's 1024
            poller = select.poll()
            poller.register(self.channel.fileno(), select.POLLIN)
            if not poller.poll(wait * 1000):
                return self.stop.is_set()
        except (OSError, ValueError):  # the channel closed meanwhile: the loop sees it
            return self.stop.wait(wait)
        with self.lock:
            # The poll's command ended meanwhile: what woke it (the next command, read by the loop
            # before this thread got the lock, or a late cancel) is the loop's; reading here would
            # wait for bytes that never come, holding the lock that ends the next command.
            if self.since is None or self.started != command or self.channel.closed:
                return self.stop.is_set()
            try:
                message = self.channel.recv(REPLY_IDLE_S)
            except ChannelError:  # the runtime left: nobody waits for this command's result
                self.agent.cancel.set("the runtime closed the connection")
                return self.stop.is_set()
            if is_cancel(message):
                self.agent.cancel.set(message["cancel"])
            else:
                self.pending.append(message)
        return self.stop.is_set()


def _rounds_done(agent: Agent) -> int:
    """Rounds the agent's execution finished (0: none). A function, not a local of the beat loop:
    a local would hold the last beat's `Execution`, and with it the ~200 views of its dst arena,
    until the next beat (during some later command), so the dropped tag's arena could not go
    back to the pool and the next execution faulted a new one in."""
    ex = agent.execution
    return ex.done if ex is not None else 0
