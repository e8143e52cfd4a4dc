"""An HTTP endpoint through which a scheduler changes a running job's devices (aiohttp).

Endpoints, for one job directory:
- `POST /scale` with a JSON body `{"devices": N, "tp": T}` (`tp` optional or null): writes a
  scale request (`requests.write_scale_request`) and answers 202 `{"request": "<file name>"}`;
  the controller takes it at its next poll.
- `GET /status`: 200 with `requests.read_status` (status.json plus the pending requests).

Errors are JSON `{"error": "<message>"}`, the message starting with the field at fault:
400 a body that is not JSON, not an object, has an unknown or missing field or a bad value;
401 a missing or wrong bearer token; 500 a job directory the request cannot be written to or
whose status.json is malformed.

Invariants:
- a rejected request writes nothing (the body is checked in full before the file is written);
  `devices` above the job's `max_devices` is rejected (400 naming the field and the bound);
- with a token, every request without `Authorization: Bearer <token>` gets 401;
- the server binds to a non-loopback host only with a token;
- `serve_in_thread` leaves no thread, event loop or socket behind when its block exits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import MAX_DEVICES_CEILING
from tenplex.elastic.requests import read_status, scale_request_from_json, write_scale_request
from tenplex.ir.files import loads
from tenplex.runtime.rest.server import RestServer, bearer_auth, is_loopback

__all__ = ["check_address", "make_app", "serve_in_thread"]

SHUTDOWN_SECONDS = 5.0
_JOB_DIR_KEY = web.AppKey("job_dir", Path)
_MAX_DEVICES_KEY = web.AppKey("max_devices", int)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(job_dir: str | os.PathLike, *, token: str | None = None,
             max_devices: int = MAX_DEVICES_CEILING) -> web.Application:  # fmt: skip
    """The aiohttp application for `job_dir`; with `token`, requests need `Bearer <token>`;
    requests for more than `max_devices` (the job file's bound) are refused."""
    app = web.Application(middlewares=[_auth(token)] if token is not None else [])
    app[_JOB_DIR_KEY] = Path(job_dir)
    app[_MAX_DEVICES_KEY] = max_devices
    app.router.add_post("/scale", _scale)
    app.router.add_get("/status", _status)
    return app


def _error(kind: type[web.HTTPException], message: str, **kwargs: object) -> web.HTTPException:
    body = json.dumps({"error": " ".join(message.split())})  # one line, for logs and clients alike
    return kind(text=body, content_type="application/json", **kwargs)


def _auth(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    if not token:
        raise ElasticError("token: expected a non-empty string")
    return bearer_auth(token, lambda message: _error(web.HTTPUnauthorized, message, headers={"WWW-Authenticate": "Bearer"}))


async def _scale(request: web.Request) -> web.Response:
    try:
        doc = loads(await request.read())  # strict: NaN and Infinity are no numbers
    except ValueError as e:  # JSONDecodeError, or a body that is not UTF-8
        raise _error(web.HTTPBadRequest, f"body: not valid JSON ({e})") from None
    except RecursionError:
        raise _error(web.HTTPBadRequest, "body: not valid JSON (nested too deeply)") from None
    try:
        checked = scale_request_from_json(doc, request.app[_MAX_DEVICES_KEY])
    except ElasticError as e:
        raise _error(web.HTTPBadRequest, str(e)) from None
    try:
        path = write_scale_request(request.app[_JOB_DIR_KEY], checked["devices"], checked["tp"], request.app[_MAX_DEVICES_KEY])
    except (ElasticError, OSError) as e:
        raise _error(web.HTTPInternalServerError, f"request: cannot be written ({e})") from None
    return web.json_response({"request": path.name}, status=202)


async def _status(request: web.Request) -> web.Response:
    try:
        return web.json_response(read_status(request.app[_JOB_DIR_KEY]))
    except ElasticError as e:
        raise _error(web.HTTPInternalServerError, str(e)) from None


# -- a server in a thread ----------------------------------------------------------------------


def check_address(host: str, token: str | None) -> None:
    """Raises ElasticError if `host` is not loopback and no token is given, or the token is empty
    (what `serve_in_thread` checks first; `job run` calls it before creating anything)."""
    if not token and not is_loopback(host):
        raise ElasticError(f"host: refusing to serve scale requests on non-loopback {host!r} without a token")
    if token is not None and not token:
        raise ElasticError("token: expected a non-empty string")


@contextmanager
def serve_in_thread(job_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                    max_devices: int = MAX_DEVICES_CEILING) -> Iterator[str]:  # fmt: skip
    """Serve `make_app(job_dir, token=token, max_devices=max_devices)` on `host:port` from a
    background thread with its own event loop; yields the bound URL `http://host:port` (the
    real port when 0 was asked).

    On exit the server stops (in-flight requests get SHUTDOWN_SECONDS), its socket is closed and
    the thread is joined.
    Raises ElasticError if `host` is not loopback and no token is given, or the token is empty;
    OSError if the address cannot be bound.
    """
    check_address(host, token)
    with RestServer(make_app(job_dir, token=token, max_devices=max_devices), host, port, SHUTDOWN_SECONDS, name="tenplex-job-http") as server:
        yield server.url
