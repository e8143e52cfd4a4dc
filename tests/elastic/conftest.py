"""The static runs the end-to-end elastic tests compare against. A static run is deterministic,
so each job document runs once per test session and every test comparing against it reads the
same metrics, also across pytest-xdist workers (a lock in the directory the workers share)."""

import fcntl
import hashlib
import json
import os
import shutil

import pytest

from tests.elastic.helpers import job_doc, metrics


@pytest.fixture(scope="session")
def static_metrics(tmp_path_factory):
    """`static_metrics(doc)`: the metrics of job document `doc` (no schedule) run by the controller
    without any change, run by the first test that asks for them."""
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.job import parse_job

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common parent

    def run(doc: dict) -> list[dict]:
        key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
        out, done = shared / f"static-{key}", shared / f"static-{key}.done"
        with open(shared / f"static-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker runs it; the others wait for its metrics
            if not done.exists():
                shutil.rmtree(out, ignore_errors=True)  # what a failed attempt left
                assert Controller(parse_job(doc), out, out=lambda _: None).run() == []
                done.touch()
        return metrics(out)

    return run


@pytest.fixture(scope="session")
def static_run(static_metrics) -> list[dict]:
    """The metrics of STATIC_STEPS steps on 2 processes (tp 1, dp 2) without any change."""
    return static_metrics(job_doc())
