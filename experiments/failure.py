"""Failure recovery through the controller: surviving DP replicas vs restart from the last checkpoint.

    python experiments/failure.py [--steps 40] [--change-at 10] [--fail-at 30] [--out experiments/results]

Three runs of the example GPT (`examples/elastic_gpt.py`, hidden 128 unless --program-args say
otherwise), 4 processes, tp 1 x dp 4 until --change-at, then tp 2 x dp 2 (a reconfiguration,
which leaves a checkpoint: its resharded state):
- `none`: no failure (the reference losses and time);
- `replicas`: rank 3 crashes for real at --fail-at (SIGKILL, no save); the survivors save what
  they hold and the job continues on 2 processes (tp 2, dp 1), its state rebuilt from the
  surviving dp replica (ranks 0 and 1 hold both tensor-parallel halves), no step lost;
- `checkpoint`: the same crash, `recovery: checkpoint` — the job restarts on 2 processes from its
  last checkpoint (the state at --change-at) and re-runs the lost steps.

Reports each run's wall time to --steps, the recovery's phases, the steps lost, and the max loss
difference of both failure runs against `none` (the same global batch and sample order, so they
must match up to float reduction order). Writes `failure.json` and `failure.png` into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.convergence import EXAMPLE, metrics  # noqa: E402
from tenplex.elastic.controller import Controller  # noqa: E402
from tenplex.elastic.job import parse_job  # noqa: E402

POLICIES = ("none", "replicas", "checkpoint")


def run(work: Path, policy: str, args: argparse.Namespace) -> dict:
    schedule = [{"at_step": args.change_at, "devices": 4, "tp": 2}]
    if policy != "none":
        schedule.append({"at_step": args.fail_at, "fail": [3], "devices": 2, "tp": 2})
    doc = {"program": str(EXAMPLE), "args": ["--steps", str(args.steps), *args.program_args], "devices": 4,
           "schedule": schedule, "recovery": "checkpoint" if policy == "checkpoint" else "replicas"}  # fmt: skip
    Controller(parse_job(doc), work / policy, out=print).run()  # its phase lines, as the run goes
    report = json.loads((work / policy / "report.json").read_text())
    records = metrics(work / policy)
    last = {r["step"]: r for r in records}  # a re-run step counts once, its last run
    return {"total_seconds": report["total_seconds"], "reconfigurations": report["reconfigurations"],
            "losses": [last[s]["loss"] for s in sorted(last)],
            "timeline": [(r["time"] - records[0]["time"], r["step"]) for r in records]}  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in POLICIES:
        t, s = zip(*result[policy]["timeline"])
        ax.plot(t, s, ".-", ms=3, label=f"{policy}: {result[policy]['total_seconds']:.1f} s")
    ax.axhline(result["fail_at"], color="grey", ls=":")
    ax.axhline(result["change_at"], color="grey", ls="--", lw=0.8)
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("global step done")
    ax.set_title(f"rank 3 of 4 crashes at step {result['fail_at']}; the job continues on 2")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--change-at", type=int, default=10)
    parser.add_argument("--fail-at", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--program-args", nargs=argparse.REMAINDER, default=["--hidden", "128"], help="args for the example")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tenplex-failure-"))
    try:
        result = {p: run(work, p, args) for p in POLICIES}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result |= {"steps": args.steps, "change_at": args.change_at, "fail_at": args.fail_at}
    base = result["none"]["losses"]
    for policy in POLICIES[1:]:
        r = result[policy]
        r["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(base, r["losses"]))
        rec = r["reconfigurations"][-1]
        r["recovery_seconds"] = sum(rec["phases"].values())
        print(f"{policy}: {r['total_seconds']:.1f}s to step {args.steps} (no failure {result['none']['total_seconds']:.1f}s); "
              f"recovery {r['recovery_seconds']:.1f}s {json.dumps({k: round(v, 2) for k, v in rec['phases'].items()})}, "
              f"from {rec['recovered_from']}, {rec['lost_steps']} steps lost; max |loss diff| {r['max_abs_loss_diff']:.3g}")  # fmt: skip
    (out / "failure.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "failure.png")
    return result


if __name__ == "__main__":
    main()
