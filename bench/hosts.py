"""`python -m bench --only hosts`: peer-to-peer vs centralized resharding on emulated hosts.

4 emulated hosts (network namespaces behind a bridge, every link shaped to 1 Gbit/s with tbf),
one `tenplex agent` per host (UCX over TCP between them), 2 devices per host, a GPT-style model
with bf16 weights and fp32 Adam state. Per case, in one fresh process: the peer-to-peer plan
(`Runtime.execute`) and the centralized baseline (`compile_central` + `Runtime.execute_central`:
gather on h0, scatter from it, the paper's Tenplex-Central) run on the same agents from the same
src state; both dst states are fetched and checked byte for byte against the source oracle.
Reported: seconds of each, central / P2P (goal ≥ 2.5×), and P2P / the plan's bandwidth bound
(goal ≤ 1.3×). The bound is `Stats.lower_bound_seconds` with the link rate as network bandwidth:
the busiest host's ingress, or all bytes over all NICs. Needs root and iproute2; skipped with the
reason otherwise. Results: bench/results/hosts.{md,json} (hosts-quick.* with --quick).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HOSTS = 4
RATE, RATE_BYTES = "1gbit", 125e6  # tbf rate and the same in bytes/s
GOAL_SPEEDUP, GOAL_BOUND = 2.5, 1.3
MODEL = "gpt-tiny:layers=4,hidden=768,heads=12,ffn=3072,vocab=8192"
QUICK_MODEL = "gpt-tiny:layers=4,hidden=256,heads=8,ffn=1024,vocab=4096"
MOVES = (  # the paper's DP/PP/TP changes, scaling 4 <-> 8 devices on 2 <-> 4 hosts
    ("DP 1->2 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp2,pp2,dp2@4x2"),
    ("PP 2->4 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp2,pp4,dp1@4x2"),
    ("TP 2->4 (4->8 GPUs)", "tp2,pp2,dp1@2x2", "tp4,pp2,dp1@4x2"),
    ("PP 4->2 (8->4 GPUs)", "tp2,pp4,dp1@4x2", "tp2,pp2,dp1@2x2"),
)
HEADERS = ["case", "status", "state", "P2P network", "central network", "bound s", "P2P s", "central s",
           "central/P2P", "P2P/bound", "RSS growth/dst", "checked"]  # fmt: skip


def cases(quick: bool) -> list[tuple[str, str, str]]:
    model = QUICK_MODEL if quick else MODEL
    moves = MOVES[:1] if quick else MOVES
    return [(name, f"{model},{a}", f"{model},{b}") for name, a, b in moves]


# ---- one case, in a fresh process ------------------------------------------------------
def _shaped(ptc: Any) -> Any:
    """`ptc` with the emulated link rate as its network bandwidth (for the plan's bound)."""
    import attrs

    from tenplex.ir.ptc import PTC
    from tenplex.ir.topology import Topology

    topo = Topology(ptc.topology.devices, attrs.evolve(ptc.topology.links, network=RATE_BYTES))
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, ptc.allocation, topo)


def _checker(src: Any, tensors: dict) -> Any:
    from tenplex.ir.errors import ExecutionError
    from tenplex.runtime.arrays import materialize

    def check(placed: Any, got: dict) -> int:
        n = 0
        for s in placed.subtensors:
            want = materialize(placed, tensors, s)
            for d in placed.devices_of_subtensor(s.id):
                if (s.id, d) not in got or got[(s.id, d)].tobytes() != want.tobytes():
                    raise ExecutionError(f"sub-tensor {s.id!r} on device {d} differs from the oracle")
                n += want.nbytes
        return n

    return check


def _rss_growth(before: dict, after: dict, placed: Any, plan: Any) -> dict[str, dict]:
    """Per host: peak RSS growth during the execution vs the dst bytes the host ends with."""
    host_of = placed.topology.host_of
    dst_bytes: dict[str, int] = {}
    for st in placed.subtensors:
        n = _nbytes(placed, st)
        for d in placed.devices_of_subtensor(st.id):
            dst_bytes[host_of(d)] = dst_bytes.get(host_of(d), 0) + n
    out = {}
    for h, b in before.items():
        grow, have = after[h]["peak"] - b["rss"], dst_bytes.get(h, 0)
        out[h] = {"growth": grow, "dst_bytes": have, "ratio": grow / have if have else 0.0}
    return out


def _nbytes(ptc: Any, st: Any) -> int:
    import math

    from tenplex.runtime.arrays import np_dtype

    return math.prod(st.shape) * np_dtype(ptc.tensor_map[st.tensor].dtype).itemsize


def measure(src_spec: str, dst_spec: str) -> dict[str, Any]:
    from tenplex.compiler import compile_plan
    from tenplex.compiler.central import compile_central
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.arrays import arange_tensors, materialize_all
    from tenplex.runtime.fleet import AgentFleet
    from tenplex.runtime.netns import EmulatedHosts, netns_unavailable_reason
    from tenplex.runtime.runtime import Runtime

    reason = netns_unavailable_reason()
    if reason is not None:
        return {"skipped": reason}
    src, dst = _shaped(ptc_from_spec(src_spec)), _shaped(ptc_from_spec(dst_spec))
    plan = compile_plan(src, dst)
    central = compile_central(src, dst, src.topology.hosts[0])
    tensors = arange_tensors(src)
    values = {(p.id, d): {n: v.value if v.value is not None else f"{n}@{p.id}" for n, v in p.values}
              for p in src.partitions for d in src.allocation.devices_of(p.id)}  # fmt: skip
    check = _checker(src, tensors)
    names = list(src.topology.union(dst.topology).hosts)
    with EmulatedHosts(len(names), rate=RATE) as hosts, AgentFleet(names, hosts=hosts, timeout=120.0) as fleet, \
            Runtime.connect(fleet.controls, round_timeout=600.0) as rt:  # fmt: skip
        arrays = materialize_all(src, tensors)
        rt.load("bench", "src", src, arrays, values)
        state_bytes = sum(a.nbytes for a in arrays.values())
        del arrays
        before = rt.memory(reset_peak=True)
        t0 = time.perf_counter()
        rt.execute(plan, src, dst, "bench", "src", "p2p")
        p2p_s, p2p_phases = time.perf_counter() - t0, dict(rt.phases)
        rss = _rss_growth(before, rt.memory(), dst.with_allocation(plan.allocation), plan)
        checked = check(dst.with_allocation(plan.allocation), rt.fetch("bench", "p2p")[0])
        rt.drop("bench", "p2p")
        t0 = time.perf_counter()
        rt.execute_central(central, src, dst, "bench", "src", "central")
        central_s, central_phases = time.perf_counter() - t0, dict(rt.phases)
        checked += check(dst.with_allocation(central.scatter.allocation), rt.fetch("bench", "central")[0])
    bound = plan.stats.lower_bound_seconds
    return {
        "hosts": len(names), "rate": RATE, "state_bytes": state_bytes, "p2p_network_bytes": plan.stats.network_bytes,
        "lower_bound_bytes": plan.stats.network_lower_bound_bytes, "central_network_bytes": central.network_bytes,
        "bound_s": bound, "p2p_s": p2p_s, "central_s": central_s, "speedup": central_s / p2p_s,
        "p2p_over_bound": p2p_s / bound if bound else None, "p2p_phases": p2p_phases,
        "central_phases": central_phases, "rounds": plan.stats.rounds, "messages": len(plan.messages),
        "rss": rss, "rss_ratio": max(r["ratio"] for r in rss.values()),
        "budget_bytes": plan.options.memory_budget_bytes, "checked_bytes": checked, "equal": plan.stats.network_bytes == plan.stats.network_lower_bound_bytes,
    }  # fmt: skip


# ---- the driver --------------------------------------------------------------------------
def row_cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    if r["status"] != "ok" or "skipped" in r:
        why = r.get("skipped") or r.get("error", "")
        return [r["name"], "skipped" if "skipped" in r else r["status"], *[""] * (len(HEADERS) - 3), why[:80]]
    return [r["name"], "ok", fmt_bytes(r["state_bytes"]), fmt_bytes(r["p2p_network_bytes"]),
            fmt_bytes(r["central_network_bytes"]), f"{r['bound_s']:.2f}", f"{r['p2p_s']:.2f}", f"{r['central_s']:.2f}",
            f"{r['speedup']:.2f}x", f"{r['p2p_over_bound']:.2f}x", f"{r['rss_ratio']:.2f}x",
            fmt_bytes(r["checked_bytes"])]  # fmt: skip


def markdown(info: dict[str, Any], rows: list[dict]) -> str:
    from bench.report import md_table

    return "\n".join([
        "# Emulated hosts: peer-to-peer vs centralized (`python -m bench --only hosts`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        f"{HOSTS} emulated hosts (network namespaces, bridge, tbf {RATE} on every link), one `tenplex agent` each, "
        "UCX over TCP between them, 2 devices per host. P2P: the compiled plan. Central: gather everything on h0, "
        "scatter from it (the paper's Tenplex-Central). Seconds of `Runtime.execute` (prepare, rounds, commit). "
        f"Goals: central/P2P ≥ {GOAL_SPEEDUP}×, P2P/bound ≤ {GOAL_BOUND}×. 'checked': dst bytes of both runs "
        "compared with the source oracle. RSS growth/dst: the largest, over hosts, of the agent's peak "
        "resident bytes during the P2P execution minus its resident bytes before, over the dst bytes "
        "that host ends with (goal ≤ 1.25 + the message budget).", "",
        md_table(HEADERS, [row_cells(r) for r in rows]), "",
        "\n".join(f"- {r['name']}: `{r['src']}` → `{r['dst']}`" for r in rows), "",
    ])  # fmt: skip


def run(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import text_table
    from bench.runner import run_json

    rows = []
    for name, src, dst in cases(quick):
        rows.append(run_json(["bench.hosts", src, dst], {"name": name, "src": src, "dst": dst}, timeout_s))
        r = rows[-1]
        print(f"  {r['status']:7} {r.get('wall_s', 0):7.1f} s  {r['name']}", file=sys.stderr, flush=True)
    print(f"\nEmulated hosts ({HOSTS} x {RATE}): P2P vs central (goals >= {GOAL_SPEEDUP}x, <= {GOAL_BOUND}x bound)")
    print(text_table(HEADERS, [row_cells(r) for r in rows]) + "\n", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "hosts-quick" if quick else "hosts"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps({"machine": info, "hosts": rows}, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(markdown(info, rows))
    return rows, paths


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:3])))
