"""The job directory: where an elastic job keeps everything it writes (N is the generation).

    state/gen-N/            what generation N starts from: `STORED` (the store tag state-N holds
                            it) or, with `state: files`, a DCP checkpoint in N's layout; plus
                            `data_state.json` and `parallel.json` (empty after a failure with no
                            checkpoint: start afresh)
    saved/gen-N/            what generation N saved at its stop: `data_state.json`, `parallel.json`
                            (the program's declaration), `timing.json` (wall times; `stop_step`
                            when it stopped on request) and `COMPLETE` (written last, rank 0);
                            with `state: files` its DCP files; after the last generation, its
                            state as DCP files in `checkpoint/`
    hosts/h<i>/             across hosts: host i's own job directory (the first host's is this one)
    control/stop-N          present: generation N stops at its next step boundary
    control/scale-*.json    scale requests (`requests`)
    metrics.jsonl           one JSON record per `Job.log` call (rank 0)
    logs/gen-N.log          generation N's torchrun output (`launch`)
    status.json, report.json  what the controller is doing, and what it did

A training program may keep its own files there too (the example writes its synthetic data set
to `dataset-<seed>/`); nothing of a job is written outside it.

Invariants:
- `make_job_dir` leaves a writable directory or raises; concurrent calls (every rank of a
  generation) all succeed.
"""

from __future__ import annotations

import os
from pathlib import Path

from tenplex.elastic.errors import ElasticError


def state_dir(job_dir: str | os.PathLike, generation: int) -> Path:
    return Path(job_dir) / "state" / f"gen-{generation}"


def saved_dir(job_dir: str | os.PathLike, generation: int) -> Path:
    return Path(job_dir) / "saved" / f"gen-{generation}"


def stop_file(job_dir: str | os.PathLike, generation: int) -> Path:
    return Path(job_dir) / "control" / f"stop-{generation}"


def metrics_file(job_dir: str | os.PathLike) -> Path:
    return Path(job_dir) / "metrics.jsonl"


def make_job_dir(job_dir: str | os.PathLike) -> Path:
    """`job_dir`, created with its parents when missing.

    Raises: ElasticError naming the directory when it cannot be created or written to."""
    path = Path(job_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ElasticError(f"{path}: the job directory exists and is not a directory") from None
    except OSError as e:
        raise ElasticError(f"{path}: cannot create the job directory ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ElasticError(f"{path}: the job directory is not writable")
    return path
