"""`tenplex job`: run an elastic job, ask a running one to change its devices, read its status.

    tenplex job run JOB_FILE [--job-dir DIR] [--http HOST:PORT [--token-file F]]
                                                 run the job (JSON/YAML job file; see job.py),
                                                 with --http also serving its scale endpoint
    tenplex job scale (--job-dir DIR | --url URL) --devices N [--tp T] [--token-file F]
                                                 ask the job's controller for N processes
    tenplex job status (--job-dir DIR | --url URL) [--token-file F]
                                                 print the job's status JSON

`job run` without --job-dir makes a fresh directory in the current directory named after the job
file: `elastic_gpt.job` for `examples/elastic_gpt.yaml`, else `elastic_gpt.job-2`, `-3`, ...
(the first that does not exist yet); it prints the directory first, on stdout. Its progress
(one line per phase: a generation starting, a stop, a reshard, a reconfiguration's phases) goes
to the logger `tenplex.elastic` at INFO, which the `tenplex` group shows on stderr on a terminal
(`common.configure_logging`; -q hides it, -v shows it everywhere).

Tokens (the job endpoint's bearer token) come from a file or the environment, never from the
command line, where `ps` shows them: `--token-file F` (one line), else `$TENPLEX_JOB_TOKEN`, else
`$TENPLEX_TOKEN` (the older name, still read). `--token` is refused with a message saying so.
With --url the request goes to the job's HTTP endpoint (`tenplex.elastic.http`, started by
`job run --http`). Without it, the request is a file in DIR/control (`tenplex.elastic.requests`).

`job run` checks the job file (its program too) and every option before it creates anything;
SIGTERM, SIGINT or SIGHUP end the running generation (torchrun and its workers) and exit 128 +
the signal with one line. `job scale --job-dir DIR` writes only into a job's directory
(DIR/status.json, written by `job run`). --devices is at most the job's `max_devices` (checked by
the controller's side: the status file, the HTTP endpoint) and never above MAX_DEVICES_CEILING.

Registered in `tenplex.cli.app`. Errors (TenplexError) print one line
and exit with code 2, as every tenplex command does; an HTTP error or an unreachable URL is an
ElasticError naming the URL, with the server's message. Output is strict JSON: never NaN.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import click

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import MAX_DEVICES_CEILING
from tenplex.elastic.requests import check_job_dir, read_status, write_scale_request
from tenplex.ir.files import loads

TOKEN_ENV = "TENPLEX_JOB_TOKEN"
LEGACY_TOKEN_ENV = "TENPLEX_TOKEN"  # the job endpoint's older variable, read when TOKEN_ENV is not set
TIMEOUT = 10.0
_TOKEN_HELP = f"File holding the job endpoint's bearer token (default ${TOKEN_ENV}, then ${LEGACY_TOKEN_ENV})."


def _token(path: str | None) -> str | None:
    """The job endpoint's token: the file `path`, else $TENPLEX_JOB_TOKEN, else $TENPLEX_TOKEN."""
    from tenplex.cli.agent import read_token

    token = read_token(path, TOKEN_ENV, "job token")
    return token if token is not None or path is not None else os.environ.get(LEGACY_TOKEN_ENV) or None


def _refuse_token(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--token T` put the secret in argv (shown by `ps` to every user for the job's lifetime):
    refused with the way to give it instead, so a script written for it fails with that line."""
    if value is not None:
        raise click.UsageError(f"--token is no longer accepted: a token on the command line is visible to every user "
                               f"(ps); put it in a file and pass --token-file FILE, or set ${TOKEN_ENV}", ctx)  # fmt: skip


def _token_options(f: Any) -> Any:
    f = click.option("--token", hidden=True, expose_value=False, callback=_refuse_token)(f)
    return click.option("--token-file", type=click.Path(dir_okay=False, exists=True), help=_TOKEN_HELP)(f)


def default_job_dir(job_file: str | os.PathLike, cwd: str | os.PathLike = ".") -> Path:
    """A fresh job directory in `cwd` named after the job file, created here (claimed: two runs
    never get the same one): `<stem>.job`, else `<stem>.job-2`, `-3`, ..., the first free."""
    stem = Path(job_file).stem
    for n in range(1, 10_000):
        path = Path(cwd) / (f"{stem}.job" if n == 1 else f"{stem}.job-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ElasticError(f"{Path(cwd).absolute()}: {stem}.job-2 .. -9999 all exist; give --job-dir")


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
@click.option("--job-dir", type=click.Path(file_okay=False),
              help="Fresh directory for state, logs and the report (default: JOB_FILE's name with .job, "
                   "in the current directory; .job-2, -3, ... when taken).")  # fmt: skip
@click.option("--http", "address", type=_Address(), help="Serve scale requests on HOST:PORT (port 0: any free port).")
@click.option("--emulated-hosts", type=click.IntRange(2, 16), help="Run across N emulated hosts (network namespaces "
              "with shaped links, gpus_per_host processes each; needs root and iproute2).")  # fmt: skip
@click.option("--link-rate", default="1gbit", show_default=True, help="Each emulated host's link rate (tc tbf).")
@_token_options
@click.pass_context
def run_cmd(ctx: click.Context, job_file: str, job_dir: str | None, address: tuple[str, int] | None,
            emulated_hosts: int | None, link_rate: str, token_file: str | None) -> None:  # fmt: skip
    """Run JOB_FILE's program elastically, reconfiguring at each schedule event or scale request.

    A relative `program` in JOB_FILE is resolved against JOB_FILE's directory. Prints the job
    directory first; progress goes to stderr. Tokens: --token-file, else $TENPLEX_JOB_TOKEN."""
    if address is None and token_file is not None:
        raise click.UsageError("--token-file applies to the HTTP endpoint: give --http HOST:PORT too")
    from tenplex.elastic.controller import Controller
    from tenplex.elastic.http import check_address
    from tenplex.elastic.job import load_job

    token = _token(token_file) if address is not None else None
    if address is not None:
        check_address(address[0], token)
    spec = load_job(job_file)  # the program too: a wrong path fails here, before anything starts
    run_dir = Path(job_dir) if job_dir is not None else default_job_dir(job_file)  # the checks came first
    try:
        controller = Controller(spec, run_dir)
    except BaseException:
        if job_dir is None:
            run_dir.rmdir()  # the fresh directory claimed above: empty still
        raise
    click.echo(f"job directory: {run_dir}")
    with contextlib.ExitStack() as stack:
        if emulated_hosts is not None:
            from tenplex.elastic.cluster import Cluster
            from tenplex.runtime.netns import EmulatedHosts

            hosts = stack.enter_context(EmulatedHosts(emulated_hosts, rate=link_rate))
            controller.cluster = Cluster.emulated(hosts, controller.job_dir, per_node=spec.gpus_per_host)
        reconfigurations = _run(controller, run_dir, address, token, spec.max_devices)
    click.echo(f"done: {len(reconfigurations)} reconfiguration(s); report in {run_dir / 'report.json'}")


def _run(controller: Any, run_dir: Path, address: tuple[str, int] | None, token: str | None, max_devices: int) -> list:
    from tenplex.cli.common import fail
    from tenplex.elastic.http import serve_in_thread
    from tenplex.elastic.signals import JobInterrupted

    try:
        if address is None:
            reconfigurations = controller.run()
        else:
            with serve_in_thread(run_dir, *address, token=token, max_devices=max_devices) as url:
                (run_dir / "control").mkdir(parents=True, exist_ok=True)  # requests may come before generation 0
                click.echo(f"scale requests: {url}/scale")
                reconfigurations = controller.run()
    except JobInterrupted as e:
        fail(str(e), 128 + e.signum)
    return reconfigurations


@job.command("scale")
@click.option("--job-dir", type=click.Path(file_okay=False, exists=True), help="The running job's directory.")
@click.option("--url", help="The running job's HTTP endpoint (job run --http), e.g. http://127.0.0.1:8080.")
@click.option("--devices", required=True, type=click.IntRange(1, MAX_DEVICES_CEILING),
              help="Processes the job should run on (at most the job file's max_devices).")  # fmt: skip
@click.option("--tp", type=click.IntRange(min=1), help="Force this tensor-parallel degree.")
@_token_options
def scale_cmd(job_dir: str | None, url: str | None, devices: int, tp: int | None, token_file: str | None) -> None:
    """Ask the controller running in JOB_DIR (or serving URL) to move the job to DEVICES processes."""
    _one_target(job_dir, url)
    if tp is not None and devices % tp:
        raise ElasticError(f"--tp: {tp} does not divide --devices {devices}")
    if url is not None:
        reply = _request(url, "/scale", _token(token_file), {"devices": devices, "tp": tp})
        click.echo(f"requested {devices} device(s): {reply.get('request')} at {url}")
        return
    path = write_scale_request(job_dir, devices, tp, check_job_dir(job_dir))
    click.echo(f"requested {devices} device(s): {path}")


@job.command("status")
@click.option("--job-dir", type=click.Path(file_okay=False, exists=True), help="The job's directory.")
@click.option("--url", help="The running job's HTTP endpoint (job run --http).")
@_token_options
def status_cmd(job_dir: str | None, url: str | None, token_file: str | None) -> None:
    """Print the job's status (status.json and the pending scale requests) as JSON."""
    _one_target(job_dir, url)
    status = _request(url, "/status", _token(token_file)) if url is not None else read_status(job_dir)
    click.echo(json.dumps(status, indent=1, sort_keys=True, allow_nan=False))

