"""`python -m bench.replicas [--repeats R]`: what store replicas cost an elastic job across hosts.

3 emulated hosts (network namespaces, links shaped to 1 Gbit/s; needs root and iproute2), the
example GPT (hidden 256, 4 layers) as dp 3 on the 3 hosts, moved at step 2 into tp 2 on two of
them, with `store_replicas: 0` and `1` alternately (R runs each). With one replica the move also
copies each partition's state to the next host (the idle third one included), in the same plan.
Prints bytes moved and the plan and move seconds (min / median / max) of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tenplex.elastic.cluster import Cluster  # noqa: E402
from tenplex.elastic.controller import Controller  # noqa: E402
from tenplex.elastic.job import parse_job  # noqa: E402
from tenplex.runtime.netns import EmulatedHosts  # noqa: E402

ARGS = ["--steps", "4", "--samples", "48", "--global-batch", "12", "--micro-batch", "2", "--layers", "4",
        "--hidden", "256", "--heads", "8"]  # fmt: skip


def one_run(replicas: int) -> tuple[int, float, float]:
    job = parse_job({"program": str(ROOT / "examples" / "elastic_gpt.py"), "args": ARGS, "devices": 3, "timeout": 300,
                     "parallel": {"2": [2, 1, 1], "3": [1, 1, 3]}, "gpus_per_host": 1, "store_replicas": replicas,
                     "schedule": [{"at_step": 2, "devices": 2}]})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, EmulatedHosts(3, rate="1gbit") as hosts:
        job_dir = Path(tmp) / "job"
        [rec] = Controller(job, job_dir, out=lambda _: None, cluster=Cluster.emulated(hosts, job_dir)).run()
    return rec.bytes_moved, rec.phases["plan"], rec.phases["move"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    runs: dict[int, list[tuple[int, float, float]]] = {0: [], 1: []}
    for i in range(args.repeats):
        for replicas in (0, 1):
            print(f"run {i + 1}/{args.repeats}: store_replicas {replicas}", file=sys.stderr, flush=True)
            runs[replicas].append(one_run(replicas))
    stat = lambda xs: f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"  # noqa: E731
    for replicas, got in runs.items():
        print(f"store_replicas {replicas}: {got[0][0] / 1e6:.1f} MB moved; plan s {stat([g[1] for g in got])}; "
              f"move s {stat([g[2] for g in got])} (min / median / max of {len(got)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
