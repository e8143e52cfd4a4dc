"""Run cases in fresh subprocesses (`bench.worker`) with a timeout, so a slow or crashing
case reports `timeout` or `error` instead of hanging the benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.cases import Case

ROOT = Path(__file__).resolve().parent.parent


def run_case(kind: str, case: Case, timeout_s: float) -> dict[str, Any]:
    """The worker's JSON result plus name/src/dst/status/wall_s; status is ok|timeout|error."""
    row = {"name": case.name, "src": case.src, "dst": case.dst}
    return run_json(["bench.worker", kind, case.src, case.dst], row, timeout_s)


def run_json(module_argv: list[str], row: dict[str, Any], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m <module_argv>` in a fresh process (with `env`, else this one's environment);
    `row` plus its last stdout line (JSON), `wall_s` and `status` (ok | timeout | error, with the
    last stderr line)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", *module_argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "wall_s": time.perf_counter() - start, "timeout_s": timeout_s}
    row = {**row, "wall_s": time.perf_counter() - start}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        err = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {**row, "status": "error", "error": err}
    return {**row, "status": "ok", **json.loads(lines[-1])}


def progress(r: dict[str, Any], label: str) -> None:
    """One stderr line per finished case: its status, seconds and `label`."""
    print(f"  {r['status']:7} {r.get('wall_s', 0):7.1f} s  {label}", file=sys.stderr, flush=True)


def run_cases(
    kind: str, cases: Iterable[Case], timeout_s: float, jobs: int = 1, on_done: Callable[[dict], None] | None = None
) -> list[dict[str, Any]]:
    """Results in case order; up to `jobs` cases at once (use 1 for timing figures)."""

    def one(case: Case) -> dict[str, Any]:
        row = run_case(kind, case, timeout_s)
        if on_done:
            on_done(row)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, cases))


def run_repeated(
    kind: str, cases: list[Case], timeout_s: float, repeats: int, on_done: Callable[[dict], None] | None = None
) -> list[list[dict[str, Any]]]:
    """Each case `repeats` times, one at a time, cases taking turns (A B C A B C ...) so that a
    noisy spell of the machine spreads over all of them; per case, its runs in order."""
    runs: list[list[dict[str, Any]]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, case in enumerate(cases):
            row = run_case(kind, case, timeout_s)
            runs[i].append(row)
            if on_done:
                on_done(row)
    return runs
