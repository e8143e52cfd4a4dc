"""Scale requests and job status in a job directory: what `tenplex job scale`, the HTTP endpoint
(`tenplex.elastic.http`) and the controller share.

    control/scale-<time_ns>.json   one request, `{"devices": N, "tp": T | null}`
    control/scale-<time_ns>.taken  a request the controller has taken (`take_scale_request`)
    control/scale-<time_ns>.rejected  a file the controller refused (not a valid request)
    status.json                    the controller's status: a JSON object such as
                                   {"generation": N, "config": {"tp", "dp", "pp"}, "state": ...,
                                    "max_devices": M}; written first thing by `job run`, so
                                   it marks a job directory

A request's file name orders it: the controller takes `scale-*.json` in name order, so the
newest request wins.

Invariants:
- devices is an integer in 1..max_devices (the job's bound; at most MAX_DEVICES_CEILING); tp is
  null or an integer >= 1 that divides devices;
- `tenplex job scale --job-dir DIR` writes only into a job directory: DIR/status.json is a
  JSON object (`check_job_dir`), whose `max_devices` bounds the request;
- a request file is whole or absent: it is written under a temporary name the controller does
  not match and then linked to its final name, which never replaces an earlier request;
- `read_status` treats status.json as opaque, apart from requiring a strict JSON object (no
  NaN or Infinity) in a regular UTF-8 file of bounded size.

Raises ElasticError naming the field and value (`devices: expected an integer >= 1, got 0`), or
the file or directory at fault.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import MAX_DEVICES_CEILING, MAX_FILE_BYTES
from tenplex.elastic.layouts import check_degree
from tenplex.ir.files import read_json

FIELDS = ("devices", "tp")
STATUS_FILE = "status.json"


def control_dir(job_dir: str | os.PathLike) -> Path:
    return Path(job_dir) / "control"


def check_scale_request(devices: object, tp: object = None, max_devices: int = MAX_DEVICES_CEILING) -> dict[str, Any]:
    """The request document `{"devices": devices, "tp": tp}`, checked (see Invariants)."""
    if check_degree("devices", devices) > max_devices:
        raise ElasticError(f"devices: {devices} is more than the job's max_devices {max_devices}")
    if tp is not None:
        check_degree("tp", tp)
        if devices % tp:
            raise ElasticError(f"tp: {tp} does not divide devices {devices}")
    return {"devices": devices, "tp": tp}


def scale_request_from_json(doc: object, max_devices: int = MAX_DEVICES_CEILING) -> dict[str, Any]:
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
    return check_scale_request(doc["devices"], doc.get("tp"), max_devices)


def write_scale_request(job_dir: str | os.PathLike, devices: int, tp: int | None = None,
                        max_devices: int = MAX_DEVICES_CEILING) -> Path:  # fmt: skip
    """Ask the controller running in `job_dir` for `devices` processes (and tensor-parallel
    degree `tp`); returns the request file `control/scale-<time_ns>.json`. The caller knows
    `job_dir` is a job's (the HTTP endpoint `job run` serves) or checked it (`check_job_dir`).

    Raises ElasticError for a bad request or a missing job directory; OSError if the file
    cannot be written (nothing is left behind).
    """
    text = json.dumps(check_scale_request(devices, tp, max_devices))
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


def take_scale_request(job_dir: str | os.PathLike, max_devices: int, refused: Callable[[str], None]) -> dict[str, Any] | None:
    """The newest pending request that is valid, or None; the controller's side. Every pending
    file is taken: renamed `.taken`, or `.rejected` (and reported to `refused`, one line) when it
    is not a valid request: a stray or hand-written file never stops the job."""
    newest = None
    for path in sorted(control_dir(job_dir).glob("scale-*.json")):
        try:
            doc = scale_request_from_json(read_json(path, ElasticError, "file", MAX_FILE_BYTES), max_devices)
        except ElasticError as e:
            path.rename(path.with_suffix(".rejected"))
            refused(f"{path}: scale request refused: {e}")
            continue
        path.rename(path.with_suffix(".taken"))
        newest = doc
    return newest


def pending_requests(job_dir: str | os.PathLike) -> list[str]:
    """The names of the request files the controller has not taken yet, oldest first."""
    return sorted(p.name for p in control_dir(job_dir).glob("scale-*.json"))


def check_job_dir(job_dir: str | os.PathLike) -> int:
    """The device bound of the job whose directory `job_dir` is (its status.json's `max_devices`,
    else MAX_DEVICES_CEILING). Raises ElasticError naming `job_dir` unless it holds the status
    file a running or finished controller writes."""
    path = Path(job_dir) / STATUS_FILE
    if not Path(job_dir).is_dir():
        raise ElasticError(f"{job_dir}: the job directory does not exist")
    if not path.exists():
        raise ElasticError(f"{job_dir}: not a tenplex job directory (no {STATUS_FILE}; start the job with `tenplex job run`)")
    status = _read_status_file(path)
    bound = status.get("max_devices", MAX_DEVICES_CEILING)
    if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= MAX_DEVICES_CEILING:
        raise ElasticError(f"{path}: max_devices: expected an integer in 1..{MAX_DEVICES_CEILING}, got {bound!r}")
    return bound


def _read_status_file(path: Path) -> dict[str, Any]:
    status = read_json(path, ElasticError, "status file", MAX_FILE_BYTES)
    if not isinstance(status, dict):
        raise ElasticError(f"{path}: expected a JSON object, got {type(status).__name__}")
    return status


def read_status(job_dir: str | os.PathLike) -> dict[str, Any]:
    """`status.json` (or `{"state": "starting"}` before the controller writes it) with the
    pending request names under `"pending"`.

    Raises ElasticError naming the job directory if it does not exist, or status.json if it
    cannot be read or is not a JSON object.
    """
    if not Path(job_dir).is_dir():
        raise ElasticError(f"{job_dir}: the job directory does not exist")
    path = Path(job_dir) / STATUS_FILE
    if not os.path.lexists(path):
        return {"state": "starting", "pending": pending_requests(job_dir)}
    return {**_read_status_file(path), "pending": pending_requests(job_dir)}
