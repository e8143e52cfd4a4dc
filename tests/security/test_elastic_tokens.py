"""The job endpoint's token never on the command line (issue 13, item 16): `tenplex job` takes it
from `--token-file` or `$TENPLEX_JOB_TOKEN` (then the older `$TENPLEX_TOKEN`), and refuses
`--token T`, whose value `ps` would show to every user for the job's lifetime."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tenplex.cli.app import cli
from tenplex.elastic.controller import Controller
from tenplex.elastic.http import serve_in_thread
from tests.elastic.test_http import _call, _free_port, _requests_in

CLEAN = {"TENPLEX_JOB_TOKEN": None, "TENPLEX_TOKEN": None}


def _tenplex(*args: str, **env: str | None) -> tuple[int, str, str]:
    r = CliRunner(env={**CLEAN, **env}).invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _token_file(tmp_path, text: str = "s3cret\n"):
    path = tmp_path / "token"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("command", [["run", "JOB", "--http", "127.0.0.1:0"], ["scale", "--url", "http://127.0.0.1:1", "--devices", "2"],
                                     ["status", "--url", "http://127.0.0.1:1"]], ids=["run", "scale", "status"])  # fmt: skip
def test_a_token_on_the_command_line_is_refused_naming_the_ways_to_give_it(tmp_path, command):
    (tmp_path / "job.json").write_text('{"program": "job.json", "devices": 1}')
    args = [str(tmp_path / "job.json") if a == "JOB" else a for a in command]
    code, out, err = _tenplex("job", *args, "--token", "s3cret")
    assert code == 2 and out == ""
    assert err.startswith("tenplex: error: --token is no longer accepted: a token on the command line is visible to every "
                          "user (ps); put it in a file and pass --token-file FILE, or set $TENPLEX_JOB_TOKEN")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]


SOURCES = {
    "file": ({}, True, 202),
    "job_variable": ({"TENPLEX_JOB_TOKEN": "s3cret"}, False, 202),
    "older_variable": ({"TENPLEX_TOKEN": "s3cret"}, False, 202),
    "job_variable_first": ({"TENPLEX_JOB_TOKEN": "s3cret", "TENPLEX_TOKEN": "wrong"}, False, 202),
    "file_first": ({"TENPLEX_JOB_TOKEN": "wrong"}, True, 202),
    "none": ({}, False, 401),
}  # fmt: skip


@pytest.mark.parametrize("name", SOURCES)
def test_scale_and_status_read_the_token_from_a_file_or_the_environment(tmp_path, name):
    env, from_file, status = SOURCES[name]
    file_args = ["--token-file", _token_file(tmp_path)] if from_file else []
    with serve_in_thread(tmp_path, token="s3cret") as url:
        scale = _tenplex("job", "scale", "--url", url, "--devices", "2", *file_args, **env)
        status_reply = _tenplex("job", "status", "--url", url, *file_args, **env)
    if status == 202:
        assert scale[0] == status_reply[0] == 0, scale + status_reply
        assert len(_requests_in(tmp_path)) == 1
    else:
        assert scale[0] == status_reply[0] == 2 and "HTTP 401" in scale[2] and "HTTP 401" in status_reply[2]


@pytest.mark.parametrize("text, message", [("", "must hold one non-empty line"), ("a\nb\n", "must hold one non-empty line")],
                         ids=["empty", "two_lines"])  # fmt: skip
def test_a_bad_token_file_is_one_line_naming_it(tmp_path, text, message):
    path = _token_file(tmp_path, text)
    code, _, err = _tenplex("job", "status", "--url", "http://127.0.0.1:1", "--token-file", path)
    assert code == 2 and err.count("\n") == 1 and f"{path}: the job token file {message}" in err


def test_job_run_serves_with_the_token_from_the_file(tmp_path, monkeypatch):
    port, seen = _free_port(), {}

    def fake_run(self):
        url = f"http://127.0.0.1:{port}"
        seen["without"], seen["with"] = _call(url, "/status")[0], _call(url, "/status", token="s3cret")[0]
        return []

    monkeypatch.setattr(Controller, "run", fake_run)
    (tmp_path / "job.json").write_text('{"program": "job.json", "devices": 1}')
    code, out, err = _tenplex("job", "run", str(tmp_path / "job.json"), "--job-dir", str(tmp_path / "run"),
                              "--http", f"127.0.0.1:{port}", "--token-file", _token_file(tmp_path))  # fmt: skip
    assert code == 0, err
    assert seen == {"without": 401, "with": 200}
    assert "s3cret" not in out + err


def test_job_run_on_an_open_host_accepts_the_token_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(Controller, "run", lambda self: [])
    (tmp_path / "job.json").write_text('{"program": "job.json", "devices": 1}')
    args = ["job", "run", str(tmp_path / "job.json"), "--job-dir", str(tmp_path / "run"), "--http", f"0.0.0.0:{_free_port()}"]
    assert _tenplex(*args)[0] == 2  # no token: refused (tests/security/test_elastic_control.py)
    code, out, err = _tenplex(*args, TENPLEX_JOB_TOKEN="s3cret")
    assert code == 0, err
