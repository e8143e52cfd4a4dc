"""`run_all(count, job, threads)`: jobs 0..count-1 on a few threads, failures raised in order.

The dst files of a reshard are written by `THREADS` threads (their copies run in the kernel, in
parallel). Each thread takes the next job number and runs it; the calling thread runs
`meanwhile()` and then only waits, woken once per job only where it reports progress
(`on_done`). A `ThreadPoolExecutor` did the same with a future per file, each completion waking
the calling thread (1216 futures for the bench's 1.07 GiB: ~3600 futex calls, a context switch
each on 2 cores), and on an error it still ran every queued file before raising.

Invariants:
- every job runs at most once; with no failure every job has run when `run_all` returns;
- after a failure, or an exception in the calling thread (SIGTERM, `meanwhile` failing), no job
  is started, the threads finish the one they run and are joined, then the exception is
  raised: the one of the failed job with the lowest number (jobs start in number order, so
  every lower job had run), else the calling thread's.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

__all__ = ["THREADS", "run_all"]

THREADS = min(4, os.cpu_count() or 1)  # files written at once: their copies run in the kernel, in parallel


def run_all(count: int, job: Callable[[int], object], threads: int = THREADS, on_done: Callable[[], None] | None = None,
            meanwhile: Callable[[], None] | None = None) -> None:  # fmt: skip
    """`job(i)` for i in 0..count-1, `threads` at a time (see the module docstring); `on_done()`
    after each job and `meanwhile()` while they run, both in this thread. Raises what the first
    failed job raised."""
    if threads == 1 or count < 2:
        if meanwhile is not None:
            meanwhile()
        for i in range(count):
            job(i)
            if on_done is not None:
                on_done()
        return
    _Pool(count, job, on_done is not None).run(min(threads, count), on_done, meanwhile)


class _Pool:
    def __init__(self, count: int, job: Callable[[int], object], report: bool):
        self.job, self.order, self.lock = job, iter(range(count)), threading.Lock()
        self.failed: list[tuple[int, BaseException]] = []  # also what stops the threads
        self.done: queue.SimpleQueue | None = queue.SimpleQueue() if report else None  # True per job, False per thread ended

    def run(self, threads: int, on_done: Callable[[], None] | None, meanwhile: Callable[[], None] | None) -> None:
        pool = [threading.Thread(target=self._thread, name=f"tenplex-write-{k}") for k in range(threads)]
        for t in pool:
            t.start()
        try:
            if meanwhile is not None:
                meanwhile()
            ended = 0
            while self.done is not None and ended < threads:
                if self.done.get():
                    on_done()
                else:
                    ended += 1
        except BaseException as e:
            self.failed.append((-1, e))  # stops the threads; raised as it is, below
            raise
        finally:
            for t in pool:
                t.join()
        if self.failed:
            raise min(self.failed, key=lambda f: f[0])[1]

    def _thread(self) -> None:
        try:
            while not self.failed:
                with self.lock:
                    i = next(self.order, None)
                if i is None:
                    return
                try:
                    self.job(i)
                except BaseException as e:  # noqa: BLE001 (raised in the calling thread)
                    self.failed.append((i, e))
                    return
                if self.done is not None:
                    self.done.put(True)
        finally:
            if self.done is not None:
                self.done.put(False)
