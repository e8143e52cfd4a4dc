"""`tenplex job`: run an elastic job, ask a running one to change its devices, read its status.

    tenplex job run JOB_FILE --job-dir DIR [--http HOST:PORT] [--token T]
                                                 run the job (JSON/YAML job file; see job.py),
                                                 with --http also serving its scale endpoint
    tenplex job scale (--job-dir DIR | --url URL) --devices N [--tp T] [--token T]
                                                 ask the job's controller for N processes
    tenplex job status (--job-dir DIR | --url URL) [--token T]
                                                 print the job's status JSON

With --url the request goes to the job's HTTP endpoint (`tenplex.elastic.http`, started by
`job run --http`); the token defaults to $TENPLEX_TOKEN. Without it, the request is a file in
DIR/control (`tenplex.elastic.requests`).

`job run` checks the job file and every option before it creates anything; SIGTERM, SIGINT or
SIGHUP end the running generation (torchrun and its workers) and exit 128 + the signal with one
line. `job scale --job-dir DIR` writes only into a job's directory (DIR/status.json, written by
`job run`). --devices is at most the job's `max_devices` (checked by the controller's side: the
status file, the HTTP endpoint) and never above MAX_DEVICES_CEILING.

Registered in `tenplex.cli.app`. Errors (TenplexError) print one line
and exit with code 2, as every tenplex command does; an HTTP error or an unreachable URL is an
ElasticError naming the URL, with the server's message. Output is strict JSON: never NaN.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import MAX_DEVICES_CEILING
from tenplex.elastic.requests import check_job_dir, read_status, write_scale_request
from tenplex.ir.files import loads

TOKEN_ENV = "TENPLEX_TOKEN"
TIMEOUT = 10.0


class _Address(click.ParamType):
    """HOST:PORT (HOST defaults to 127.0.0.1, an IPv6 HOST may be bracketed, PORT 0 picks one)."""

    name = "host:port"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isdecimal() or int(port) > 65535:
            self.fail(f"{value!r} is not HOST:PORT with a port in 0..65535 (e.g. 127.0.0.1:8080)", param, ctx)
        return host.strip("[]") or "127.0.0.1", int(port)


def _one_target(job_dir: str | None, url: str | None) -> None:
    if (job_dir is None) == (url is None):
        raise click.UsageError("give exactly one of --job-dir and --url")
    if url is not None and not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r} is not an http:// or https:// URL", param_hint="--url")


def _request(url: str, path: str, token: str | None, body: dict | None = None) -> dict:
    """GET (no body) or POST `body` as JSON to `url` + `path`; the reply's JSON object.

    Raises ElasticError naming the URL: with the status and the server's message on an HTTP
    error, or the reason when nothing answers.
    """
    import urllib.error
    import urllib.request

    target = url.rstrip("/") + path
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(target, data=data, headers=headers, method="GET" if body is None else "POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the job, never a proxy
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            text = response.read()
    except urllib.error.HTTPError as e:
        raise ElasticError(f"{target}: HTTP {e.code}: {_server_message(e.read())}") from None
    except urllib.error.URLError as e:
        raise ElasticError(f"{target}: cannot connect ({e.reason})") from None
    except OSError as e:  # a timeout or reset after connecting
        raise ElasticError(f"{target}: no reply ({e})") from None
    try:
        reply = loads(text)  # strict: NaN or Infinity is no answer
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict):
        raise ElasticError(f"{target}: the reply is not a JSON object: {text[:200]!r}")
    return reply


def _server_message(body: bytes) -> str:
    """The `error` of a JSON error body, else the body's text (a proxy's or aiohttp's own page)."""
    text = body.decode(errors="replace").strip()
    try:
        return str(json.loads(text)["error"])
    except (ValueError, TypeError, KeyError):
        return text or "(no message)"


@click.group("job")
def job() -> None:
    """Elastic training jobs: run one, rescale a running one, or read its status."""


@job.command("run")
@click.argument("job_file", type=click.Path(dir_okay=False, exists=True))
@click.option("--job-dir", required=True, type=click.Path(file_okay=False), help="Fresh directory for state, logs and the report.")
@click.option("--http", "address", type=_Address(), help="Serve scale requests on HOST:PORT (port 0: any free port).")
@click.option("--token", envvar=TOKEN_ENV, help=f"Bearer token the HTTP endpoint requires (default ${TOKEN_ENV}).")
@click.pass_context
def run_cmd(ctx: click.Context, job_file: str, job_dir: str, address: tuple[str, int] | None, token: str | None) -> None:
    """Run JOB_FILE's program elastically, reconfiguring at each schedule event or scale request."""
    if address is None and ctx.get_parameter_source("token") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--token applies to the HTTP endpoint: give --http HOST:PORT too")
    from tenplex.cli.common import fail
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.http import check_address, serve_in_thread
    from tenplex.elastic.job import load_job
    from tenplex.elastic.signals import JobInterrupted

    spec = load_job(job_file)
    if address is not None:
        check_address(address[0], token)
    controller = Controller(spec, job_dir, out=click.echo)  # nothing created yet: the checks come first
    try:
        if address is None:
            reconfigurations = controller.run()
        else:
            with serve_in_thread(job_dir, *address, token=token, max_devices=spec.max_devices) as url:
                (Path(job_dir) / "control").mkdir(parents=True, exist_ok=True)  # requests may come before generation 0
                click.echo(f"scale requests: {url}/scale")
                reconfigurations = controller.run()
    except JobInterrupted as e:
        fail(str(e), 128 + e.signum)
    click.echo(f"done: {len(reconfigurations)} reconfiguration(s); report in {Path(job_dir) / 'report.json'}")


@job.command("scale")
@click.option("--job-dir", type=click.Path(file_okay=False, exists=True), help="The running job's directory.")
@click.option("--url", help="The running job's HTTP endpoint (job run --http), e.g. http://127.0.0.1:8080.")
@click.option("--devices", required=True, type=click.IntRange(1, MAX_DEVICES_CEILING),
              help="Processes the job should run on (at most the job file's max_devices).")  # fmt: skip
@click.option("--tp", type=click.IntRange(min=1), help="Force this tensor-parallel degree.")
@click.option("--token", envvar=TOKEN_ENV, help=f"Bearer token for --url (default ${TOKEN_ENV}).")
def scale_cmd(job_dir: str | None, url: str | None, devices: int, tp: int | None, token: str | None) -> None:
    """Ask the controller running in JOB_DIR (or serving URL) to move the job to DEVICES processes."""
    _one_target(job_dir, url)
    if tp is not None and devices % tp:
        raise ElasticError(f"--tp: {tp} does not divide --devices {devices}")
    if url is not None:
        reply = _request(url, "/scale", token, {"devices": devices, "tp": tp})
        click.echo(f"requested {devices} device(s): {reply.get('request')} at {url}")
        return
    path = write_scale_request(job_dir, devices, tp, check_job_dir(job_dir))
    click.echo(f"requested {devices} device(s): {path}")


@job.command("status")
@click.option("--job-dir", type=click.Path(file_okay=False, exists=True), help="The job's directory.")
@click.option("--url", help="The running job's HTTP endpoint (job run --http).")
@click.option("--token", envvar=TOKEN_ENV, help=f"Bearer token for --url (default ${TOKEN_ENV}).")
def status_cmd(job_dir: str | None, url: str | None, token: str | None) -> None:
    """Print the job's status (status.json and the pending scale requests) as JSON."""
    _one_target(job_dir, url)
    status = _request(url, "/status", token) if url is not None else read_status(job_dir)
    click.echo(json.dumps(status, indent=1, sort_keys=True, allow_nan=False))

