"""The elastic examples as a newcomer runs them (issue 13, items 5 and 6): `examples/README.md`'s
torchrun command and `tenplex job run examples/elastic_gpt.yaml`, for real, from a directory that
is not the repository; and the example's one-line failures when its environment or job
directory is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.elastic.helpers import EXAMPLE
from tests.mounts import ROOT

JOB_FILE = ROOT / "examples" / "elastic_gpt.yaml"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENPLEX_")}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **extra}


def _torchrun() -> list[str]:
    """`torchrun` as the README writes it (the script beside this Python), else its module."""
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_torchrun_example_creates_its_job_dir_and_writes_only_there(tmp_path):
    # examples/README.md: TENPLEX_TP=2 TENPLEX_DP=1 torchrun --standalone --nproc-per-node 2
    # examples/elastic_gpt.py --job-dir /tmp/gpt --steps 3; here the job dir and its parent are new
    job_dir = tmp_path / "runs" / "gpt"
    cmd = [*_torchrun(), "--standalone", "--nproc-per-node", "2", "examples/elastic_gpt.py", "--job-dir", str(job_dir),
           "--steps", "3", "--samples", "64"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=_env(TENPLEX_TP="2", TENPLEX_DP="1"), capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["W"], r["tp"], r["dp"]) for r in records] == [(0, 2, 2, 1), (1, 2, 2, 1), (2, 2, 2, 1)]
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and [p.name for p in job_dir.parent.iterdir()] == ["gpt"]
    assert sorted(p.name for p in job_dir.iterdir()) == ["dataset-0", "metrics.jsonl", "saved"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_shipped_job_file_runs_from_any_directory(tmp_path):
    # README: tenplex job run examples/elastic_gpt.yaml -- here from another directory, so the
    # program resolves against the job file and the job directory lands in the current one
    cmd = [sys.executable, "-m", "tenplex.cli", "job", "run", str(JOB_FILE)]
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["job directory: elastic_gpt.job",
                                        "done: 2 reconfiguration(s); report in elastic_gpt.job/report.json"]  # fmt: skip
    assert done.stderr == ""  # progress is for terminals (stderr is a pipe here)
    records = [json.loads(line) for line in (tmp_path / "elastic_gpt.job" / "metrics.jsonl").read_text().splitlines()]
    assert [r["W"] for r in records] == [2, 2, 2, 1, 1, 1, 2, 2, 2] and records[-1]["pp"] == 2


EXAMPLE_ERRORS = {
    "degrees_do_not_multiply": ({"TENPLEX_TP": "3"}, "gpt", "TENPLEX_TP x TENPLEX_DP x TENPLEX_PP = 3 but WORLD_SIZE = 1"),
    "not_an_integer": ({"TENPLEX_TP": "two"}, "gpt", "TENPLEX_TP: expected an integer, got 'two'"),
    "job_dir_under_a_file": ({}, "a-file/gpt", "a-file/gpt: cannot create the job directory (Not a directory)"),
    "job_dir_is_a_file": ({}, "a-file", "a-file: the job directory exists and is not a directory"),
}  # fmt: skip


@pytest.mark.parametrize("name", EXAMPLE_ERRORS)
def test_the_example_fails_at_once_with_one_line(tmp_path, name):
    # before any process group or data set: no rendezvous, no traceback, nothing written
    env, job_dir, message = EXAMPLE_ERRORS[name]
    (tmp_path / "a-file").write_text("")
    cmd = [sys.executable, str(EXAMPLE), "--job-dir", str(tmp_path / job_dir)]
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(**env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"elastic_gpt.py: error: {message.replace('a-file', str(tmp_path / 'a-file'))}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
