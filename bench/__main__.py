"""`python -m bench [--quick] [--only compile|bytes|runtime|fuse|hosts|dataset] [--timeout S] [--jobs N] [--out DIR]`.

`--only runtime` runs the agent runtime's reshard throughput (`bench/runtime.py`, ≥ 2 GB of
state; not part of the default run) and writes bench/results/runtime.{md,json}. `--only fuse`
runs the FUSE view's read throughput (`bench/fuse.py`, needs fuse3 and root; not part of the
default run) and writes bench/results/fuse.{md,json}. `--only hosts` runs peer-to-peer vs
centralized resharding on 4 emulated hosts with 1 Gbit/s links (`bench/hosts.py`, needs root
and iproute2) and writes bench/results/hosts.{md,json}. `--only dataset` reads one rank's samples
directly, through the DataLoader and through the dataset FUSE view, and times the first batch
after a rescale with and without the prefetcher (`bench/dataset.py`, needs fuse3, root and torch
for all rows) and writes bench/results/dataset.{md,json}.

Exit status 1 when a plan's network bytes differ from the lower bound or a case fails with an
error; a timeout is reported (loudly) but does not fail the run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import report
from bench.cases import bytes_cases, compile_cases
from bench.runner import ROOT, run_cases


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="small cases (gpt-1.3b, 8 layers for the bytes table), under 30 s"
    )
    p.add_argument(
        "--only",
        choices=["compile", "bytes", "runtime", "fuse", "hosts", "dataset"],
        help="run one table (runtime: agent reshard throughput; fuse: FUSE read throughput; only when asked for)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="bytes cases run at once (compile cases run one at a time)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results directory")
    return p.parse_args(argv)


def _progress(row: dict) -> None:
    print(f"  {row['status']:7} {row.get('wall_s', 0):7.1f} s  {row['name']}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    info = report.machine_info()
    if args.only in ("runtime", "fuse", "hosts", "dataset"):
        from bench import dataset, fuse, hosts, runtime

        if args.only == "runtime":
            print("runtime reshard (one process per case):", file=sys.stderr)
        module = {"runtime": runtime, "fuse": fuse, "hosts": hosts, "dataset": dataset}[args.only]
        rows, paths = module.run(args.quick, args.timeout, args.out, info)
        print("wrote " + ", ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths))
        return _verdict(rows)
    compile_rows, bytes_rows = [], []
    if args.only in (None, "compile"):
        print("compile + verify (one core, one process per case):", file=sys.stderr)
        compile_rows = run_cases("compile", compile_cases(args.quick), args.timeout, jobs=1, on_done=_progress)
        print("\nCompile + verify, one core (goal: compile <= 10 s, check <= 10 s, RSS <= 4 GiB)")
        print(
            report.text_table(report.COMPILE_HEADERS, [report.compile_row(r) for r in compile_rows]) + "\n", flush=True
        )
    if args.only in (None, "bytes"):
        print("network bytes (plan, lower bound, reference baseline):", file=sys.stderr)
        bytes_rows = run_cases("bytes", bytes_cases(args.quick), args.timeout, jobs=args.jobs, on_done=_progress)
        print("\nNetwork bytes: plan vs lower bound vs reference baseline (4 GPUs per host)")
        print(report.text_table(report.BYTES_HEADERS, [report.bytes_row(r) for r in bytes_rows]) + "\n", flush=True)
    paths = report.write(args.out, "compiler-quick" if args.quick else "compiler", info, compile_rows, bytes_rows)
    print("wrote " + ", ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths))
    return _verdict(compile_rows + bytes_rows)


def _verdict(rows: list[dict]) -> int:
    unequal = [r["name"] for r in rows if r["status"] == "ok" and r.get("equal") is False]
    errors = [f"{r['name']}: {r['error']}" for r in rows if r["status"] == "error"]
    timeouts = [r["name"] for r in rows if r["status"] == "timeout"]
    for name in unequal:
        print(f"FAIL: {name}: plan network bytes != network lower bound", file=sys.stderr)
    for line in errors:
        print(f"FAIL: {line}", file=sys.stderr)
    for name in timeouts:
        print(f"TIMEOUT: {name}", file=sys.stderr)
    return 1 if unequal or errors else 0


if __name__ == "__main__":
    sys.exit(main())
