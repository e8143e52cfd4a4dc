"""Trace-driven elastic run, SIMULATED from the cost model (paper §7.4 "dynamic resources", Fig. 9).

No GPU runs here. A GPU-count trace [(time_s, gpus), ...] drives three policies for one job and
we compute, for each, when it reaches a fixed number of training steps:

- tenplex: at every change re-pick (tp, pp, dp) with `parallelizer.choose` for every device count
  n <= gpus and keep the fastest predicted step (normally n = gpus); the job waits when nothing fits;
- dp-only: tp and pp stay at the initial choice; dp = the largest valid dp <= gpus // (tp·pp)
  (valid: `check_valid` and fits memory), the other GPUs idle; dp = 0 or no fit -> the job waits;
- static: the initial layout only; it cannot grow and it waits while fewer GPUs than it needs remain.

All three start from the same layout (tenplex's pick for the first count). Between events a
running job makes 1 / step_seconds steps per second (`Choice.step_seconds`, the cost model).
A layout change costs (no progress meanwhile):

    plan.stats.lower_bound_seconds  (the real plan compiled by `tenplex.compiler.compile_plan`
                                     between the old and new specs, with the topology's network
                                     link set to `network_bandwidth`, as `demo.hosts.shaped` does)
  + restart_s                       (stop, save, process exit, relaunch, first step).

A stopped job that resumes pays the move from its last running layout plus restart_s (static:
restart_s only, its state is where it was). Jobs use the lowest-numbered devices (hosts h0, h1,
...); a shrink removes the highest ones. A change that arrives while a reconfiguration is still
in progress starts after it. Progress since the last checkpoint is never lost (optimistic for all).

Usage: python experiments/trace.py [--trace FILE] [--model gpt-6.7b] [--steps N] [--restart-s S]
FILE is a JSON list of [time_s, gpus] pairs (times increasing, the first at 0).
Writes experiments/results/trace.{json,png}.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from tenplex.compiler import compile_plan
from tenplex.elastic.parallelizer.choose import NoFitError, choose
from tenplex.elastic.parallelizer.cost import Hardware, Workload, check_valid, evaluate, parallel_config
from tenplex.frontends.presets import preset
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import Topology

GPUS_PER_HOST = 8
# Default trace, modelled on the paper's Fig. 9 (GPU counts changing every ~30 min for hours).
DEFAULT_TRACE: list[tuple[float, int]] = [(0, 16), (1800, 8), (3600, 32), (5400, 16), (7200, 12), (9000, 24)]
DEFAULT_STEPS = 1000
# docs/elastic.md measured restart phases (process exit + restart -> first step), mean of two
# reconfigurations of the CPU toy job: (2.69 + 5.56 + 1.25 + 9.45) / 2 = 9.5 s. Scaled x6 for a
# multi-host GPU job (CUDA/NCCL init, loading a 6.7B model), which puts restart + state move near
# the paper's measured 70-87 s per Tenplex reconfiguration (Fig. 12, GPT-3 XL, 8 <-> 16 GPUs).
MEASURED_RESTART_S = 9.5
RESTART_SCALE = 6.0
DEFAULT_RESTART_S = MEASURED_RESTART_S * RESTART_SCALE
POLICIES = ("tenplex", "dp-only", "static")


@attrs.frozen
class Layout:
    tp: int
    pp: int
    dp: int
    stages: tuple[int, ...]
    step_seconds: float

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        return f"tp{self.tp},pp{self.pp},dp{self.dp}"


@attrs.frozen
class Setup:
    model: str = "gpt-6.7b"
    gpus_per_host: int = GPUS_PER_HOST
    restart_s: float = DEFAULT_RESTART_S
    network_bandwidth: float = Hardware().network_bandwidth  # bytes/s, the cost model's
    memory_per_gpu: float = 80e9
    global_batch: int = 512
    micro_batch: int = 1


def _layout(c: Any) -> Layout:
    return Layout(c.tp, c.pp, c.dp, tuple(c.stage_layers), c.step_seconds)


@functools.cache
def tenplex_layout(setup: Setup, gpus: int) -> Layout | None:
    """The fastest `choose(n)` over n <= gpus, or None when nothing fits."""
    model, best = preset(setup.model), None
    for n in range(gpus, 0, -1):
        try:
            c = choose(n, model, setup.gpus_per_host, memory_per_gpu=setup.memory_per_gpu,
                       global_batch=setup.global_batch, micro_batch=setup.micro_batch)  # fmt: skip
        except NoFitError:
            continue
        if best is None or c.step_seconds < best.step_seconds:
            best = _layout(c.best)
    return best


@functools.cache
def dp_only_layout(setup: Setup, tp: int, pp: int, gpus: int) -> Layout | None:
    """tp, pp fixed; the largest valid, fitting dp <= gpus // (tp·pp), or None (the job waits)."""
    model = preset(setup.model)
    w = Workload(setup.global_batch, setup.micro_batch, model.max_position or 2048)
    for dp in range(gpus // (tp * pp), 0, -1):
        if check_valid(model, tp, pp, dp, setup.gpus_per_host, w) is None:
            c = evaluate(model, tp, pp, dp, setup.gpus_per_host, w, Hardware(), setup.memory_per_gpu)
            if c.fits:
                return _layout(c)
    return None


def spec(setup: Setup, lay: Layout) -> str:
    """The compact job spec of a layout on the lowest-numbered devices."""
    opts = f"tp{lay.tp},pp{lay.pp},dp{lay.dp}"
    if parallel_config(preset(setup.model), lay.tp, lay.pp, lay.dp).stage_layers is not None:
        opts += ",stages=" + "/".join(map(str, lay.stages))
    hosts = -(-lay.devices // setup.gpus_per_host)
    return f"{setup.model}:{opts}@{hosts}x{min(setup.gpus_per_host, lay.devices)}"


def _shaped(ptc: PTC, bandwidth: float) -> PTC:
    topo = Topology(ptc.topology.devices, attrs.evolve(ptc.topology.links, network=bandwidth))
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, ptc.allocation, topo)


@functools.cache
def move(setup: Setup, src: Layout, dst: Layout) -> tuple[float, int]:
    """(lower-bound seconds, network bytes) of the compiled plan src -> dst."""
    if src == dst:
        return 0.0, 0
    bw = setup.network_bandwidth
    plan = compile_plan(_shaped(ptc_from_spec(spec(setup, src)), bw), _shaped(ptc_from_spec(spec(setup, dst)), bw))
    return plan.stats.lower_bound_seconds, plan.stats.network_bytes


def _check_trace(trace: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    out = [(float(t), int(g)) for t, g in trace]
    if not out or out[0][0] != 0:
        raise ValueError("the trace must be a non-empty list of [time_s, gpus] starting at time 0")
    if any(b[0] <= a[0] for a, b in zip(out, out[1:])) or any(g < 0 for _, g in out):
        raise ValueError("trace times must increase and GPU counts be >= 0")
    return out


def simulate(setup: Setup, trace: Sequence[tuple[float, int]], steps: int, policy: str) -> dict[str, Any]:
    """One policy on the trace: time to `steps`, the (time, steps) curve and the reconfigurations."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    trace = _check_trace(trace)
    initial = tenplex_layout(setup, trace[0][1])
    if initial is None:
        raise ValueError(f"{setup.model} fits no layout on {trace[0][1]} GPUs")

    def pick(gpus: int) -> Layout | None:
        if policy == "tenplex":
            return tenplex_layout(setup, gpus)
        if policy == "dp-only":
            return dp_only_layout(setup, initial.tp, initial.pp, gpus)
        return initial if gpus >= initial.devices else None

    done, t, last_run = 0.0, 0.0, initial  # steps so far, time of `done`, last running layout
    active: Layout | None = initial
    curve, events, finish = [(0.0, 0.0)], [], None
    ends = [e[0] for e in trace[1:]] + [math.inf]
    for (t_event, gpus), t_end in zip(trace, ends):
        if t_event > 0:
            new = pick(gpus)
            if new != active:
                cost, nbytes = 0.0, 0
                if new is not None:
                    move_s, nbytes = (0.0, 0) if policy == "static" else move(setup, last_run, new)
                    cost = move_s + setup.restart_s
                start = max(t, t_event)
                curve.append((start, done))
                t = start + cost
                curve.append((t, done))
                events.append({"time_s": t_event, "gpus": gpus, "from": active and active.name,
                               "to": new and new.name, "move_s": cost - setup.restart_s if new else 0.0,
                               "network_bytes": nbytes, "cost_s": cost})  # fmt: skip
                active = new
                last_run = new or last_run
            else:
                events.append({"time_s": t_event, "gpus": gpus, "from": active and active.name,
                               "to": active and active.name, "move_s": 0.0, "network_bytes": 0, "cost_s": 0.0})  # fmt: skip
        start = max(t, t_event)
        if active is None or start >= t_end:  # waiting, or still reconfiguring at the next event
            continue
        curve.append((start, done))
        rate = 1.0 / active.step_seconds
        if done + rate * (t_end - start) >= steps:
            finish = start + (steps - done) / rate
            done = float(steps)
            curve.append((finish, done))
            break
        done += rate * (t_end - start)
        t = t_end
        curve.append((t, done))
    return {"policy": policy, "time_to_steps_s": finish, "initial": initial.name, "events": events,
            "curve": curve, "reconfiguration_s": sum(e["cost_s"] for e in events)}  # fmt: skip


def run(setup: Setup, trace: Sequence[tuple[float, int]], steps: int) -> dict[str, Any]:
    res = {p: simulate(setup, trace, steps, p) for p in POLICIES}
    tx, dx = res["tenplex"]["time_to_steps_s"], res["dp-only"]["time_to_steps_s"]
    return {
        "simulated": True,
        "note": "simulation from the parallelizer cost model and compiled-plan bandwidth bounds; no GPU run",
        "setup": attrs.asdict(setup), "trace": [list(e) for e in _check_trace(trace)], "steps": steps,
        "policies": res, "speedup_tenplex_over_dp_only": dx / tx if tx and dx else None,
    }  # fmt: skip


def _hours(s: float | None) -> str:
    return "never" if s is None else f"{s / 3600:.2f} h"


def table(out: dict[str, Any]) -> str:
    rows = ["| policy | time to {} steps | reconfigurations | paid (s) |".format(out["steps"]), "|---|---|---|---|"]
    for p, r in out["policies"].items():
        n = sum(1 for e in r["events"] if e["cost_s"] > 0)
        rows.append(f"| {p} | {_hours(r['time_to_steps_s'])} | {n} | {r['reconfiguration_s']:.0f} |")
    sp = out["speedup_tenplex_over_dp_only"]
    rows.append(f"\nspeed-up of tenplex over dp-only: {sp:.2f}x" if sp else "\nspeed-up: n/a (a policy never finished)")
    return "\n".join(rows)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    end = max((r["curve"][-1][0] for r in out["policies"].values()), default=0.0)
    for p, r in out["policies"].items():
        ts, ss = zip(*r["curve"])
        ax.plot([t / 3600 for t in ts], ss, label=f"{p} ({_hours(r['time_to_steps_s'])})")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("training steps")
    ax.axhline(out["steps"], color="grey", lw=0.5, ls=":")
    ax2 = ax.twinx()
    tr = out["trace"]
    xs = [t / 3600 for t, _ in tr] + [max(end, tr[-1][0]) / 3600]
    ax2.step(xs, [g for _, g in tr] + [tr[-1][1]], where="post", color="grey", ls="--", lw=1, label="GPUs")
    ax2.set_ylabel("GPUs available")
    ax2.set_ylim(0, max(g for _, g in tr) * 1.15)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title(f"{out['setup']['model']}: trace-driven elastic run (SIMULATED from the cost model)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="JSON list of [time_s, gpus]; default: a Fig. 9-like trace")
    ap.add_argument("--model", default="gpt-6.7b")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--restart-s", type=float, default=DEFAULT_RESTART_S)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = ap.parse_args(argv)
    trace = json.loads(a.trace.read_text()) if a.trace else DEFAULT_TRACE
    out = run(Setup(model=a.model, restart_s=a.restart_s), trace, a.steps)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "trace.json").write_text(json.dumps(out, indent=1))
    plot(out, a.out / "trace.png")
    print("SIMULATED (cost model + compiled-plan bounds, no GPUs)")
    for p, r in out["policies"].items():
        print(f"{p}: start {r['initial']}; " + "; ".join(
            f"t={e['time_s'] / 60:.0f}min {e['gpus']} GPUs -> {e['to'] or 'wait'} ({e['cost_s']:.0f}s)" for e in r["events"]))  # fmt: skip
    print(table(out))
    print(f"wrote {a.out / 'trace.json'} and {a.out / 'trace.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
