"""`python -m bench [--quick] [--only TABLE[,TABLE...]] [--skip TABLE,...] [--timeout S] [--out DIR]`.

`make bench` runs every table of `TABLES`, one after another, and writes each one's
bench/results/<table>.{md,json} (`<table>-quick.*` with --quick). Every figure is printed as a
ratio against its anchor measured in the same run (memcpy, `cp -r`, tmpfs reads, raw UCX, the
bandwidth bound, PyTorch DCP, ...), with the machine described. A table that needs what this
machine lacks (fuse3, root, iproute2, a peer's package) reports its rows as skipped.

Exit status 1 when a table's check fails (a plan's network bytes differ from the lower bound, a
moved byte differs, a case fails with an error); a timeout is reported loudly but does not fail.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bench import report
from bench.runner import ROOT

# table name -> "module:function"; the function is run(quick, timeout_s, out_dir, info) -> (rows, paths)
TABLES: dict[str, str] = {
    "compile": "bench.compiler:run_compile",  # compile + verify CPU seconds
    "bytes": "bench.compiler:run_bytes",  # plan network bytes vs the lower bound and the reference
    "runtime": "bench.runtime:run",  # agents on one host vs numpy memcpy
    "agents": "bench.execute:run_agents",  # fresh and repeated executes on one host vs a warm memcpy
    "execute": "bench.execute:run_execute",  # fixed cost per execute, small plan
    "slices": "bench.slices:run",  # per-agent prepare at 1024 GPUs (CPU s) vs parsing the whole plan
    "ucx": "bench.ucx_raw:run",  # UcxPeer vs raw ucxx between two processes
    "fuse": "bench.fuse:run",  # FUSE view reads vs tmpfs reads
    "hosts": "bench.hosts:run",  # P2P vs centralized vs the bandwidth bound, emulated hosts
    "dataset": "bench.dataset:run",  # dataset FUSE view and DataLoader vs direct reads
    "deepspeed": "bench.deepspeed:run",  # DeepSpeed ZeRO DP and TP changes: tenplex reshard vs ds_to_universal (+ loads)
    "hf": "bench.hf:run_hf",  # safetensors read / consolidate vs DCP's HF reader and safetensors
    "dcp-zstd": "bench.hf:run_zstd",  # a ZStandard-compressed DCP checkpoint: load_dcp vs dcp.load
    "reshard": "bench.reshard:run",  # tenplex reshard (1 and 2 workers) vs cp -r of the same directory
    "cli": "bench.cli:run",  # wall time of tenplex commands vs python -c pass
    "dcp": "bench.dcp:run",  # tenplex reshard + DCP load vs DCP's load-time reshard
    "megatron": "bench.megatron_dist:run",  # torch_dist: tenplex reshard + Megatron load vs Megatron's load-time reshard
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small cases: a smoke test of every table")
    p.add_argument("--only", default="", help=f"comma-separated tables among: {', '.join(TABLES)}")
    p.add_argument("--skip", default="", help="comma-separated tables not to run")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results directory")
    p.add_argument("--list", action="store_true", help="print the tables and exit")
    args = p.parse_args(argv)
    for option in ("only", "skip"):
        names = [n for n in getattr(args, option).split(",") if n]
        unknown = [n for n in names if n not in TABLES]
        if unknown:
            p.error(f"--{option}: unknown table {', '.join(unknown)} (tables: {', '.join(TABLES)})")
        setattr(args, option, names)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.list:
        print("\n".join(TABLES))
        return 0
    info = report.machine_info()
    failed = 0
    for name in args.only or [n for n in TABLES if n not in args.skip]:
        module, function = TABLES[name].split(":")
        print(f"== {name} ({module})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        rows, paths = getattr(importlib.import_module(module), function)(args.quick, args.timeout, args.out, info)
        shown = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths]
        print(f"wrote {', '.join(shown)} ({time.perf_counter() - start:.0f} s)", flush=True)
        failed |= _verdict(rows)
    return failed


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
