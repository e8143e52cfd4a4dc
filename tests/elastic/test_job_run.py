"""`tenplex job run` as a newcomer meets it (issue 13, items 6 and 15): the program is checked
when the job file is loaded, relative to the job file; the job directory has a default; a failed
generation's one-line error carries the failing rank's exception; progress goes to the logger
`tenplex.elastic`."""

from __future__ import annotations

import json
import logging
import re

import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.cli.job import default_job_dir
from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError, JobFileError
from tenplex.elastic.job import load_job, parse_job
from tenplex.elastic.launch import failure_cause


# ---- the program: relative to the job file, checked at load ---------------------------------------
def test_a_relative_program_resolves_against_the_job_files_directory(tmp_path, monkeypatch):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    (tmp_path / "jobs" / "job.yaml").write_text("program: train.py\ndevices: 1\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_job("../jobs/job.yaml").program == tmp_path / "elsewhere" / ".." / "jobs" / "train.py"
    assert load_job("../jobs/job.yaml").program.is_absolute()


PROGRAM_ERRORS = {
    "missing": ("examples/elastic_gpt.py", "does not exist"),
    "directory": (".", "is not a regular file"),
    "name_too_long": ("x" * 300 + ".py", "cannot be looked up (File name too long)"),
}  # fmt: skip


@pytest.mark.parametrize("name", PROGRAM_ERRORS)
def test_the_program_is_checked_when_the_job_file_is_loaded(tmp_path, name):
    program, what = PROGRAM_ERRORS[name]
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"program": program, "devices": 1}))
    with pytest.raises(JobFileError) as e:
        load_job(path)
    assert str(e.value) == (f"{path}: job.program: {tmp_path / program} {what} "
                            "(a relative program is resolved against the job file's directory)")  # fmt: skip


def test_job_run_with_a_missing_program_fails_before_creating_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("program: examples/elastic_gpt.py\ndevices: 2\n")
    result = CliRunner().invoke(cli, ["job", "run", "job.yaml"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"tenplex: error: job.yaml: job.program: {tmp_path / 'examples/elastic_gpt.py'} does not exist "
                             "(a relative program is resolved against the job file's directory)\n")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_the_controller_checks_the_program_before_it_starts_anything(tmp_path):
    with pytest.raises(JobFileError, match=re.escape("<job>: job.program: missing.py does not exist")):
        Controller(parse_job({"program": "missing.py", "devices": 1}), tmp_path / "run").run()
    assert not (tmp_path / "run").exists()


# ---- the job directory's default ---------------------------------------------------------------
def test_the_default_job_dir_is_fresh_and_named_after_the_job_file(tmp_path):
    assert default_job_dir("examples/elastic_gpt.yaml", tmp_path) == tmp_path / "elastic_gpt.job"
    assert default_job_dir("elastic_gpt.json", tmp_path) == tmp_path / "elastic_gpt.job-2"
    (tmp_path / "elastic_gpt.job-3").write_text("")  # a file takes the name too
    assert default_job_dir("elastic_gpt.yaml", tmp_path) == tmp_path / "elastic_gpt.job-4"
    assert all(p.is_dir() for p in tmp_path.iterdir() if p.name != "elastic_gpt.job-3")


def test_job_run_without_job_dir_uses_and_prints_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Controller, "run", lambda self: [])
    (tmp_path / "job.yaml").write_text("program: p.py\ndevices: 2\n")
    (tmp_path / "p.py").write_text("")
    result = CliRunner().invoke(cli, ["job", "run", "job.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "job directory: job.job\ndone: 0 reconfiguration(s); report in job.job/report.json\n"
    assert (tmp_path / "job.job").is_dir()


# ---- a failed generation: one line, with the cause ------------------------------------------------
TORCHRUN_REPORT = """Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {exitcode}
  error_file: <N/A>
============================================================
"""
GLOG = "W1125 06:29:19.888000 7573 torch/distributed/run.py:874] Setting OMP_NUM_THREADS ...\n"
TRACEBACK = """[rank{rank}]: Traceback (most recent call last):
[rank{rank}]:   File "train.py", line 3, in <module>
[rank{rank}]:     open(path)
[rank{rank}]: {error}
"""
CAUSES = {
    "root_cause_rank_traceback": (GLOG + TRACEBACK.format(rank=0, error="RuntimeError: Connection closed by peer")
                                  + TRACEBACK.format(rank=1, error="FileNotFoundError: [Errno 2] 'm.jsonl'")
                                  + TORCHRUN_REPORT.format(rank=1, exitcode="1 (pid: 7)"),
                                  "rank 1: FileNotFoundError: [Errno 2] 'm.jsonl'"),
    "program_error_line": (GLOG + "train.py: error: TENPLEX_TP: expected an integer, got 'x'\n"
                           + TORCHRUN_REPORT.format(rank=0, exitcode="2 (pid: 7)"),
                           "train.py: error: TENPLEX_TP: expected an integer, got 'x'"),
    "plain_traceback": ("Traceback (most recent call last):\n  File \"t.py\", line 1\n    f()\nValueError: boom\n"
                        + TORCHRUN_REPORT.format(rank=0, exitcode="1 (pid: 7)"), "ValueError: boom"),
    "chained": ("Traceback (most recent call last):\n  f()\nKeyError: 'a'\n\nDuring handling of the above exception, "
                "another exception occurred:\n\nTraceback (most recent call last):\n  g()\nValueError: b\n"
                + TORCHRUN_REPORT.format(rank=0, exitcode="1 (pid: 7)"), "ValueError: b"),
    "killed": (GLOG + TORCHRUN_REPORT.format(rank=0, exitcode="-9 (pid: 7)  (SIGKILL)"), "rank 0: killed by SIGKILL"),
    "system_exit_message": ("step 3: loss nan is not finite\n" + TORCHRUN_REPORT.format(rank=0, exitcode="1 (pid: 7)"),
                            "step 3: loss nan is not finite"),
    "not_under_torchrun": ("some output\nlast words\n", "last words"),
    "empty": ("", ""),
}  # fmt: skip


@pytest.mark.parametrize("name", CAUSES)
def test_failure_cause_finds_the_line_that_says_why(name):
    log, cause = CAUSES[name]
    assert failure_cause(log) == cause


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_failed_generation_is_one_line_with_the_exception(tmp_path):
    program = tmp_path / "fail.py"
    program.write_text("raise ValueError('the data set is missing')\n")
    spec = parse_job({"program": str(program), "devices": 1, "timeout": 60})
    with pytest.raises(ElasticError) as e:
        Controller(spec, tmp_path / "run", out=lambda _: None).run()
    log = tmp_path / "run" / "logs" / "gen-0.log"
    assert str(e.value) == f"generation 0: the program exited with code 1: ValueError: the data set is missing; log {log}"


# ---- progress: the logger tenplex.elastic ----------------------------------------------------------
def test_the_controller_prints_nothing_by_default(tmp_path, capsys):
    # issue 13, item 9: `make demo` showed two controllers' lines, unlabelled, before its header
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "scale-1.json").write_text('{"devices": 4}')
    Controller(parse_job({"program": "p.py", "devices": 2}), tmp_path)._poll_request(0, ParallelConfig(1, 2))
    assert capsys.readouterr() == ("", "")


def test_the_controllers_lines_go_to_the_tenplex_elastic_logger(tmp_path, caplog):
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "scale-1.json").write_text('{"devices": 4}')
    controller = Controller(parse_job({"program": "p.py", "devices": 2}), tmp_path)
    with caplog.at_level(logging.INFO, logger="tenplex.elastic"):
        controller._poll_request(0, ParallelConfig(1, 2))
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("tenplex.elastic", logging.INFO, "generation 0: stopping at its next step for 4 device(s)")]  # fmt: skip
