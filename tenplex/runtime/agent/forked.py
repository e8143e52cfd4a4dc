"""`Forked`: an agent process forked from this one, with the part of `multiprocessing.Process`'s
interface that `client` uses (pid, sentinel, is_alive, join, kill, exitcode).

Why not `multiprocessing`'s fork context: a forked agent closes every descriptor it inherited
but its own socket and the standard streams (so that peers waiting for EOF on this process's
pipes and other agents' control sockets see it), and with them the pipe end that is
`multiprocessing`'s sentinel: the sentinel then reads as "exited" while the agent runs, and a
`join(timeout)` on a stopped agent blocks forever in `waitpid`. Here the sentinel is a pidfd,
which becomes readable when the process exits and at no other time, whatever it closes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
from collections.abc import Callable
from typing import Any


class Forked:
    def __init__(self, target: Callable[..., Any], args: tuple, keep: socket.socket):
        """Fork; the child closes every descriptor but `keep` and 0-2, runs `target(*args)`
        and exits (status 0, or 1 after an exception, which it prints)."""
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                fd = keep.fileno()
                os.closerange(3, fd)
                os.closerange(fd + 1, _max_fd())
                target(*args)
                code = 0
            except BaseException:  # noqa: BLE001 (the child's last words, then its own exit)
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.pid, self.exitcode = pid, None
        self.sentinel = os.pidfd_open(pid)

    def is_alive(self) -> bool:
        return self._reap(os.WNOHANG) is None

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None and select.select([self.sentinel], [], [], timeout)[0]:
            self._reap(0)

    def kill(self) -> None:
        if self.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.sentinel, signal.SIGKILL)

    def close(self) -> None:
        """Reap the process if it ended and close the pidfd."""
        self.is_alive()
        with contextlib.suppress(OSError):
            os.close(self.sentinel)

    def _reap(self, flags: int) -> int | None:
        if self.exitcode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: gone, its status unknown
                self.exitcode = -1
            else:
                if pid:
                    self.exitcode = os.waitstatus_to_exitcode(status)
        return self.exitcode


def _max_fd() -> int:
    with contextlib.suppress(OSError, ValueError):
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    return os.sysconf("SC_OPEN_MAX")

