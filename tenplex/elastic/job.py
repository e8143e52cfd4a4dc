"""Job files: what `tenplex job run` runs, on how many devices, and when the devices change.

JSON, or YAML (`.yaml` / `.yml`):

    program: elastic_gpt.py               required: the training script; a relative path is
                                          resolved against the job file's directory (not the
                                          current directory), so a job file and its program
                                          move together (`examples/elastic_gpt.yaml`)
    args: ["--steps", "30"]               optional: its arguments (the controller adds --job-dir)
    devices: 4                            required: processes of the first generation
    schedule:                             optional: resource changes, in order
      - {at_step: 10, devices: 2}         stop before global step 10, continue on 2 processes
      - {at_seconds: 60, devices: 4, tp: 2}   after 60 s of the job; tp (and pp) force the split
      - {at_step: 15, devices: 4, pp: 2}  tp 1 x pp 2 x dp 2
      - {at_step: 20, fail: [3]}          ranks 3 of that generation die at step 20 (a real
                                          process crash, no save); the job recovers on the
                                          survivors (devices: optional, default the survivors)
    parallel: {"4": [2, 1, 2]}            optional: devices -> [tp, pp, dp], the parallelizer's table
    model: {kind: gpt, num_layers: 2, hidden: 64, heads: 4, ffn_hidden: 256, vocab: 256,
            max_position: 32}             optional: the ModelSpec fields the parallelizer weighs
    gpus_per_host: 8                      optional (default 8): processes per host across hosts
    timeout: 600                          optional: seconds one generation may run (default 600)
    max_restarts: 0                       optional: restarts after an unplanned crash (from the last
                                          checkpoint, same layout; default 0: the job fails)
    store_replicas: 1                     optional (across hosts; default 0): copies of each generation's
                                          start state on the next hosts, so a lost host's part survives
    state: store                          optional: the state between generations in the hosts' stores
                                          (default) or `files` (DCP files in the job directory)
    recovery: replicas                    optional: after a failure, rebuild the state from the
                                          surviving ranks' replicas (default), or `checkpoint`:
                                          restart from the generation's start state (baseline)
    max_devices: 64                       optional: the most processes the job may run on, in
                                          1..MAX_DEVICES_CEILING (4096); default DEFAULT_MAX_DEVICES:
                                          64, or the machine's CPU count where that is larger

A job file is read only if it is a regular UTF-8 file of at most 64 MiB (`MAX_FILE_BYTES`, read by
`tenplex.ir.files.read_text`). `load_job` also checks that the program is a file (`check_program`,
which the controller calls again before it starts anything), so a wrong path fails at once with
one line naming the job file, the field and the resolved path, never after torchrun started.

Invariants:
- 1 <= devices <= max_devices everywhere (the initial devices, every event; scale requests are
  checked against it by the controller); an event has exactly one of at_step (>= 1) and at_seconds
  (> 0, finite), at_step ones in increasing order; an event's tp x pp divides its devices;
  timeout is finite; program and args hold no NUL byte;
- a `fail` event has at_step, a non-empty list of distinct ranks >= 0, and `devices` is
  optional there only (None: the surviving processes); a tp or pp hint needs devices;
- a table entry's tp x pp x dp equals its device count; a `model` is a valid ModelSpec.
Raises JobFileError naming the file and the field (`schedule[1].devices`), with the value.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.errors import JobFileError
from tenplex.ir.files import loads, read_text

KEYS = {"program", "args", "devices", "schedule", "parallel", "model", "gpus_per_host", "timeout", "recovery",
        "max_restarts", "max_devices", "state", "store_replicas"}  # fmt: skip
EVENT_KEYS = {"at_step", "at_seconds", "devices", "tp", "pp", "fail"}
RECOVERY = ("replicas", "checkpoint")
STATES = ("store", "files")
MAX_FILE_BYTES = 64 << 20  # job files, status and requests are a few KiB; refuse what cannot be one
MAX_DEVICES_CEILING = 4096  # processes torchrun may start on one machine, whatever a job file says
DEFAULT_MAX_DEVICES = min(MAX_DEVICES_CEILING, max(64, os.cpu_count() or 1))


@attrs.frozen
class Event:
    """A resource change: at a global step (deterministic) or after seconds of the job. A
    failure (`fail`: the ranks that die) has devices None when the survivors carry on."""

    devices: int | None
    at_step: int | None = None
    at_seconds: float | None = None
    tp: int | None = None
    fail: tuple[int, ...] = ()
    pp: int | None = None


@attrs.frozen
class JobSpec:
    """A parsed job file (see the module docstring)."""

    program: Path
    devices: int
    args: tuple[str, ...] = ()
    schedule: tuple[Event, ...] = ()
    table: dict[int, tuple[int, int, int]] | None = None
    model: dict[str, Any] | None = None
    gpus_per_host: int = 8
    timeout: float = 600.0
    recovery: str = "replicas"
    max_restarts: int = 0
    source: str = "<job>"
    max_devices: int = DEFAULT_MAX_DEVICES
    state: str = "store"
    store_replicas: int = 0


def _int(where: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise JobFileError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise JobFileError(f"{where}: expected a number > 0, got {value!r}")
    try:
        if math.isfinite(value):
            return float(value)
    except OverflowError:  # an int beyond any float
        pass
    raise JobFileError(f"{where}: expected a finite number > 0, got {value!r}")


def _devices(where: str, value: Any, max_devices: int) -> int:
    if _int(where, value) > max_devices:
        raise JobFileError(f"{where}: {value} is more than max_devices {max_devices}")
    return value


def _no_nul(where: str, text: str, what: str) -> str:
    if "\0" in text:
        raise JobFileError(f"{where}: {what} may not hold a NUL byte, got {text!r}")
    return text


def _keys(where: str, node: Any, allowed: set[str], required: set[str]) -> dict:
    if not isinstance(node, Mapping):
        raise JobFileError(f"{where}: expected a mapping, got {type(node).__name__}")
    unknown = sorted(set(map(str, node)) - allowed)
    if unknown:
        raise JobFileError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(node))
    if missing:
        raise JobFileError(f"{where}.{missing[0]}: required field is missing")
    return dict(node)


def _fail(where: str, node: Any) -> tuple[int, ...]:
    if not isinstance(node, list) or not node:
        raise JobFileError(f"{where}: expected a non-empty list of ranks, got {node!r}")
    ranks = tuple(_int(f"{where}[{i}]", r, low=0) for i, r in enumerate(node))
    if len(set(ranks)) != len(ranks):
        raise JobFileError(f"{where}: rank listed twice in {list(ranks)}")
    return ranks


def _event(where: str, node: Any, last_step: int, max_devices: int) -> Event:
    node = _keys(where, node, EVENT_KEYS, set() if isinstance(node, Mapping) and "fail" in node else {"devices"})
    fail = _fail(f"{where}.fail", node["fail"]) if "fail" in node else ()
    if fail and "at_step" not in node:
        raise JobFileError(f"{where}.fail: a failure needs at_step (failures are injected at a step boundary)")
    for hint in ("tp", "pp"):
        if hint in node and "devices" not in node:
            raise JobFileError(f"{where}.{hint}: a {hint} hint needs devices")
    devices = _devices(f"{where}.devices", node["devices"], max_devices) if "devices" in node else None
    if ("at_step" in node) == ("at_seconds" in node):
        raise JobFileError(f"{where}: give exactly one of at_step and at_seconds, got {sorted(set(node) & {'at_step', 'at_seconds'})}")
    step = node.get("at_step")
    if step is not None and _int(f"{where}.at_step", step) <= last_step:
        raise JobFileError(f"{where}.at_step: {step} is not after the previous event's step {last_step}")
    seconds = None if "at_seconds" not in node else _number(f"{where}.at_seconds", node["at_seconds"])
    tp, pp = (None if node.get(k) is None else _int(f"{where}.{k}", node[k]) for k in ("tp", "pp"))
    if tp is not None and devices is not None and devices % tp:
        raise JobFileError(f"{where}.tp: {tp} does not divide devices={devices}")
    if pp is not None and devices is not None and devices % (pp * (tp or 1)):
        raise JobFileError(f"{where}.pp: tp x pp = {pp * (tp or 1)} does not divide devices={devices}")
    return Event(devices, step, seconds, tp, fail, pp)


def _table(where: str, node: Any) -> dict[int, tuple[int, int, int]]:
    if not isinstance(node, Mapping):
        raise JobFileError(f"{where}: expected a mapping devices -> [tp, pp, dp], got {type(node).__name__}")
    table = {}
    for key, entry in node.items():
        try:
            devices = int(key) if isinstance(key, (int, str)) and not isinstance(key, bool) else None
        except ValueError:
            devices = None
        if devices is None:
            raise JobFileError(f"{where}.{key}: the key must be a device count")
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise JobFileError(f"{where}.{key}: expected [tp, pp, dp], got {entry!r}")
        tp, pp, dp = (_int(f"{where}.{key}[{i}]", v) for i, v in enumerate(entry))
        if tp * pp * dp != devices:
            raise JobFileError(f"{where}.{key}: tp x pp x dp = {tp * pp * dp} is not {devices} devices")
        table[devices] = (tp, pp, dp)
    return table


def parse_job(doc: Any, source: str = "<job>", base: str | os.PathLike = ".") -> JobSpec:
    """A JobSpec from a decoded job file; `program` is resolved against `base`.

    Raises:
        JobFileError: a missing, unknown or invalid field (names `source` and the field).
    """
    try:
        root = _keys("job", doc, KEYS, {"program", "devices"})
        if not isinstance(root["program"], str) or not root["program"]:
            raise JobFileError(f"job.program: expected a path, got {root['program']!r}")
        _no_nul("job.program", root["program"], "a path")
        args = root.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise JobFileError(f"job.args: expected a list of strings, got {args!r}")
        args = [_no_nul(f"job.args[{i}]", str(a), "an argument") for i, a in enumerate(args)]
        max_devices = root.get("max_devices", DEFAULT_MAX_DEVICES)
        if isinstance(max_devices, bool) or not isinstance(max_devices, int) or not 1 <= max_devices <= MAX_DEVICES_CEILING:
            raise JobFileError(f"job.max_devices: expected an integer in 1..{MAX_DEVICES_CEILING}, got {max_devices!r}")
        devices = _devices("job.devices", root["devices"], max_devices)
        schedule, last = [], 0
        events = root.get("schedule", [])
        if not isinstance(events, list):
            raise JobFileError(f"job.schedule: expected a list of events, got {type(events).__name__}")
        for i, node in enumerate(events):
            schedule.append(_event(f"job.schedule[{i}]", node, last, max_devices))
            last = schedule[-1].at_step or last
        recovery, state = root.get("recovery", "replicas"), root.get("state", "store")
        if recovery not in RECOVERY:
            raise JobFileError(f"job.recovery: expected one of {', '.join(RECOVERY)}, got {recovery!r}")
        if state not in STATES:
            raise JobFileError(f"job.state: expected one of {', '.join(STATES)}, got {state!r}")
        model = _model(root.get("model"))
        return JobSpec(
            program=Path(base) / root["program"], devices=devices, args=tuple(args), schedule=tuple(schedule),
            table=None if "parallel" not in root else _table("job.parallel", root["parallel"]),
            model=None if model is None else dict(model),
            gpus_per_host=_int("job.gpus_per_host", root.get("gpus_per_host", 8)),
            timeout=_number("job.timeout", root.get("timeout", 600)), recovery=recovery,
            max_restarts=_int("job.max_restarts", root.get("max_restarts", 0), low=0), source=source,
            max_devices=max_devices, state=state,
            store_replicas=_int("job.store_replicas", root.get("store_replicas", 0), low=0))  # fmt: skip
    except JobFileError as e:
        raise JobFileError(f"{source}: {e}") from None


def _model(model: Any) -> dict[str, Any] | None:
    """The `model` mapping, checked as a ModelSpec (the parallelizer and the layouts read it)."""
    from tenplex.frontends.presets import model_from_fields
    from tenplex.ir.errors import TenplexError

    if model is None:
        return None
    if not isinstance(model, Mapping):
        raise JobFileError(f"job.model: expected a mapping of ModelSpec fields, got {type(model).__name__}")
    if bad := [k for k in model if not isinstance(k, str)]:
        raise JobFileError(f"job.model: unknown model field {bad[0]!r} (fields are names)")
    try:
        model_from_fields(model, "job.model")
    except (TenplexError, TypeError, ValueError, OverflowError) as e:
        raise JobFileError(" ".join(str(e).split())) from None
    return dict(model)


def load_job(path: str | os.PathLike) -> JobSpec:
    """Read and parse a job file (JSON, or YAML with PyYAML). Raises JobFileError naming it."""
    path = Path(path)
    text = read_text(path, JobFileError, "job file", MAX_FILE_BYTES)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise JobFileError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
        except RecursionError:
            raise JobFileError(f"{path}: not valid YAML (nested too deeply)") from None
    else:
        try:
            doc = loads(text)
        except json.JSONDecodeError as e:
            raise JobFileError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
        except ValueError as e:  # NaN or Infinity
            raise JobFileError(f"{path}: not valid JSON ({e})") from None
        except RecursionError:
            raise JobFileError(f"{path}: not valid JSON (nested too deeply)") from None
    return check_program(parse_job(doc, str(path), path.parent.absolute()))


def check_program(spec: JobSpec) -> JobSpec:
    """`spec`, once its program is a regular file (following links). Raises JobFileError naming
    the job file, `job.program` and the resolved path."""
    try:
        what = None if spec.program.is_file() else "is not a regular file" if spec.program.exists() else "does not exist"
    except OSError as e:  # a name too long for the file system, a permission denied on the way
        what = f"cannot be looked up ({e.strerror or e})"
    if what is not None:
        raise JobFileError(f"{spec.source}: job.program: {spec.program} {what} (a relative program is resolved "
                           "against the job file's directory)")  # fmt: skip
    return spec
