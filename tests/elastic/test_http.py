"""Scale requests over HTTP (`tenplex.elastic.http`) and on disk (`tenplex.elastic.requests`),
and the `tenplex job scale/status/run --http` commands, against real sockets on 127.0.0.1."""

import json
import re
import socket
import threading
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.cli.job import job
from tenplex.elastic import requests as scale_requests
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.http import serve_in_thread
from tenplex.elastic.requests import read_status, write_scale_request

NAME = re.compile(r"scale-\d+\.json")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _call(url, path, body=None, token=None, raw=None):
    """(status, decoded JSON reply) of GET `path`, or POST `body` (JSON) or `raw` (bytes)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url + path, data=data, headers=headers, method="GET" if data is None else "POST")
    try:
        with _OPENER.open(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _requests_in(job_dir):
    return sorted((job_dir / "control").glob("scale-*.json")) if (job_dir / "control").exists() else []


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_threads():
    return [t for t in threading.enumerate() if t.name.startswith("tenplex-job-http")]


# -- POST /scale -------------------------------------------------------------------------------


def test_post_scale_writes_the_same_request_as_the_cli(tmp_path):
    with serve_in_thread(tmp_path) as url:
        status, reply = _call(url, "/scale", {"devices": 4, "tp": 2})
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    assert status == 202 and NAME.fullmatch(reply["request"])
    via_http = tmp_path / "control" / reply["request"]
    assert json.loads(via_http.read_text()) == {"devices": 4, "tp": 2}
    (tmp_path / "status.json").write_text('{"state": "running"}')  # `job scale --job-dir` needs a job's directory
    result = CliRunner().invoke(job, ["scale", "--job-dir", str(tmp_path), "--devices", "4", "--tp", "2"])
    assert result.exit_code == 0, result.output
    via_cli = [p for p in _requests_in(tmp_path) if p != via_http]
    assert len(via_cli) == 1 and via_cli[0].read_text() == via_http.read_text()


def test_post_scale_without_tp_sends_null(tmp_path):
    with serve_in_thread(tmp_path) as url:
        status, reply = _call(url, "/scale", {"devices": 3})
    assert status == 202 and json.loads((tmp_path / "control" / reply["request"]).read_text()) == {"devices": 3, "tp": None}


BAD_BODIES = {
    "not_json": (b"{devices: 4", "body: not valid JSON"),
    "not_utf8": (b"\xff\xfe", "body: not valid JSON"),
    "not_object": (b"[4]", 'body: expected a JSON object such as {"devices": 4}, got list'),
    "missing_devices": ({"tp": 2}, "devices: required field is missing"),
    "devices_zero": ({"devices": 0}, "devices: expected an integer >= 1, got 0"),
    "devices_string": ({"devices": "4"}, "devices: expected an integer >= 1, got '4'"),
    "devices_bool": ({"devices": True}, "devices: expected an integer >= 1, got True"),
    "tp_float": ({"devices": 4, "tp": 2.0}, "tp: expected an integer >= 1, got 2.0"),
    "unknown_field": ({"devices": 4, "pp": 2}, "pp: unknown field (expected devices, tp)"),
    "tp_not_dividing": ({"devices": 3, "tp": 2}, "tp: 2 does not divide devices 3"),
}


@pytest.mark.parametrize("name", BAD_BODIES)
def test_bad_body_is_400_naming_the_field_and_writes_nothing(tmp_path, name):
    body, message = BAD_BODIES[name]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with serve_in_thread(tmp_path) as url:
        status, reply = _call(url, "/scale", raw=raw)
    assert status == 400 and reply["error"].startswith(message), reply
    assert _requests_in(tmp_path) == []


def test_token_is_required_for_every_endpoint(tmp_path):
    with serve_in_thread(tmp_path, token="s3cret") as url:
        assert _call(url, "/scale", {"devices": 2}) == (401, {"error": "Authorization: missing or wrong bearer token"})
        assert _call(url, "/scale", {"devices": 2}, token="wrong")[0] == 401
        assert _call(url, "/status")[0] == 401
        assert _requests_in(tmp_path) == []
        status, reply = _call(url, "/scale", {"devices": 2}, token="s3cret")
        assert status == 202 and _call(url, "/status", token="s3cret")[1]["pending"] == [reply["request"]]


def test_empty_token_and_open_non_loopback_host_are_refused(tmp_path):
    refused = "host: refusing to serve scale requests on non-loopback '0.0.0.0'"
    with pytest.raises(ElasticError, match=refused), serve_in_thread(tmp_path, host="0.0.0.0"):
        pass
    with pytest.raises(ElasticError, match="token: expected a non-empty string"), serve_in_thread(tmp_path, token=""):
        pass
    assert _server_threads() == []


# -- GET /status -------------------------------------------------------------------------------


def test_status_before_and_after_the_controller_writes_it(tmp_path):
    with serve_in_thread(tmp_path) as url:
        assert _call(url, "/status") == (200, {"state": "starting", "pending": []})
        name = _call(url, "/scale", {"devices": 2})[1]["request"]
        assert _call(url, "/status") == (200, {"state": "starting", "pending": [name]})
        (tmp_path / "control" / name).rename(tmp_path / "control" / name.replace(".json", ".taken"))
        doc = {"generation": 1, "config": {"tp": 1, "dp": 2, "pp": 1}, "state": "running", "extra": [1]}
        (tmp_path / "status.json").write_text(json.dumps(doc))
        assert _call(url, "/status") == (200, {**doc, "pending": []})


def test_malformed_status_is_500_naming_the_file(tmp_path):
    (tmp_path / "status.json").write_text('{"state": "runn')
    with serve_in_thread(tmp_path) as url:
        status, reply = _call(url, "/status")
    assert status == 500 and reply["error"].startswith(f"{tmp_path / 'status.json'}: not valid JSON")


# -- requests.py -------------------------------------------------------------------------------


def test_read_status_rejects_non_objects_and_missing_dirs(tmp_path):
    (tmp_path / "status.json").write_text("[1, 2]")
    with pytest.raises(ElasticError, match=re.escape(f"{tmp_path / 'status.json'}: expected a JSON object, got list")):
        read_status(tmp_path)
    with pytest.raises(ElasticError, match="the job directory does not exist"):
        read_status(tmp_path / "nope")


def test_write_scale_request_checks_before_writing(tmp_path):
    with pytest.raises(ElasticError, match=re.escape("tp: 4 does not divide devices 6")):
        write_scale_request(tmp_path, 6, 4)
    with pytest.raises(ElasticError, match=re.escape("devices: expected an integer >= 1, got -1")):
        write_scale_request(tmp_path, -1)
    with pytest.raises(ElasticError, match=re.escape(f"{tmp_path / 'nope'}: the job directory does not exist")):
        write_scale_request(tmp_path / "nope", 2)
    assert _requests_in(tmp_path) == []


def test_two_requests_in_one_nanosecond_both_survive(tmp_path, monkeypatch):
    monkeypatch.setattr(scale_requests.time, "time_ns", lambda: 1_000)
    first, second = write_scale_request(tmp_path, 2), write_scale_request(tmp_path, 4)
    assert (first.name, second.name) == ("scale-1000.json", "scale-1001.json")
    assert [json.loads(p.read_text())["devices"] for p in _requests_in(tmp_path)] == [2, 4]
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == ["scale-1000.json", "scale-1001.json"]


# -- serve_in_thread ---------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # localhost: resolved on the loop's executor
def test_serve_in_thread_leaves_no_thread_or_socket(tmp_path, host):
    before = set(threading.enumerate())
    with serve_in_thread(tmp_path, host=host) as url:
        assert len(_server_threads()) == 1 and _call(url, "/status")[0] == 200
        port = int(url.rsplit(":", 1)[1])
    assert set(threading.enumerate()) <= before and _server_threads() == []
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_serve_in_thread_cleans_up_when_the_block_raises(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), serve_in_thread(tmp_path):
        raise RuntimeError("boom")
    assert _server_threads() == []


def test_serve_in_thread_on_a_busy_port_raises_and_cleans_up(tmp_path):
    with serve_in_thread(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(OSError), serve_in_thread(tmp_path, port=port):
            pass
        assert len(_server_threads()) == 1
    assert _server_threads() == []


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_scale_url_and_status(tmp_path):
    with serve_in_thread(tmp_path) as url:
        result = CliRunner().invoke(job, ["scale", "--url", url, "--devices", "4", "--tp", "4"])
        assert result.exit_code == 0, result.output
        [path] = _requests_in(tmp_path)
        assert f"requested 4 device(s): {path.name} at {url}" in result.output
        assert json.loads(path.read_text()) == {"devices": 4, "tp": 4}
        over_http = CliRunner().invoke(job, ["status", "--url", url])
    on_disk = CliRunner().invoke(job, ["status", "--job-dir", str(tmp_path)])
    assert over_http.exit_code == on_disk.exit_code == 0, over_http.output + on_disk.output
    assert json.loads(over_http.output) == json.loads(on_disk.output) == {"state": "starting", "pending": [path.name]}


def test_cli_scale_url_token_from_the_environment(tmp_path):
    with serve_in_thread(tmp_path, token="tok") as url:
        denied = CliRunner().invoke(cli, ["job", "scale", "--url", url, "--devices", "2"])
        allowed = CliRunner(env={"TENPLEX_TOKEN": "tok"}).invoke(job, ["scale", "--url", url, "--devices", "2"])
    assert denied.exit_code == 2
    assert f"{url}/scale: HTTP 401: Authorization: missing or wrong bearer token" in denied.output
    assert allowed.exit_code == 0, allowed.output
    assert len(_requests_in(tmp_path)) == 1


def test_cli_scale_url_nothing_listening_exits_2_naming_the_url():
    url = f"http://127.0.0.1:{_free_port()}"
    result = CliRunner().invoke(cli, ["job", "scale", "--url", url, "--devices", "2"])
    assert result.exit_code == 2
    assert f"tenplex: error: {url}/scale: cannot connect" in result.output and "refused" in result.output


def test_cli_scale_job_dir_still_works(tmp_path):
    (tmp_path / "status.json").write_text('{"state": "running"}')  # what `job run` writes first
    result = CliRunner().invoke(job, ["scale", "--job-dir", str(tmp_path), "--devices", "2"])
    assert result.exit_code == 0, result.output
    [path] = _requests_in(tmp_path)
    assert f"requested 2 device(s): {path}" in result.output and json.loads(path.read_text()) == {"devices": 2, "tp": None}


CLI_USAGE = {
    "scale_no_target": (["scale", "--devices", "2"], "give exactly one of --job-dir and --url"),
    "scale_both_targets": (["scale", "--job-dir", ".", "--url", "http://x", "--devices", "2"],
                           "give exactly one of --job-dir and --url"),
    "status_bad_url": (["status", "--url", "localhost:80"], "'localhost:80' is not an http:// or https:// URL"),
    "run_bad_address": (["run", "JOB", "--job-dir", "d", "--http", "localhost"], "'localhost' is not HOST:PORT"),
    "run_token_on_the_command_line": (["run", "JOB", "--job-dir", "d", "--token", "t"],
                                      "--token is no longer accepted: a token on the command line is visible"),
    "run_token_file_without_http": (["run", "JOB", "--job-dir", "d", "--token-file", "JOB"],
                                    "--token-file applies to the HTTP endpoint: give --http HOST:PORT too"),
}  # fmt: skip


@pytest.mark.parametrize("name", CLI_USAGE)
def test_cli_usage_errors(tmp_path, name):
    args, message = CLI_USAGE[name]
    (tmp_path / "job.json").write_text('{"program": "p.py", "devices": 2}')
    args = [str(tmp_path / "job.json") if a == "JOB" else a for a in args]
    result = CliRunner().invoke(cli, ["job", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_cli_run_http_serves_while_the_controller_runs(tmp_path, monkeypatch):
    from tenplex.elastic.controller import Controller

    port, seen = _free_port(), {}

    def fake_run(self):
        seen["reply"] = _call(f"http://127.0.0.1:{port}", "/scale", {"devices": 4})
        return []

    monkeypatch.setattr(Controller, "run", fake_run)
    (tmp_path / "job.json").write_text('{"program": "p.py", "devices": 2}')
    (tmp_path / "p.py").write_text("")
    job_dir = tmp_path / "run"
    args = ["run", str(tmp_path / "job.json"), "--job-dir", str(job_dir), "--http", f"127.0.0.1:{port}"]
    result = CliRunner().invoke(job, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"job directory: {job_dir}\nscale requests: http://127.0.0.1:{port}/scale\n")
    assert seen["reply"][0] == 202 and [p.name for p in _requests_in(job_dir)] == [seen["reply"][1]["request"]]
    assert _server_threads() == []


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_scale_request_over_http_reconfigures_a_running_job(tmp_path, static_run):
    from tenplex.elastic.api import ParallelConfig
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.job import parse_job
    from tests.elastic.helpers import job_doc, metrics, same_training

    job_dir = tmp_path / "run"
    controller = Controller(parse_job(job_doc(steps=12)), job_dir, out=lambda _: None)
    done: list = []
    thread = threading.Thread(target=lambda: done.append(controller.run()), daemon=True)
    thread.start()
    with serve_in_thread(job_dir) as url:
        while not ((job_dir / "metrics.jsonl").exists() and (job_dir / "metrics.jsonl").read_text().strip()):
            assert thread.is_alive(), "the controller stopped before the first step"
            thread.join(0.05)
        assert _call(url, "/status")[1]["state"] == "running"
        status, reply = _call(url, "/scale", {"devices": 1})
        assert status == 202 and NAME.fullmatch(reply["request"])
        thread.join(200)
    assert not thread.is_alive() and done
    [rec] = done[0]
    assert (rec.src, rec.dst) == (ParallelConfig(1, 2), ParallelConfig(1, 1)) and 1 <= rec.step < 12
    run = metrics(job_dir)
    assert [r["step"] for r in run] == list(range(12))
    assert [r["W"] for r in run] == [2] * rec.step + [1] * (12 - rec.step)
    same_training(static_run, run)  # the first steps match a run that never changed
    assert json.loads((job_dir / "status.json").read_text())["state"] == "done"
