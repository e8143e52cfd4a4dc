"""A static run vs an elastic run of the example GPT through the controller: the evidence that a
reconfiguration does not change training (`experiments/convergence.py`, `make demo`).

`compare(work, steps, extra, scenario, out, program, state)` runs a program (default the example,
`examples/elastic_gpt.py`; its state in the store, or `state="files"`) once statically on the scenario's first layout and once through `Controller` with the
scenario's changes (resource changes and injected failures at fractions of the steps), each
controller line going to `out` labelled with its run (`static run: ...`, `elastic run: ...`), and
returns the per-step losses of both, the max absolute and relative difference, whether every
step read the same global samples in the same order, and each reconfiguration's phases.
`FULL` and `SMALL` change tp and dp at steps/3 and 2·steps/3 (on 4 and 2 processes); `DEMO`
goes through tp, pp and dp on 2 processes and ends with a crash recovered from a dp replica.

Raises: ElasticError when the example program is not there (an installed package without the
repository) or the two runs logged different steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tenplex.elastic.controller import Controller
from tenplex.elastic.errors import ElasticError
from tenplex.elastic.job import parse_job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "elastic_gpt.py"


def metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@attrs.frozen
class Scenario:
    """The first generation's devices and layout table, and the changes at fractions of the run."""

    devices: int
    table: dict[str, list[int]]
    changes: tuple[tuple[float, dict[str, Any]], ...]

    def schedule(self, steps: int) -> list[dict[str, Any]]:
        return [{"at_step": max(1, round(f * steps)), **event} for f, event in self.changes]


FULL = Scenario(4, {"4": [2, 1, 2]}, ((1 / 3, {"devices": 2, "tp": 1}), (2 / 3, {"devices": 4, "pp": 2})))
SMALL = Scenario(2, {"2": [2, 1, 1]}, ((1 / 3, {"devices": 1}), (2 / 3, {"devices": 2, "tp": 1})))  # tests
DEMO = Scenario(2, {"2": [2, 1, 1]}, ((0.2, {"devices": 1}), (0.4, {"devices": 2, "pp": 2}), (0.6, {"devices": 2, "tp": 1}),
                                      (0.8, {"fail": [1]})))  # fmt: skip


def compare(work: Path, steps: int, extra: list[str], scenario: Scenario = FULL, out: Callable[[str], None] = print,
            program: Path = EXAMPLE, state: str = "store", hosts: int = 0, lose: tuple[int, int] | None = None) -> dict:  # fmt: skip
    if not program.is_file():
        raise ElasticError(f"{program}: the program is missing (run from the repository)")
    args = ["--steps", str(steps), *extra]
    base = {"program": str(program), "args": args, "devices": scenario.devices, "parallel": scenario.table, "state": state}
    static = parse_job(base)
    elastic = parse_job({**base, "schedule": scenario.schedule(steps), **({"gpus_per_host": 1} if hosts else {})})
    Controller(static, work / "static", out=lambda line: out(f"static run: {line}")).run()
    label = lambda line: out(f"elastic run: {line}")  # noqa: E731
    recs = _across(elastic, work / "elastic", label, hosts, lose) if hosts else Controller(elastic, work / "elastic", out=label).run()
    a = metrics(work / "static")
    b = sorted({r["step"]: r for r in metrics(work / "elastic")}.values(), key=lambda r: r["step"])  # steps re-run: the last
    if [r["step"] for r in a] != [r["step"] for r in b]:
        raise ElasticError(f"the runs logged different steps: {len(a)} vs {len(b)}")
    diffs = [abs(x["loss"] - y["loss"]) for x, y in zip(a, b)]
    rel = [d / abs(x["loss"]) for d, x in zip(diffs, a)]
    report = json.loads((work / "elastic" / "report.json").read_text())
    phase_total = {k: sum(r.phases.get(k, 0.0) for r in recs) for k in dict.fromkeys(k for r in recs for k in r.phases)}
    return {
        "steps": steps, "static": [_record(r) for r in a], "elastic": [_record(r) for r in b],
        "max_abs_loss_diff": max(diffs), "max_rel_loss_diff": max(rel),
        "same_samples_every_step": [r["samples"] for r in a] == [r["samples"] for r in b],
        "reconfigurations": [r.to_json() for r in recs], "elastic_total_seconds": report["total_seconds"],
        "phase_seconds": phase_total,
        "phase_share_of_total": {k: v / report["total_seconds"] for k, v in phase_total.items()},
    }  # fmt: skip


def _across(job: Any, job_dir: Path, out: Callable[[str], None], hosts: int, lose: tuple[int, int] | None) -> list:
    """The elastic run on `hosts` emulated hosts (one process each); `lose` = (host, step): every
    process of that host is killed once the job logged that step (a host lost mid-generation)."""
    import threading

    from tenplex.elastic.cluster import Cluster
    from tenplex.runtime.netns import EmulatedHosts

    with EmulatedHosts(hosts, rate="1gbit") as emulated:
        controller = Controller(job, job_dir, out=out, cluster=Cluster.emulated(emulated, job_dir))
        done: list = []

        def run() -> None:
            try:
                done.append(controller.run())
            except BaseException as e:  # noqa: BLE001 (raised again below, in the caller's thread)
                done.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        while lose is not None and thread.is_alive():
            logged = (job_dir / "metrics.jsonl").exists() and any(r["step"] >= lose[1] for r in metrics(job_dir))
            if logged:
                out(f"host h{lose[0]} lost: {emulated.kill(lose[0])} processes killed")
                break
            thread.join(0.1)
        thread.join()
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _record(r: dict) -> dict:
    return {"step": r["step"], "loss": r["loss"], "W": r["W"], "tp": r["tp"], "dp": r["dp"], "pp": r.get("pp", 1)}
