"""A plan's dst files written by N worker processes (`tenplex reshard --workers N`).

`WorkerFiles(files, workers)` stands for the dst arrays of a `PlannedFiles` as the object whose
`write_files(out, {sub-tensor id: relative path})` `checkpoint.directory.write_checkpoint`
calls once OUT's directories exist. It forks `workers` processes (`tenplex-worker-w0`, ...)
from the writer's process once the plan is compiled and the src files mapped, so a worker
starts with everything it needs and imports nothing. The files are shared out by bytes
(largest first, each to the least loaded worker); each worker writes its share as one worker
writes them all (`PlannedFiles.write`: copies in the kernel from the src files, which every
worker reads directly: nothing moves between workers), and reports each file on a pipe.

Failure (the same as with one worker, where it can be): a write error in a worker is raised
in the writer as it was raised in the worker (`WriteError` naming the file and errno,
`ExecutionError` for ops that do not tile a file); a worker that dies, before or after its
files, is an ExecutionError naming it ("host 'w1': worker process died (exit code -9)"). A
worker leaves with status 0 only after the writer has received all its files and closed its
pipe, so every worker's clean exit is checked before OUT is committed. On any failure the
other workers are killed and reaped before the error is raised; the caller's temporary
directory is then deleted (`write_checkpoint_dir`). A worker whose writer dies is killed by
the kernel (`PR_SET_PDEATHSIG`).

Invariants: every file of `files` is written by exactly one worker; `write_files` returns only
when every worker wrote its share and exited with status 0, and never leaves a worker running.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import signal
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tenplex.ir.errors import ExecutionError
from tenplex.runtime.checkpoint.directory import THREADS, write_files
from tenplex.runtime.checkpoint.planned import PlannedFiles

__all__ = ["WorkerFiles", "fork_available", "shares"]

JOIN_S = 10.0  # a worker whose pipe was closed exits at once; this long is a hang


def fork_available() -> bool:
    """Whether this system can fork workers. Also where other threads run: a worker takes no
    lock of this process's that another thread may hold (it only writes files and sends on its
    pipe: no logging, no import, no print), and the interpreter re-creates its own at the fork."""
    return "fork" in mp.get_all_start_methods()


def shares(sizes: Mapping[str, int], workers: int) -> list[list[str]]:
    """The keys of `sizes` in `workers` lists of about equal total size: largest first, each
    to the least loaded list (ties: the lower index)."""
    out: list[list[str]] = [[] for _ in range(workers)]
    load = [0] * workers
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        i = load.index(min(load))
        out[i].append(key)
        load[i] += sizes[key]
    return out


class WorkerFiles:
    """The dst files of `files`, written by `workers` forked processes (see the module
    docstring); `on_file(done, total)` is called in the writer after each file."""

    def __init__(self, files: PlannedFiles, workers: int, on_file: Callable[[int, int], None] | None = None):
        self.files, self.workers, self.on_file = files, workers, on_file

    @property
    def preallocated(self) -> bool:
        return self.files.preallocated

    def write_files(self, out: Path, rel: Mapping[str, str], meanwhile: Callable[[], None] | None = None) -> None:
        sizes = {sid: self.files.dst.nbytes_of(self.files.dst.subtensor_map[sid]) for sid in rel}
        threads = max(1, THREADS // self.workers)
        ctx = mp.get_context("fork")
        running: list[_Worker] = []
        try:
            for i, share in enumerate(shares(sizes, min(self.workers, len(rel)) or 1)):
                mine, theirs = ctx.Pipe()
                inherited = [mine, *(w.conn for w in running)]  # the writer's ends: closed in the worker
                args = (f"w{i}", self.files, out, {sid: rel[sid] for sid in share}, theirs, inherited, threads)
                proc = ctx.Process(target=_work, args=args, name=f"tenplex-worker-w{i}", daemon=True)
                proc.start()
                theirs.close()
                running.append(_Worker(f"w{i}", proc, mine, len(share)))
            if meanwhile is not None:
                meanwhile()
            _collect(running, len(rel), self.on_file)
        finally:
            for w in running:
                w.stop()


class _Worker:
    def __init__(self, host: str, proc: Any, conn: Connection, files: int):
        self.host, self.proc, self.conn, self.left = host, proc, conn, files

    def died(self) -> ExecutionError:
        self.proc.join(JOIN_S)
        return ExecutionError(f"host {self.host!r}: worker process died (exit code {self.proc.exitcode})")

    def stop(self) -> None:
        """Kill the process if it still runs, and reap it."""
        self.conn.close()
        if self.proc.exitcode is None:
            self.proc.kill()
        self.proc.join(JOIN_S)


def _collect(running: list[_Worker], total: int, on_file: Callable[[int, int], None] | None) -> None:
    """Wait for every worker's files, then for its exit. Raises the first failure."""
    done = 0
    busy = {w.conn: w for w in running if w.left}
    while busy:
        for conn in wait(list(busy)):
            w = busy[conn]
            try:
                msg = conn.recv()
            except EOFError:
                raise w.died() from None
            if isinstance(msg, BaseException):
                raise msg
            w.left, done = w.left - 1, done + 1
            if on_file is not None:
                on_file(done, total)
            if not w.left:
                del busy[conn]
    for w in running:
        w.conn.close()  # the worker's signal to exit
        w.proc.join(JOIN_S)
        if w.proc.exitcode != 0:
            raise w.died()


def _work(host: str, files: PlannedFiles, out: Path, rel: dict[str, str], conn: Connection,
          inherited: list[Connection], threads: int) -> None:  # fmt: skip
    """A worker: write the files `rel`, reporting each on `conn`, then wait for the writer to
    close it. An error is sent to the writer instead, and ends the worker."""
    gc.disable()  # a short life: collections would only copy the writer's pages
    _die_with_parent()
    for end in inherited:  # else a worker would wait for its pipe's EOF until this one exits
        end.close()
    try:
        write_files(out, rel, files.write, threads, on_file=lambda: conn.send(None), exclusive=not files.preallocated)
    except Exception as e:  # noqa: BLE001 (raised again in the writer)
        try:
            conn.send(e)
        except Exception:  # noqa: BLE001 (an error that cannot be pickled: its text)
            conn.send(ExecutionError(f"host {host!r}: {type(e).__name__}: {e}"))
        return
    with contextlib.suppress(EOFError):
        conn.recv()


def _die_with_parent() -> None:
    """SIGKILL this process when the process that forked it dies (Linux `PR_SET_PDEATHSIG`)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
