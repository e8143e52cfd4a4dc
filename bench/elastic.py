"""`python -m bench.elastic [--quick] [--repeats R]`: a reconfiguration's phases with the state in
the agents' stores vs in DCP files, the same job, side by side.

The example GPT (`examples/elastic_gpt.py`, --hidden 512 --layers 4: 12.9 M parameters, 155 MB
of model and AdamW state; --quick: hidden 128) runs through the controller on 2 processes as tp 2,
goes to 1 process at step 2 and to 2 pipeline stages at step 4, once with `state: store` and once
with `state: files`, R times each, alternating (store, files, store, ...) so that both see the
same machine load. Per reconfiguration and phase, min / median / max seconds over the repeats:

- stop: the request -> every rank agreed to stop; save: the ranks' DCP save (into the store, or
  files); exit: process teardown;
- plan (store): read the saved PTC from the store, build the dst, compile and verify;
  move (store): execute the plan in the agent and commit; reshard (files): read the files,
  compile, execute, write the new files (the files path has no separate plan/move);
- restart: launch -> the first step logged (the load included); load: the ranks' DCP load
  (from the store, or files), measured inside the program.

Results: bench/results/elastic.{md,json} (elastic-quick.* with --quick).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from tenplex.elastic.controller import Controller  # noqa: E402
from tenplex.elastic.job import parse_job  # noqa: E402

EXAMPLE = ROOT / "examples" / "elastic_gpt.py"
PHASES = ["stop", "save", "exit", "plan", "move", "reshard", "restart", "load"]


def one_run(work: Path, state: str, quick: bool) -> list[dict]:
    """The reconfigurations of one elastic run: {step, phases (seconds), bytes_moved}."""
    hidden = "128" if quick else "512"
    job = parse_job({"program": str(EXAMPLE), "devices": 2, "parallel": {"2": [2, 1, 1]}, "state": state, "timeout": 600,
                     "args": ["--steps", "6", "--samples", "64", "--layers", "4", "--hidden", hidden, "--heads", "8"],
                     "schedule": [{"at_step": 2, "devices": 1}, {"at_step": 4, "devices": 2, "pp": 2}]})  # fmt: skip
    recs = Controller(job, work, out=lambda _: None).run()
    loads = {r["generation"]: r["load_seconds"] for r in map(json.loads, (work / "metrics.jsonl").read_text().splitlines())
             if "load_seconds" in r}  # fmt: skip
    return [{"step": r.step, "phases": {**r.phases, "load": loads.get(i + 1, float("nan"))}, "bytes_moved": r.bytes_moved}
            for i, r in enumerate(recs)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="hidden 128 instead of 512")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    runs: dict[str, list[list[dict]]] = {"store": [], "files": []}
    with tempfile.TemporaryDirectory(prefix="tenplex-bench-elastic-") as tmp:
        for i in range(args.repeats):
            for state in ("store", "files"):
                print(f"run {i + 1}/{args.repeats}: state {state}", file=sys.stderr, flush=True)
                runs[state].append(one_run(Path(tmp) / f"{state}-{i}", state, args.quick))
    rows = []
    for k, step in enumerate(r["step"] for r in runs["store"][0]):
        for phase in PHASES:
            cells = {}
            for state in ("store", "files"):
                got = [run[k]["phases"][phase] for run in runs[state] if phase in run[k]["phases"]]
                cells[state] = (min(got), statistics.median(got), max(got)) if got else None
            if cells["store"] is None and cells["files"] is None:
                continue
            ratio = cells["store"][1] / cells["files"][1] if cells["store"] and cells["files"] and cells["files"][1] else None
            rows.append({"reconfiguration": f"step {step}", "phase": phase, **cells, "store/files": ratio})
    moved = {state: runs[state][0][k]["bytes_moved"] for state in runs for k in range(len(runs[state][0]))}
    headers = ["reconfiguration", "phase", "store s (min/med/max)", "files s (min/med/max)", "store / files (median)"]
    fmt = lambda c: "-" if c is None else f"{c[0]:.3f} / {c[1]:.3f} / {c[2]:.3f}"  # noqa: E731
    table = [[r["reconfiguration"], r["phase"], fmt(r["store"]), fmt(r["files"]),
              "-" if r["store/files"] is None else f"{r['store/files']:.2f}x"] for r in rows]  # fmt: skip
    text = report.text_table(headers, table)
    print(text)
    name = "elastic-quick" if args.quick else "elastic"
    args.out.mkdir(parents=True, exist_ok=True)
    info = report.machine_info()
    (args.out / f"{name}.json").write_text(json.dumps({"machine": info, "repeats": args.repeats, "rows": rows,
                                                       "bytes_moved": moved, "runs": runs}, indent=1))  # fmt: skip
    (args.out / f"{name}.md").write_text(f"# Elastic reconfiguration: store vs files\n\n`python -m bench.elastic"
                                         f"{' --quick' if args.quick else ''} --repeats {args.repeats}` on {info}\n\n"
                                         f"```\n{text}\n```\n")  # fmt: skip
    print(f"wrote {args.out / (name + '.md')}, {args.out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
