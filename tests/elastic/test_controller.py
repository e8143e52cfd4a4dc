"""The controller: scale requests, and one end-to-end elastic run of the example GPT
(W 2 -> 1 -> 2, changing dp and tp) against a static run."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tenplex.cli.job import job
from tenplex.elastic.api import ParallelConfig, stop_file
from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import Event, parse_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_gpt.py"
ARGS = ["--steps", "6", "--samples", "64", "--layers", "1"]


def _running(job_dir: Path) -> Path:
    """`job_dir` as a running controller marks it (`job scale --job-dir` writes only there)."""
    (job_dir / "status.json").write_text('{"state": "running", "max_devices": 8}')
    return job_dir


def test_scale_request_is_picked_up_and_stops_the_generation(tmp_path):
    _running(tmp_path)
    result = CliRunner().invoke(job, ["scale", "--job-dir", str(tmp_path), "--devices", "4", "--tp", "2"])
    assert result.exit_code == 0, result.output
    controller = Controller(parse_job({"program": "p.py", "devices": 2}), tmp_path)
    event, requested_at = controller._poll_request(0, ParallelConfig(1, 2))
    assert event == Event(4, tp=2) and requested_at > 0
    assert stop_file(tmp_path, 0).exists() and not list((tmp_path / "control").glob("scale-*.json"))


def test_scale_request_to_the_same_layout_is_ignored(tmp_path):
    _running(tmp_path)
    CliRunner().invoke(job, ["scale", "--job-dir", str(tmp_path), "--devices", "2"])
    controller = Controller(parse_job({"program": "p.py", "devices": 2}), tmp_path)
    assert controller._poll_request(0, ParallelConfig(1, 2)) is None and not stop_file(tmp_path, 0).exists()


def test_scale_cli_rejects_tp_not_dividing(tmp_path):
    _running(tmp_path)
    result = CliRunner().invoke(job, ["scale", "--job-dir", str(tmp_path), "--devices", "3", "--tp", "2"])
    assert isinstance(result.exception, ElasticError) and "--tp: 2 does not divide --devices 3" in str(result.exception)


def test_failing_program_names_generation_and_log(tmp_path):
    program = tmp_path / "fail.py"
    program.write_text("raise SystemExit(3)\n")
    spec = parse_job({"program": str(program), "devices": 1, "timeout": 60})
    with pytest.raises(ElasticError, match=re.escape("generation 0: the program exited with code")):
        Controller(spec, tmp_path / "run", out=lambda _: None).run()


def _metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("state", ["store", "files"])
def test_elastic_run_matches_static_run(tmp_path, state, static_metrics):
    elastic = parse_job({"program": str(EXAMPLE), "args": ARGS, "devices": 2, "timeout": 120, "state": state,
                         "schedule": [{"at_step": 2, "devices": 1}, {"at_step": 4, "devices": 2, "tp": 2}]})  # fmt: skip
    lines: list[str] = []
    recs = Controller(elastic, tmp_path / "elastic", out=lines.append).run()
    assert [(r.step, r.src, r.dst) for r in recs] == [(2, ParallelConfig(1, 2), ParallelConfig(1, 1)),
                                                      (4, ParallelConfig(1, 1), ParallelConfig(2, 1))]  # fmt: skip
    moves = {"plan", "move", "reshard"} if state == "store" else {"reshard"}  # reshard = plan + move with the store
    assert all(set(r.phases) == {"stop", "save", "exit", "restart"} | moves for r in recs)
    checkpoints = sorted(p.name for p in (tmp_path / "elastic").rglob(".metadata"))  # DCP files on disk
    assert len(checkpoints) == (1 if state == "store" else 5)  # store: only the final state, written at the end
    assert any(line.startswith("step 2: tp1 dp2 (W=2) -> tp1 dp1 (W=1)") for line in lines)
    a = static_metrics({"program": str(EXAMPLE), "args": ARGS, "devices": 2, "timeout": 120})  # shared by both states
    b = _metrics(tmp_path / "elastic")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(6))
    assert [r["W"] for r in b] == [2, 2, 1, 1, 2, 2] and [r["tp"] for r in b] == [1, 1, 1, 1, 2, 2]
    assert [r["samples"] for r in a] == [r["samples"] for r in b]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4), (x["step"], x["loss"], y["loss"])
    report = json.loads((tmp_path / "elastic" / "report.json").read_text())
    assert report["generations"] == 3 and len(report["reconfigurations"]) == 2


def test_malformed_scale_request_is_refused_and_the_job_goes_on(tmp_path):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "scale-1.json").write_text('{"devices": 0}')
    (tmp_path / "control" / "scale-2.json").write_text("not json")
    lines: list[str] = []
    controller = Controller(parse_job({"program": "p.py", "devices": 2}), tmp_path, out=lines.append)
    assert controller._poll_request(0, ParallelConfig(1, 2)) is None
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == ["scale-1.rejected", "scale-2.rejected"]
    assert "devices: expected an integer >= 1, got 0" in lines[0] and "not valid JSON" in lines[1]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_pipeline_stages_come_and_go_without_changing_training(tmp_path):
    # pp 2 -> one process -> tp 2 x pp 2: the blocks move between stages, the embeddings to the first
    # and the head to the last; the losses equal a one-process run's
    args = ["--steps", "6", "--samples", "64", "--layers", "2"]
    static = parse_job({"program": str(EXAMPLE), "args": args, "devices": 1, "timeout": 120})
    elastic = parse_job({"program": str(EXAMPLE), "args": args, "devices": 2, "timeout": 120,
                         "parallel": {"2": [1, 2, 1], "4": [2, 2, 1]},
                         "schedule": [{"at_step": 2, "devices": 1}, {"at_step": 4, "devices": 4}]})  # fmt: skip
    Controller(static, tmp_path / "static", out=lambda _: None).run()
    recs = Controller(elastic, tmp_path / "elastic", out=lambda _: None).run()
    assert [(r.src, r.dst) for r in recs] == [(ParallelConfig(1, 1, 2), ParallelConfig(1, 1)),
                                              (ParallelConfig(1, 1), ParallelConfig(2, 1, 2))]  # fmt: skip
    a, b = _metrics(tmp_path / "static"), _metrics(tmp_path / "elastic")
    assert [r["pp"] for r in b] == [2, 2, 1, 1, 2, 2] and [r["W"] for r in b] == [2, 2, 1, 1, 4, 4]
    assert [r["samples"] for r in a] == [r["samples"] for r in b]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5), (x["step"], x["loss"], y["loss"])


def test_step_log_reads_appended_lines_once_and_waits_for_a_partial_line(tmp_path):
    from tenplex.elastic.records import StepLog

    log = StepLog(tmp_path)
    assert log.records(0) == []  # no metrics file yet
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "generation": 0, "time": 1.0}\n{"step": 1, "gener')
    assert log.records(0) == [(0, 1.0)]
    with path.open("a") as f:
        f.write('ation": 0, "time": 2.0}\n{"step": 2, "generation": 1, "time": 3.0}\nnot json\n')
    assert log.records(0) == [(0, 1.0), (1, 2.0)] and log.records(1) == [(2, 3.0)]
    assert log.records(0) == [(0, 1.0), (1, 2.0)]  # nothing new: nothing counted twice
