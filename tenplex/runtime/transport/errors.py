"""What the transports (`ucx/`, `cma`) share: `TransportError`, and a running command's cancel
flag. The agent raises the flag when its runtime says that a peer of the call failed
(`agent.server`), and a transport checks it between polls, so a survivor gives up at once
instead of waiting for the dead peer's messages until its own timeout.

Invariants: `check` raises `Cancelled` (a `TransportError`) while the flag is up, naming the
wait and the reason; one thread raises or lowers the flag, another reads it (a plain attribute:
its reads and writes are atomic).
"""

from __future__ import annotations

from tenplex.ir.errors import TenplexError

__all__ = ["Cancel", "Cancelled", "TransportError"]


class TransportError(TenplexError):
    """A transfer failed or timed out; the message names the peer and the operation."""


class Cancelled(TransportError):
    """A wait gave up because its command was cancelled (a peer of the call failed)."""


class Cancel:
    def __init__(self) -> None:
        self.why: str | None = None

    def set(self, why: str) -> None:
        self.why = why

    def clear(self) -> None:
        self.why = None

    def check(self, what: str) -> None:
        """Raises Cancelled naming `what` and the reason while the flag is up."""
        why = self.why
        if why is not None:
            raise Cancelled(f"{what}: cancelled: {why}")
