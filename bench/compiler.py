"""`python -m bench --only compile|bytes`: compile + verify CPU time on one core (min/median/max
of `REPEATS` fresh processes per case, with a scaling series), and the plans' network bytes
against the lower bound and the reference Tenplex's (cases: `bench.cases`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from bench import report
from bench.cases import Case, bytes_cases, compile_cases
from bench.runner import run_cases, run_repeated

REPEATS = 3


def _progress(row: dict) -> None:
    print(f"  {row['status']:7} {row.get('wall_s', 0):7.1f} s  {row['name']}", file=sys.stderr, flush=True)


def _run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any], compile_: bool, bytes_: bool):
    compile_rows, bytes_rows = [], []
    if compile_:
        print("compile + verify (one core, one process per case):", file=sys.stderr)
        cases = compile_cases(quick)
        runs = run_repeated("compile", cases, timeout_s, REPEATS, on_done=_progress)
        compile_rows = [summarize(case, rs) for case, rs in zip(cases, runs)]
        print(f"\nCompile + verify, one core (CPU seconds, min/median/max of {REPEATS} runs)")
        print(report.text_table(report.COMPILE_HEADERS, [report.compile_row(r) for r in compile_rows]) + "\n")
        print("Scaling: the same change at growing size (growth exponent 1.00 = linear)")
        print(report.text_table(report.SCALING_HEADERS, report.scaling_rows(compile_rows)) + "\n")
    if bytes_:
        print("network bytes (plan, lower bound, reference baseline):", file=sys.stderr)
        jobs = os.cpu_count() or 1
        bytes_rows = run_cases("bytes", bytes_cases(quick), timeout_s, jobs=jobs, on_done=_progress)
        print("\nNetwork bytes: plan vs lower bound vs reference baseline (4 GPUs per host)")
        print(report.text_table(report.BYTES_HEADERS, [report.bytes_row(r) for r in bytes_rows]) + "\n", flush=True)
    stem = ("compile" if not bytes_ else "bytes" if not compile_ else "compiler") + ("-quick" if quick else "")
    return compile_rows + bytes_rows, report.write(out_dir, stem, info, compile_rows, bytes_rows)


def summarize(case: Case, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per case: the first failed run as is, or the last run with its phase times
    replaced by every run's (lists, in run order) and the case's goal and size."""
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        return failed[0]
    times = {k: [r[k] for r in runs] for k in ("build_s", "compile_s", "check_s", "wall_s")}
    rss = max(r["peak_rss_bytes"] for r in runs)
    return {**runs[-1], **times, "peak_rss_bytes": rss, "runs": len(runs), "goal_s": case.goal_s, "gpus": case.gpus}


def run_compile(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]):
    return _run(quick, timeout_s, out_dir, info, True, False)


def run_bytes(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]):
    return _run(quick, timeout_s, out_dir, info, False, True)
