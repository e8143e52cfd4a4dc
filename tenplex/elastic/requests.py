"""Scale requests and job status in a job directory: what `tenplex job scale`, the HTTP endpoint
(`tenplex.elastic.http`) and the controller share.

    control/scale-<time_ns>.json   one request, `{"devices": N, "tp": T | null}`
    control/scale-<time_ns>.taken  a request the controller has taken
    status.json                    the controller's status: a JSON object such as
                                   {"generation": N, "config": {"tp", "dp", "pp"}, "state": ...}

A request's file name orders it: the controller takes `scale-*.json` in name order, so the
newest request wins.

Invariants:
- devices is an integer >= 1; tp is null or an integer >= 1 that divides devices;
- a request file is whole or absent: it is written under a temporary name the controller does
  not match and then linked to its final name, which never replaces an earlier request;
- `read_status` treats status.json as opaque, apart from requiring a JSON object.

Raises ElasticError naming the field and value (`devices: expected an integer >= 1, got 0`), or
the file or directory at fault.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.layouts import check_degree

FIELDS = ("devices", "tp")
STATUS_FILE = "status.json"


def control_dir(job_dir: str | os.PathLike) -> Path:
    return Path(job_dir) / "control"


def check_scale_request(devices: object, tp: object = None) -> dict[str, Any]:
    """The request document `{"devices": devices, "tp": tp}`, checked (see Invariants)."""
    check_degree("devices", devices)
    if tp is not None:
        check_degree("tp", tp)
        if devices % tp:
            raise ElasticError(f"tp: {tp} does not divide devices {devices}")
    return {"devices": devices, "tp": tp}


def scale_request_from_json(doc: object) -> dict[str, Any]:
    """A decoded JSON body such as `{"devices": 4, "tp": 2}` as a checked request document.

    Raises ElasticError for a body that is not an object, an unknown field, a missing `devices`
    or a value `check_scale_request` rejects; the message starts with the field.
    """
    if not isinstance(doc, dict):
        raise ElasticError(f'body: expected a JSON object such as {{"devices": 4}}, got {type(doc).__name__}')
    for key in doc:
        if key not in FIELDS:
            raise ElasticError(f"{key}: unknown field (expected {', '.join(FIELDS)})")
    if "devices" not in doc:
        raise ElasticError("devices: required field is missing")
    return check_scale_request(doc["devices"], doc.get("tp"))


def write_scale_request(job_dir: str | os.PathLike, devices: int, tp: int | None = None) -> Path:
    """Ask the controller running in `job_dir` for `devices` processes (and tensor-parallel
    degree `tp`); returns the request file `control/scale-<time_ns>.json`.

    Raises ElasticError for a bad request or a missing job directory; OSError if the file
    cannot be written (nothing is left behind).
    """
    text = json.dumps(check_scale_request(devices, tp))
    if not Path(job_dir).is_dir():
        raise ElasticError(f"{job_dir}: the job directory does not exist")
    control = control_dir(job_dir)
    control.mkdir(exist_ok=True)
    tmp = control / f"scale-{time.time_ns()}.tmp{os.getpid()}"  # not scale-*.json: the controller skips it
    try:
        tmp.write_text(text)
        return _link_new(tmp, control)
    finally:
        tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, control: Path) -> Path:
    """Give `tmp` the first free name `scale-<ns>.json` with ns >= now (a hard link never
    replaces a file, unlike a rename, so two requests in one nanosecond both survive)."""
    ns = time.time_ns()
    while True:
        path = control / f"scale-{ns}.json"
        try:
            os.link(tmp, path)
            return path
        except FileExistsError:
            ns += 1


def pending_requests(job_dir: str | os.PathLike) -> list[str]:
    """The names of the request files the controller has not taken yet, oldest first."""
    return sorted(p.name for p in control_dir(job_dir).glob("scale-*.json"))


def read_status(job_dir: str | os.PathLike) -> dict[str, Any]:
    """`status.json` (or `{"state": "starting"}` before the controller writes it) with the
    pending request names under `"pending"`.

    Raises ElasticError naming the job directory if it does not exist, or status.json if it
    cannot be read or is not a JSON object.
    """
    if not Path(job_dir).is_dir():
        raise ElasticError(f"{job_dir}: the job directory does not exist")
    path = Path(job_dir) / STATUS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {"state": "starting", "pending": pending_requests(job_dir)}
    except OSError as e:
        raise ElasticError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        status = json.loads(text)
    except ValueError as e:
        raise ElasticError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(status, dict):
        raise ElasticError(f"{path}: expected a JSON object, got {type(status).__name__}")
    return {**status, "pending": pending_requests(job_dir)}
