"""The elastic controller's control surface under hostile input (issue 12, items 6 and 13):
device counts beyond the job's bound (job file, scale request files, HTTP, CLI), a status that
is not strict JSON (`NaN`), `job run --http` refused after creating its directory, and `job
scale --job-dir` writing into a directory that is no job's."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading

import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.elastic.api import ParallelConfig
from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.http import serve_in_thread
from tenplex.elastic.job import MAX_DEVICES_CEILING, parse_job
from tenplex.elastic.records import StepLog
from tenplex.elastic.requests import read_status
from tests.elastic.test_http import _call, _requests_in


def _tenplex(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _job_dir(tmp_path, **status):
    """A job directory as a running controller leaves it (status.json)."""
    job_dir = tmp_path / "run"
    controller = Controller(parse_job({"program": "p.py", "devices": 2, "max_devices": 8}), job_dir)
    (job_dir / "control").mkdir(parents=True)
    controller._status("running", 0, ParallelConfig(1, 2), **status)
    return job_dir, controller


# ---- max_devices ------------------------------------------------------------------------------
def test_status_records_the_jobs_device_bound(tmp_path):
    job_dir, _ = _job_dir(tmp_path)
    assert read_status(job_dir)["max_devices"] == 8


def test_a_scale_request_file_beyond_the_bound_is_refused(tmp_path):
    job_dir, controller = _job_dir(tmp_path)
    lines: list[str] = []
    controller.out = lines.append
    (job_dir / "control" / "scale-1.json").write_text('{"devices": 1000000}')
    assert controller._poll_request(0, ParallelConfig(1, 2)) is None
    assert [p.name for p in (job_dir / "control").iterdir()] == ["scale-1.rejected"]
    assert lines == [f"{job_dir / 'control' / 'scale-1.json'}: scale request refused: "
                     "devices: 1000000 is more than the job's max_devices 8"]  # fmt: skip


def test_http_scale_beyond_the_bound_is_400_naming_field_and_limit(tmp_path):
    with serve_in_thread(tmp_path, max_devices=8) as url:
        status, reply = _call(url, "/scale", {"devices": 1_000_000})
        assert (status, reply) == (400, {"error": "devices: 1000000 is more than the job's max_devices 8"})
        assert _call(url, "/scale", {"devices": 8})[0] == 202
    with serve_in_thread(tmp_path) as url:  # no job bound given: the ceiling
        status, reply = _call(url, "/scale", {"devices": MAX_DEVICES_CEILING + 1})
    assert status == 400 and reply["error"].endswith(f"is more than the job's max_devices {MAX_DEVICES_CEILING}")
    assert len(_requests_in(tmp_path)) == 1


def test_cli_scale_beyond_the_bound_is_refused(tmp_path):
    job_dir, _ = _job_dir(tmp_path)
    code, _, err = _tenplex("job", "scale", "--job-dir", str(job_dir), "--devices", "9")
    assert code == 2 and err == "tenplex: error: devices: 9 is more than the job's max_devices 8\n"
    code, _, err = _tenplex("job", "scale", "--url", "http://127.0.0.1:1", "--devices", str(10**6))
    assert code == 2 and f"'--devices': 1000000 is not in the range 1<=x<={MAX_DEVICES_CEILING}" in err
    assert _requests_in(job_dir) == []


# ---- job scale --job-dir: only a job's directory ----------------------------------------------------
@pytest.mark.parametrize("make", ["empty", "status_not_object", "status_dir"])
def test_scale_refuses_a_directory_that_is_no_job(tmp_path, make):
    target = tmp_path / "not-a-job"
    target.mkdir()
    if make == "status_not_object":
        (target / "status.json").write_text("[]")
    elif make == "status_dir":
        (target / "status.json").mkdir()
    code, _, err = _tenplex("job", "scale", "--job-dir", str(target), "--devices", "2")
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"tenplex: error: {target}")
    assert "not a tenplex job directory" in err or "status.json" in err
    assert sorted(p.name for p in target.iterdir()) == sorted({"empty": [], "status_not_object": ["status.json"],
                                                               "status_dir": ["status.json"]}[make])  # fmt: skip


# ---- job run --http: every argument checked before anything is created ---------------------------
def test_run_refused_for_an_open_host_without_token_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TENPLEX_TOKEN", raising=False)
    (tmp_path / "job.json").write_text('{"program": "p.py", "devices": 2}')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = _tenplex("job", "run", str(tmp_path / "job.json"), "--job-dir", str(tmp_path / "run"),
                            "--http", f"0.0.0.0:{port}")  # fmt: skip
    assert code == 2 and "refusing to serve scale requests on non-loopback '0.0.0.0' without a token" in err
    assert not (tmp_path / "run").exists()


def test_run_with_a_bad_job_file_creates_nothing(tmp_path):
    (tmp_path / "job.json").write_text('{"program": "p.py", "devices": 100000}')
    code, _, err = _tenplex("job", "run", str(tmp_path / "job.json"), "--job-dir", str(tmp_path / "run"))
    assert code == 2 and "job.devices: 100000 is more than max_devices" in err
    assert not (tmp_path / "run").exists()


# ---- strict JSON: never NaN -----------------------------------------------------------------------------
def test_status_is_written_as_strict_json(tmp_path):
    job_dir, _ = _job_dir(tmp_path, error=float("nan"), extra={"t": float("inf")})
    text = (job_dir / "status.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["error"] is None and json.loads(text)["extra"] == {"t": None}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_status_with_nan_is_an_error_never_printed(tmp_path, constant):
    job_dir, _ = _job_dir(tmp_path)
    (job_dir / "status.json").write_text(f'{{"state": "running", "time": {constant}}}')
    with pytest.raises(ElasticError, match=re.escape(f"{job_dir / 'status.json'}: not valid JSON")):
        read_status(job_dir)
    code, out, err = _tenplex("job", "status", "--job-dir", str(job_dir))
    assert code == 2 and constant not in out and err.count("\n") == 1


def test_a_status_reply_with_nan_over_http_is_an_error():
    class NaNReply(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"state": "running", "time": NaN}')

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NaNReply) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            code, out, err = _tenplex("job", "status", "--url", url)
        finally:
            server.shutdown()
    assert code == 2 and "NaN" not in out and err.startswith(f"tenplex: error: {url}/status: the reply is not")


def test_status_and_non_utf8_or_special_status_files_are_one_line(tmp_path):
    job_dir, _ = _job_dir(tmp_path)
    (job_dir / "status.json").write_bytes(b'{"state": "\xff"}')
    with pytest.raises(ElasticError, match=re.escape(f"{job_dir / 'status.json'}: the status file is not UTF-8")):
        read_status(job_dir)
    (job_dir / "status.json").unlink()
    (job_dir / "status.json").symlink_to("/dev/zero")
    with pytest.raises(ElasticError, match="not a regular file"):
        read_status(job_dir)


def test_step_log_ignores_records_with_odd_steps_or_times(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "generation": 0, "time": NaN}\n{"step": "x", "generation": 0, "time": 1.0}\n'
        '{"step": 1e999, "generation": 0, "time": 1.0}\n{"step": 1, "generation": [0], "time": 1.0}\n'
        '{"step": 2, "generation": 0, "time": 2.5}\n\xff\n'
    )
    assert StepLog(tmp_path).records(0) == [(2, 2.5)]


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"devices": NaN}'], ids=["deep", "nan"])
def test_a_hostile_scale_body_is_400(tmp_path, raw):
    with serve_in_thread(tmp_path) as url:
        status, reply = _call(url, "/scale", raw=raw)
    assert status == 400 and reply["error"].startswith(("body: not valid JSON", "devices: expected")), reply
    assert _requests_in(tmp_path) == []
