"""Job files and the configuration choice: every parser error names the file and the field."""

import json
import re

import pytest

from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.configs import choose_config
from tenplex.elastic.errors import ElasticError, JobFileError
from tenplex.elastic.job import Event, load_job, parse_job

BASE = {"program": "train.py", "devices": 4}


def test_parse_full_job(tmp_path):
    doc = {**BASE, "args": ["--steps", 9], "parallel": {"4": [2, 1, 2]}, "timeout": 30, "gpus_per_host": 4,
           "schedule": [{"at_step": 3, "devices": 2}, {"at_seconds": 1.5, "devices": 4, "tp": 2}, {"at_step": 6, "devices": 1}]}  # fmt: skip
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    (tmp_path / "train.py").write_text("")  # load_job checks the program is a file
    spec = load_job(path)
    assert spec.program == tmp_path / "train.py" and spec.args == ("--steps", "9") and spec.devices == 4
    assert spec.schedule == (Event(2, at_step=3), Event(4, at_seconds=1.5, tp=2), Event(1, at_step=6))
    assert spec.table == {4: (2, 1, 2)} and spec.timeout == 30.0 and spec.gpus_per_host == 4
    assert spec.recovery == "replicas"


def test_parse_failure_events():
    spec = parse_job({**BASE, "recovery": "checkpoint", "schedule": [{"at_step": 2, "fail": [3]}, {"at_step": 4, "fail": [0, 1], "devices": 2}]})
    assert spec.schedule == (Event(None, at_step=2, fail=(3,)), Event(2, at_step=4, fail=(0, 1)))
    assert spec.recovery == "checkpoint"


ERRORS = {
    "missing_program": ({"devices": 2}, "job.program: required field is missing"),
    "unknown_key": ({**BASE, "gpu": 1}, "job.gpu: unknown field"),
    "devices_zero": ({**BASE, "devices": 0}, "job.devices: expected an integer >= 1, got 0"),
    "devices_bool": ({**BASE, "devices": True}, "job.devices: expected an integer >= 1, got True"),
    "args_not_list": ({**BASE, "args": "--steps 3"}, "job.args: expected a list of strings"),
    "schedule_not_list": ({**BASE, "schedule": {"at_step": 1}}, "job.schedule: expected a list of events"),
    "event_no_devices": ({**BASE, "schedule": [{"at_step": 2}]}, "job.schedule[0].devices: required field is missing"),
    "event_both_times": ({**BASE, "schedule": [{"at_step": 2, "at_seconds": 1, "devices": 2}]},
                         "job.schedule[0]: give exactly one of at_step and at_seconds"),
    "event_no_time": ({**BASE, "schedule": [{"devices": 2}]}, "job.schedule[0]: give exactly one of at_step and at_seconds"),
    "event_unknown": ({**BASE, "schedule": [{"at_step": 2, "devices": 2, "dp": 2}]}, "job.schedule[0].dp: unknown field"),
    "pp_not_dividing": ({**BASE, "schedule": [{"at_step": 2, "devices": 4, "tp": 2, "pp": 4}]},
                        "job.schedule[0].pp: tp x pp = 8 does not divide devices=4"),
    "steps_not_increasing": ({**BASE, "schedule": [{"at_step": 5, "devices": 2}, {"at_step": 5, "devices": 4}]},
                             "job.schedule[1].at_step: 5 is not after the previous event's step 5"),
    "seconds_negative": ({**BASE, "schedule": [{"at_seconds": -1, "devices": 2}]},
                         "job.schedule[0].at_seconds: expected a number > 0, got -1"),
    "tp_not_dividing": ({**BASE, "schedule": [{"at_step": 2, "devices": 3, "tp": 2}]},
                        "job.schedule[0].tp: 2 does not divide devices=3"),
    "table_product": ({**BASE, "parallel": {"4": [2, 1, 1]}}, "job.parallel.4: tp x pp x dp = 2 is not 4 devices"),
    "table_key": ({**BASE, "parallel": {"four": [2, 1, 2]}}, "job.parallel.four: the key must be a device count"),
    "table_shape": ({**BASE, "parallel": {"4": [2, 2]}}, "job.parallel.4: expected [tp, pp, dp]"),
    "not_mapping": ([1, 2], "job: expected a mapping, got list"),
    "fail_empty": ({**BASE, "schedule": [{"at_step": 2, "fail": []}]}, "job.schedule[0].fail: expected a non-empty list of ranks"),
    "fail_rank": ({**BASE, "schedule": [{"at_step": 2, "fail": [1, -1]}]}, "job.schedule[0].fail[1]: expected an integer >= 0, got -1"),
    "fail_twice": ({**BASE, "schedule": [{"at_step": 2, "fail": [1, 1]}]}, "job.schedule[0].fail: rank listed twice in [1, 1]"),
    "fail_seconds": ({**BASE, "schedule": [{"at_seconds": 2, "fail": [1]}]}, "job.schedule[0].fail: a failure needs at_step"),
    "fail_tp": ({**BASE, "schedule": [{"at_step": 2, "fail": [1], "tp": 1}]}, "job.schedule[0].tp: a tp hint needs devices"),
    "max_restarts": ({**BASE, "max_restarts": -1}, "job.max_restarts: expected an integer >= 0, got -1"),
    "recovery": ({**BASE, "recovery": "pray"}, "job.recovery: expected one of replicas, checkpoint, got 'pray'"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_parse_errors_name_file_and_field(name):
    doc, message = ERRORS[name]
    with pytest.raises(JobFileError, match=re.escape(f"jobs/{name}.json: {message}")):
        parse_job(doc, f"jobs/{name}.json")


def test_load_job_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"program\": ")
    with pytest.raises(JobFileError, match=re.escape(f"{bad}: not valid JSON (line 1")):
        load_job(bad)
    with pytest.raises(JobFileError, match=re.escape(f"{tmp_path / 'none.json'}: cannot read the job file")):
        load_job(tmp_path / "none.json")


def test_yaml_job_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("program: train.py\ndevices: 2\nschedule:\n  - {at_step: 4, devices: 1}\n")
    (tmp_path / "train.py").write_text("")
    assert load_job(path).schedule == (Event(1, at_step=4),)
    path.write_text("program: train.py\ndevices: [2\n")
    with pytest.raises(JobFileError, match=re.escape(str(path))):
        load_job(path)


def test_choose_config_fallbacks():
    spec = parse_job({**BASE, "parallel": {"4": [2, 1, 2], "8": [2, 2, 2]}})
    assert choose_config(spec, 4) == ParallelConfig(2, 2)  # the table
    assert choose_config(spec, 2) == ParallelConfig(1, 2)  # no entry: data parallelism only
    assert choose_config(spec, 4, tp=4) == ParallelConfig(4, 1)  # the event's hint wins
    assert choose_config(spec, 8) == ParallelConfig(2, 2, 2)  # pipeline stages too
    assert choose_config(spec, 8, pp=2) == ParallelConfig(1, 4, 2) and choose_config(spec, 8, 2, 4) == ParallelConfig(2, 1, 4)


def test_choose_config_takes_the_parallelizers_pipeline_choice():
    # GPT 6.7B on 12 GPUs: the cost model picks 3 pipeline stages, and the controller keeps them
    from tenplex.frontends.presets import PRESETS

    spec = parse_job({**BASE, "model": dict(PRESETS["gpt-6.7b"])})
    assert choose_config(spec, 12) == ParallelConfig(1, 4, 3)
    assert choose_config(spec, 16) == ParallelConfig(2, 8, 1)


def test_parallel_config_checks_degrees():
    with pytest.raises(ElasticError, match="dp: expected an integer >= 1, got 0"):
        ParallelConfig(1, 0)
    assert ParallelConfig(2, 3).world == 6
