"""Convergence under reconfiguration: a static run vs an elastic run of the example GPT.

    python experiments/convergence.py [--steps 30] [--out experiments/results]

Static: W=4 (tp 2, dp 2) for S steps (`--small`: W=2, tp 2, and 2 -> 1 -> 2 processes).
Elastic, through the controller: W=4 (tp 2, dp 2) -> at S/3 W=2 (tp 1, dp 2) -> at 2S/3 W=4
(tp 1, pp 2, dp 2), so tp, dp and pp all change. Both log
{step, loss, samples}; the script reports the max |loss difference| per step (absolute and
relative), whether every step read the same global samples in the same order, and each
reconfiguration's phases with their share of the elastic run's wall time. Writes
`convergence.png` (both loss curves and the difference) and `convergence.json` into --out.
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

from demo.convergence import FULL, SMALL, compare  # noqa: E402


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in result["static"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    first = result["static"][0]
    sizes = " -> ".join([str(first["W"])] + [str(r["dst"]["tp"] * r["dst"]["dp"] * r["dst"]["pp"]) for r in result["reconfigurations"]])
    top.plot(steps, [r["loss"] for r in result["static"]], label=f"static W={first['W']} (tp{first['tp']}, dp{first['dp']})", lw=2)
    top.plot(steps, [r["loss"] for r in result["elastic"]], "--", label=f"elastic W {sizes} (tenplex)", lw=1.5)
    for rec in result["reconfigurations"]:
        top.axvline(rec["step"] - 0.5, color="grey", ls=":")
        top.text(rec["step"] - 0.4, top.get_ylim()[1], f"tp{rec['dst']['tp']} pp{rec['dst']['pp']} dp{rec['dst']['dp']}", va="top", fontsize=8)
    top.set_ylabel("loss (global batch mean)")
    top.legend()
    bottom.plot(steps, [abs(x["loss"] - y["loss"]) for x, y in zip(result["static"], result["elastic"])], "o-", ms=3)
    bottom.set_ylabel("|difference|")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--small", action="store_true", help="2 -> 1 -> 2 processes instead of 4 -> 2 -> 4")
    parser.add_argument("--program-args", nargs=argparse.REMAINDER, default=[], help="extra args for the example")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tenplex-convergence-"))
    try:
        result = compare(work, args.steps, args.program_args, SMALL if args.small else FULL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "convergence.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "convergence.png")
    print(f"max |loss diff| {result['max_abs_loss_diff']:.3g} (relative {result['max_rel_loss_diff']:.3g}); "
          f"same samples every step: {result['same_samples_every_step']}; "
          f"phases {json.dumps({k: round(v, 2) for k, v in result['phase_seconds'].items()})} of "
          f"{result['elastic_total_seconds']:.1f}s")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
