"""What the controller records: a reconfiguration and its phases, and the steps a generation logged.

`Reconfiguration` is one change of layout (or recovery) with the seconds of each phase, printed
by `describe` and written to report.json by `to_json`. `StepLog(job_dir).records(generation)`
gives the (step, wall time) pairs rank 0 appended to metrics.jsonl for that generation, reading
each byte of the file once however often it is polled; it skips records whose step is not an
integer or whose time is not a finite number. `read_json(path)` reads a strict JSON file or raises
ElasticError naming it (`files`); `write_json(path, doc)` writes one atomically, strict too:
a NaN or infinity becomes null, so `job status` never prints one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import attrs

from tenplex.compiler.emit import human_bytes
from tenplex.elastic.api import ParallelConfig, metrics_file
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import MAX_FILE_BYTES
from tenplex.ir.files import read_json as _read_json
from tenplex.ir.files import write_atomic


@attrs.frozen
class Reconfiguration:
    """One change of layout and the seconds each phase took."""

    step: int
    src: ParallelConfig
    dst: ParallelConfig
    phases: dict[str, float]
    bytes_moved: int
    failed: tuple[int, ...] = ()  # the ranks that crashed (a failure recovery)
    recovered_from: str | None = None  # "replicas" or "checkpoint" after a failure
    lost_steps: int = 0  # steps to run again (a restart from a checkpoint)

    def describe(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.phases.items())
        what = "" if not self.failed else f" after ranks {list(self.failed)} failed, from {self.recovered_from} ({self.lost_steps} steps lost)"
        return (f"step {self.step}: {describe_config(self.src)} -> {describe_config(self.dst)}{what}: {parts}; total {total:.2f}s, "
                f"{human_bytes(self.bytes_moved)} resharded")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "src": self.src.to_json(), "dst": self.dst.to_json(), "phases": self.phases,
                "bytes_moved": self.bytes_moved, "failed": list(self.failed), "recovered_from": self.recovered_from,
                "lost_steps": self.lost_steps}  # fmt: skip


def describe_config(c: ParallelConfig) -> str:
    return f"tp{c.tp} dp{c.dp}{f' pp{c.pp}' if c.pp > 1 else ''} (W={c.world})"


def read_json(path: Path) -> Any:
    return _read_json(path, ElasticError, "file", MAX_FILE_BYTES)


def finite(doc: Any) -> Any:
    """`doc` with every NaN or infinite float replaced by None (strict JSON has neither)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def write_json(path: Path, doc: Any, indent: int | None = None) -> None:
    """`doc` as strict JSON (`finite`) in `path`, complete or absent."""
    write_atomic(path, json.dumps(finite(doc), indent=indent, allow_nan=False))


class StepLog:
    """The (step, wall time) pairs rank 0 appends to metrics.jsonl, per generation. Each call reads
    only what was appended since the last one (the controller polls it while a generation runs);
    a line still being written is left for the next call."""

    def __init__(self, job_dir: str | os.PathLike) -> None:
        self.path = metrics_file(job_dir)
        self._offset = 0
        self._steps: dict[int, list[tuple[int, float]]] = {}

    def records(self, generation: int) -> list[tuple[int, float]]:
        """(step, wall time) of each step generation `generation` logged so far."""
        self._read_new()
        return list(self._steps.get(generation, ()))

    def _read_new(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, not UTF-8: not a record of the example's shape
                continue
            if _is_step(record):
                self._steps.setdefault(record["generation"], []).append((record["step"], float(record["time"])))


def _is_step(record: Any) -> bool:
    """A step record of the example's shape: integer generation and step, a finite wall time."""
    if not isinstance(record, dict) or not {"generation", "step", "time"} <= record.keys():
        return False
    ints = all(isinstance(record[k], int) and not isinstance(record[k], bool) for k in ("generation", "step"))
    time = record["time"]
    if not ints or isinstance(time, bool) or not isinstance(time, (int, float)):
        return False
    try:
        return math.isfinite(time)
    except OverflowError:  # an int beyond any float
        return False
