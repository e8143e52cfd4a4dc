"""Start one generation of a training program under torchrun, and end it.

`launch(spec, job_dir, generation, config, stop_step)` runs

    python -m torch.distributed.run --standalone --nproc-per-node W PROGRAM ARGS --job-dir DIR

in a new session (so the whole process tree can be signalled), with TENPLEX_JOB_DIR,
TENPLEX_GENERATION, TENPLEX_TP/DP/PP, TENPLEX_STOP_STEP and TENPLEX_FAIL_RANKS set, output to
`DIR/logs/gen-N.log`. `terminate(proc)` ends that tree: SIGTERM, then SIGKILL after a grace
period; it always reaps the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.job import JobSpec


def log_path(job_dir: str | os.PathLike, generation: int) -> Path:
    return Path(job_dir) / "logs" / f"gen-{generation}.log"


def command(spec: JobSpec, job_dir: Path, config: ParallelConfig) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(config.world),
            str(spec.program), *spec.args, "--job-dir", str(job_dir)]  # fmt: skip


def launch(spec: JobSpec, job_dir: Path, generation: int, config: ParallelConfig, stop_step: int | None,
           fail: tuple[int, ...] = ()) -> subprocess.Popen:  # fmt: skip
    """Start generation `generation` (see the module docstring); `fail`: ranks that crash at `stop_step`."""
    env = dict(os.environ, TENPLEX_JOB_DIR=str(job_dir), TENPLEX_GENERATION=str(generation),
               TENPLEX_TP=str(config.tp), TENPLEX_DP=str(config.dp), TENPLEX_PP=str(config.pp),
               TENPLEX_STOP_STEP="" if stop_step is None else str(stop_step), TENPLEX_FAIL_RANKS=",".join(map(str, fail)),
               OMP_NUM_THREADS="1")  # fmt: skip
    log = log_path(job_dir, generation)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(command(spec, job_dir, config), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip


def terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End the process tree of `proc` (TERM, then KILL after `grace` s) and reap it."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(5.0)


def log_tail(job_dir: str | os.PathLike, generation: int, lines: int = 15) -> str:
    try:
        return "\n".join(log_path(job_dir, generation).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
