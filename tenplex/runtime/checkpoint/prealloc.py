"""Dst files whose pages are allocated while the plan is still being compiled (`tenplex reshard`).

A write into a new tmpfs file allocates each page as it copies into it: about a third of the
cost of writing a checkpoint into /dev/shm (measured: writing 1 GiB of `.npy` files into files
`posix_fallocate`d before took 0.44-0.49 CPU s against 0.67-0.84 into new ones). So
`Preallocation(root, files)` starts a small helper process as soon as the dst layout is known
(a bare `python -I -S`: no import, its list of files on stdin) that creates each file under
`root` (whose directories exist) and `posix_fallocate`s it at the size given (`npy_files`: all
but the end of its header, whose length needs numpy), in the order given, while this process
imports numpy and the compiler, reads the src and compiles the plan on the other core. The writers
then open the files without `O_EXCL` (`PlannedFiles.preallocated`): whoever comes first
creates a file, and one the writers reach first is only written (`fallocate` never changes
data, nor the size of a file already that large).

Best effort: where the helper cannot start, or the file system refuses (`ENOSPC`, `EOPNOTSUPP`),
the helper only stops; the writers then allocate what is left themselves and report any error
as before. `stop()` kills the helper if it still runs and reaps it; the caller stops it before
the tree is made durable or deleted.

Invariants: the helper only ever creates or extends the files it was given, under `root`, at
most to the size given (`npy_files`: never more than the file will hold) (`O_NOFOLLOW`: a name that is a symlink is refused); it never writes a byte.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tenplex._signals import handling
from tenplex.ir.ptc import PTC

__all__ = ["Preallocation", "npy_files"]

_HELPER = """
import os, sys
root, flags = sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
try:
    for line in sys.stdin.read().splitlines():
        size, rel = line.split("\\t", 1)
        fd = os.open(os.path.join(root, rel), flags, 0o644)
        try:
            os.posix_fallocate(fd, 0, int(size))
        finally:
            os.close(fd)
except OSError:
    pass
"""


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP recorded, not handled, within the block, and handled as it ends:
    raised in the middle of `Popen`, their exception would lose the started helper's handle.
    Handlers, not the signal mask: the kernel gives a process-directed signal to a thread that
    does not hold it (numpy's BLAS threads are enough) and Python runs the handler in the main
    thread anyway, so a mask held by this thread alone leaves the window open (`_signals`)."""
    caught: list[int] = []
    try:
        with handling(dict.fromkeys((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), lambda signum, frame: caught.append(signum))):
            yield
    finally:
        for s in caught:
            signal.raise_signal(s)  # its handler, put back, runs (and may raise) before this returns


NPY_HEADER_MIN = 64  # bytes: every `.npy` header is longer (magic, version, length, the dict, aligned to 64)


def npy_files(ptc: PTC, rel: dict[str, str]) -> list[tuple[str, int]]:
    """(relative path, bytes to allocate) of each sub-tensor's `.npy` file (`rel`: its path), in
    the reverse of the order `checkpoint.directory.write_checkpoint` writes them: its data and
    `NPY_HEADER_MIN`, never more than the file will hold (its header's exact length needs
    numpy, which `tenplex reshard` has not imported yet when it starts the helper; the last
    page of a file is then left to the writer)."""
    itemsizes = ptc.itemsizes
    return [(rel[st.id], NPY_HEADER_MIN + st.volume * itemsizes[st.tensor]) for st in reversed(ptc.subtensors)]


class Preallocation:
    """A helper process allocating `files` ([(path relative to `root`, size)]); see the module docstring."""

    def __init__(self, root: Path, files: list[tuple[str, int]]):
        self.proc: subprocess.Popen | None = None
        if not files or not hasattr(os, "posix_fallocate") or not sys.executable:
            return
        try:
            with tempfile.TemporaryFile() as todo, _signals_deferred():  # a file, not a pipe: never waits for the helper
                todo.write("".join(f"{n}\t{rel}\n" for rel, n in files).encode())
                todo.seek(0)
                self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER, str(root)], stdin=todo,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        except OSError:  # no temporary file, no interpreter to start: the writers allocate as they write
            self.stop()
            self.proc = None
        except BaseException:  # a SIGTERM or Ctrl-C deferred while it started, raised once its handle is kept
            self.stop()  # else the helper would go on creating files in a tree being deleted
            raise

    @property
    def started(self) -> bool:
        return self.proc is not None

    def stop(self) -> None:
        """End the helper (killed if it still runs) and reap it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
