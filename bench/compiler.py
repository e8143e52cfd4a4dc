"""`python -m bench --only compile|bytes`: compile + verify time on one core, and the plans'
network bytes against the lower bound and the reference Tenplex's (cases: `bench.cases`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from bench import report
from bench.cases import bytes_cases, compile_cases
from bench.runner import run_cases


def _progress(row: dict) -> None:
    print(f"  {row['status']:7} {row.get('wall_s', 0):7.1f} s  {row['name']}", file=sys.stderr, flush=True)


def _run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any], compile_: bool, bytes_: bool):
    compile_rows, bytes_rows = [], []
    if compile_:
        print("compile + verify (one core, one process per case):", file=sys.stderr)
        compile_rows = run_cases("compile", compile_cases(quick), timeout_s, jobs=1, on_done=_progress)
        print("\nCompile + verify, one core (CPU seconds)")
        print(report.text_table(report.COMPILE_HEADERS, [report.compile_row(r) for r in compile_rows]) + "\n")
    if bytes_:
        print("network bytes (plan, lower bound, reference baseline):", file=sys.stderr)
        jobs = os.cpu_count() or 1
        bytes_rows = run_cases("bytes", bytes_cases(quick), timeout_s, jobs=jobs, on_done=_progress)
        print("\nNetwork bytes: plan vs lower bound vs reference baseline (4 GPUs per host)")
        print(report.text_table(report.BYTES_HEADERS, [report.bytes_row(r) for r in bytes_rows]) + "\n", flush=True)
    stem = ("compile" if not bytes_ else "bytes" if not compile_ else "compiler") + ("-quick" if quick else "")
    return compile_rows + bytes_rows, report.write(out_dir, stem, info, compile_rows, bytes_rows)


def run_compile(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]):
    return _run(quick, timeout_s, out_dir, info, True, False)


def run_bytes(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]):
    return _run(quick, timeout_s, out_dir, info, False, True)
