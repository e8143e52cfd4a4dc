"""Failure recovery in the controller: ranks of the example GPT really crash at a step (SIGKILL,
no save), torchrun tears the job down, and the job carries on on the survivors — from their DP
replicas when those hold the whole state, else from the last checkpoint — with the same losses
and sample order as a run without the failure."""

import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import parse_job
from tests.elastic.helpers import job_doc as _job
from tests.elastic.helpers import metrics as _metrics
from tests.elastic.helpers import same_training


def test_failure_naming_ranks_outside_the_generation_is_refused_before_launch(tmp_path):
    spec = parse_job(_job(schedule=[{"at_step": 2, "fail": [2]}]), "job.json")
    with pytest.raises(ElasticError, match=re.escape("job.json: the failure at step 2 names ranks [2], but generation 0 has 2 (0..1)")):
        Controller(spec, tmp_path / "run", out=lambda _: None).run()
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_dp_replica_recovers_without_losing_steps(tmp_path, static_run):
    lines: list[str] = []
    recs = Controller(parse_job(_job(schedule=[{"at_step": 2, "fail": [1]}])), tmp_path, out=lines.append).run()
    [rec] = recs
    assert (rec.step, rec.src, rec.dst, rec.failed, rec.recovered_from, rec.lost_steps) == (
        2, ParallelConfig(1, 2), ParallelConfig(1, 1), (1,), "replicas", 0)  # fmt: skip
    assert set(rec.phases) == {"stop", "save", "exit", "plan", "move", "reshard", "restart"}  # the state in the store
    assert "injected failure at step 2" in (tmp_path / "logs" / "gen-0.log").read_text()
    assert json.loads((tmp_path / "saved" / "gen-0" / "timing.json").read_text())["failed"] == [1]
    run = _metrics(tmp_path)
    assert [r["step"] for r in run] == list(range(5)) and [r["W"] for r in run] == [2, 2, 1, 1, 1]
    same_training(static_run, run)
    assert sorted({r['step'] for r in run}) == [r['step'] for r in static_run]
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "done"
    assert any("after ranks [1] failed, from replicas (0 steps lost)" in line for line in lines)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_lost_tensor_shard_falls_back_to_the_last_checkpoint(tmp_path, static_run):
    # tp 2 x dp 1: rank 1's half of every split Linear has no replica, so the job restarts from
    # the last checkpoint (here the job's start) and runs steps 0 and 1 again
    job = _job(parallel={"2": [2, 1, 1]}, schedule=[{"at_step": 2, "fail": [1]}])
    lines: list[str] = []
    [rec] = Controller(parse_job(job), tmp_path, out=lines.append).run()
    assert (rec.src, rec.dst, rec.recovered_from, rec.lost_steps) == (ParallelConfig(2, 1), ParallelConfig(1, 1), "checkpoint", 2)
    assert "rerun" in rec.phases and any("the survivors do not hold the whole state" in line for line in lines)
    run = _metrics(tmp_path)
    assert [r["step"] for r in run] == [0, 1, 0, 1, 2, 3, 4]
    same_training(static_run, run)
    assert sorted({r['step'] for r in run}) == [r['step'] for r in static_run]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_checkpoint_policy_restarts_from_the_generation_start(tmp_path, static_run):
    job = _job(recovery="checkpoint", schedule=[{"at_step": 1, "devices": 2, "tp": 2}, {"at_step": 3, "fail": [0]}])
    first, second = Controller(parse_job(job), tmp_path, out=lambda _: None).run()
    assert second.recovered_from == "checkpoint" and second.lost_steps == 2 and second.dst == ParallelConfig(1, 1)
    run = _metrics(tmp_path)
    assert [r["step"] for r in run] == [0, 1, 2, 1, 2, 3, 4]  # generation 1 started at step 1
    same_training(static_run, run)
    assert sorted({r['step'] for r in run}) == [r['step'] for r in static_run]


def _workers(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_unplanned_crash_restarts_from_the_last_checkpoint(tmp_path, static_run):
    # a worker killed from outside at an arbitrary moment: torchrun fails the generation, and the
    # controller (max_restarts 1) runs the same layout again from the last checkpoint
    controller = Controller(parse_job(_job(steps=10, max_restarts=1)), tmp_path, out=lambda _: None)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(controller.run()), daemon=True)
    thread.start()
    metrics_path = tmp_path / "metrics.jsonl"
    while not (metrics_path.exists() and len(metrics_path.read_text().splitlines()) >= 2):
        assert thread.is_alive(), "the job ended before its second step"
        thread.join(0.05)
    os.kill(_workers(controller.proc.pid)[1], signal.SIGKILL)
    thread.join(240)
    assert not thread.is_alive() and done
    [rec] = done[0]
    assert rec.src == rec.dst == ParallelConfig(1, 2) and rec.recovered_from == "checkpoint" and rec.lost_steps >= 2
    run = _metrics(tmp_path)
    assert sorted({r["step"] for r in run}) == list(range(10)) and run[-1]["generation"] == 1
    same_training(static_run, run)


def test_unplanned_crash_without_restarts_fails_the_job(tmp_path):
    program = tmp_path / "crash.py"
    program.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    spec = parse_job({"program": str(program), "devices": 1, "timeout": 60, "max_restarts": 1})
    lines: list[str] = []
    with pytest.raises(ElasticError, match=re.escape("generation 1: the program exited with code")):
        Controller(spec, tmp_path / "run", out=lines.append).run()
    assert any("generation 0: the program exited with code" in line and "restart 1 of 1" in line for line in lines)
