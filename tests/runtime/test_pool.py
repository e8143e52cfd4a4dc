"""`checkpoint.pool.run_all`: every job once, progress in the calling thread, the first failure in job order."""

from __future__ import annotations

import threading

import pytest

from tenplex.runtime.checkpoint.pool import run_all


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_job_runs_once_and_progress_is_reported_here(threads):
    ran, reported, lock, caller = [], [], threading.Lock(), threading.get_ident()

    def job(i):
        with lock:
            ran.append(i)

    run_all(50, job, threads, on_done=lambda: reported.append(threading.get_ident()), meanwhile=lambda: ran.append(-1))
    assert sorted(ran) == [-1, *range(50)]
    assert reported == [caller] * 50


def test_the_lowest_failed_job_is_raised_and_no_job_starts_after_it():
    started, gate = [], threading.Barrier(2)

    def job(i):
        started.append(i)
        if i in (3, 4):
            gate.wait(5)  # both fail, the higher one first
            if i == 3:
                threading.Event().wait(0.05)
            raise OSError(f"job {i}")

    with pytest.raises(OSError, match="job 3"):
        run_all(100, job, 2)
    assert sorted(started) == list(range(5))


def test_an_error_in_the_calling_thread_stops_the_jobs_and_is_raised():
    started = []

    def meanwhile():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_all(10_000, lambda i: started.append(i) or threading.Event().wait(0.001), 2, meanwhile=meanwhile)
    assert len(started) < 10_000
