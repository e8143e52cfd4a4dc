"""Ending an elastic job on SIGTERM, SIGINT or SIGHUP without orphaning its generation.

torchrun and its workers run in a session of their own (`launch`), so a signal to the
controller reaches only the controller. `raise_on_signals()` turns the first such signal into
`JobInterrupted`, raised wherever the controller is; its cleanup (`launch.terminate`: SIGTERM to
the generation's process group, SIGKILL after a grace period, then reaping) runs as for any
error. Further signals are ignored until the block exits, so a second Ctrl-C cannot cut that
cleanup short; the old handlers come back on exit.

Invariants:
- outside the main thread (where Python cannot set handlers) the block changes nothing;
- at most one JobInterrupted is raised per block.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from tenplex._signals import handling
from tenplex.elastic.errors import ElasticError

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class JobInterrupted(ElasticError):
    """The controller got `signum`; the running generation is being ended."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def raise_on_signals() -> Iterator[None]:
    """Within the block, the first SIGTERM, SIGINT or SIGHUP raises JobInterrupted (module doc)."""
    raised = False

    def handler(signum: int, frame: object) -> None:
        nonlocal raised
        if not raised:  # later signals: the cleanup the first one started must finish
            raised = True
            raise JobInterrupted(signum)

    with handling(dict.fromkeys(SIGNALS, handler)):
        yield
