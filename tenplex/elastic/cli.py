"""`tenplex job`: run an elastic job, and ask a running one to change its devices.

    tenplex job run JOB_FILE --job-dir DIR      run the job (JSON/YAML job file; see job.py)
    tenplex job scale --job-dir DIR --devices N [--tp T]
                                                 ask the job's controller for N processes

Register with `cli.add_command(job)` in `tenplex/cli.py`. Errors (TenplexError) print one line
and exit with code 2, as every tenplex command does.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click


@click.group("job")
def job() -> None:
    """Elastic training jobs: run one, or rescale a running one."""


@job.command("run")
@click.argument("job_file", type=click.Path(dir_okay=False, exists=True))
@click.option("--job-dir", required=True, type=click.Path(file_okay=False), help="Fresh directory for state, logs and the report.")
def run_cmd(job_file: str, job_dir: str) -> None:
    """Run JOB_FILE's program elastically, reconfiguring at each schedule event or scale request."""
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.job import load_job

    controller = Controller(load_job(job_file), job_dir, out=click.echo)
    reconfigurations = controller.run()
    click.echo(f"done: {len(reconfigurations)} reconfiguration(s); report in {Path(job_dir) / 'report.json'}")


@job.command("scale")
@click.option("--job-dir", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--devices", required=True, type=click.IntRange(min=1), help="Processes the job should run on.")
@click.option("--tp", type=click.IntRange(min=1), help="Force this tensor-parallel degree.")
def scale_cmd(job_dir: str, devices: int, tp: int | None) -> None:
    """Ask the controller running in JOB_DIR to move the job to DEVICES processes."""
    from tenplex.elastic.errors import ElasticError

    if tp is not None and devices % tp:
        raise ElasticError(f"--tp: {tp} does not divide --devices {devices}")
    control = Path(job_dir) / "control"
    control.mkdir(exist_ok=True)
    path = control / f"scale-{time.time_ns()}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"devices": devices, "tp": tp}))
    tmp.rename(path)  # the controller only picks up scale-*.json: a request is whole or absent
    click.echo(f"requested {devices} device(s): {path}")


if __name__ == "__main__":
    job(prog_name="tenplex job")
