"""A static run vs an elastic run of the example GPT through the controller: the evidence that a
reconfiguration does not change training (`experiments/convergence.py`, `make demo`).

`compare(work, steps, extra, sizes)` runs the example program (`examples/elastic_gpt.py`) once
statically and once through `Controller` with two changes of (W, tp) at steps/3 and 2·steps/3,
and returns the per-step losses of both, the max absolute and relative difference, whether every
step read the same global samples in the same order, and each reconfiguration's phases.

Raises: ElasticError when the example program is not there (an installed package without the
repository) or the two runs logged different steps.
"""

from __future__ import annotations

import json
from pathlib import Path

from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import parse_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_gpt.py"


def metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


# (devices, tp) of the first generation and of the two changes
FULL = ((4, 2), (2, 1), (4, 1))
SMALL = ((2, 2), (1, 1), (2, 1))  # the same shape of change on at most 2 processes (tests)


def compare(work: Path, steps: int, extra: list[str], sizes: tuple = FULL) -> dict:
    if not EXAMPLE.is_file():
        raise ElasticError(f"{EXAMPLE}: the example program is missing (run from the repository)")
    args = ["--steps", str(steps), *extra]
    third = max(1, steps // 3)
    (w0, tp0), (w1, tp1), (w2, tp2) = sizes
    table = {str(w0): [tp0, 1, w0 // tp0]}
    static = parse_job({"program": str(EXAMPLE), "args": args, "devices": w0, "parallel": table})
    elastic = parse_job({"program": str(EXAMPLE), "args": args, "devices": w0, "parallel": table,
                         "schedule": [{"at_step": third, "devices": w1, "tp": tp1},
                                      {"at_step": 2 * third, "devices": w2, "tp": tp2}]})  # fmt: skip
    Controller(static, work / "static").run()
    recs = Controller(elastic, work / "elastic").run()
    a, b = metrics(work / "static"), metrics(work / "elastic")
    if [r["step"] for r in a] != [r["step"] for r in b]:
        raise ElasticError(f"the runs logged different steps: {len(a)} vs {len(b)}")
    diffs = [abs(x["loss"] - y["loss"]) for x, y in zip(a, b)]
    rel = [d / abs(x["loss"]) for d, x in zip(diffs, a)]
    report = json.loads((work / "elastic" / "report.json").read_text())
    phase_total = {k: sum(r.phases[k] for r in recs) for k in recs[0].phases} if recs else {}
    return {
        "steps": steps, "static": [{k: r[k] for k in ("step", "loss", "W", "tp", "dp")} for r in a],
        "elastic": [{k: r[k] for k in ("step", "loss", "W", "tp", "dp")} for r in b],
        "max_abs_loss_diff": max(diffs), "max_rel_loss_diff": max(rel),
        "same_samples_every_step": [r["samples"] for r in a] == [r["samples"] for r in b],
        "reconfigurations": [r.to_json() for r in recs], "elastic_total_seconds": report["total_seconds"],
        "phase_seconds": phase_total,
        "phase_share_of_total": {k: v / report["total_seconds"] for k, v in phase_total.items()},
    }  # fmt: skip
