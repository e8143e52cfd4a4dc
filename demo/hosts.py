"""Peer-to-peer vs centralized resharding on emulated hosts (`make demo`'s last part, `bench/hosts.py`).

`compare(rt, src, dst)` runs, on the agents of `rt`, the compiled plan and the centralized
baseline (`compile_central`: gather on the first host, scatter from it) from the same src state,
checks both dst states byte for byte against the source oracle, and returns the timings, the
bytes, the plan's bandwidth bound and each agent's peak memory growth. Both plans are compiled and
sliced per host (`Runtime.stage`) before the clock starts: a timing is the execute's own work.
`run_hosts(model, moves)` builds the emulated cluster (network namespaces, tbf-shaped links, one
`tenplex agent` per host, UCX over TCP) and compares each move; it returns the reason instead
when the machine cannot (no root, no iproute2, no ucxx).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import attrs

from tenplex.compiler import compile_plan
from tenplex.compiler.central import compile_central
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import Topology
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all, np_dtype
from tenplex.runtime.oracle import check_state

RATE, RATE_BYTES = "1gbit", 125e6  # tbf rate of every emulated link, and the same in bytes/s


def shaped(ptc: PTC, rate_bytes: float = RATE_BYTES) -> PTC:
    """`ptc` with `rate_bytes` as its network bandwidth (so the plan's bound is in real seconds)."""
    topo = Topology(ptc.topology.devices, attrs.evolve(ptc.topology.links, network=rate_bytes))
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, ptc.allocation, topo)


def _dst_bytes(placed: PTC) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in placed.subtensors:
        n = math.prod(st.shape) * np_dtype(placed.tensor_map[st.tensor].dtype).itemsize
        for d in placed.devices_of_subtensor(st.id):
            host = placed.topology.host_of(d)
            out[host] = out.get(host, 0) + n
    return out


def compare(rt: Any, src: PTC, dst: PTC, job: str = "compare") -> dict[str, Any]:
    """P2P then central on `rt`'s agents (see the module docstring); leaves no tag behind."""
    plan = compile_plan(src, dst)
    central = compile_central(src, dst, src.topology.host_of(src.allocation.devices[0]))
    tensors = arange_tensors(src)
    values = arange_values(src)
    arrays = materialize_all(src, tensors)
    rt.load(job, "src", src, arrays, values)
    state_bytes = sum(a.nbytes for a in arrays.values())
    del arrays
    try:
        rt.stage(plan, src, dst)  # sliced per host off the clock, as compiled: each execute times its work
        rt.stage(central, src, dst)
        before = rt.memory(reset_peak=True)
        t0 = time.perf_counter()
        rt.execute(plan, src, dst, job, "src", "p2p")
        p2p_s, p2p_phases, after = time.perf_counter() - t0, dict(rt.phases), rt.memory()
        placed = dst.with_allocation(plan.allocation)
        checked = check_state(placed, tensors, rt.fetch(job, "p2p")[0])
        rt.drop(job, "p2p")
        t0 = time.perf_counter()
        rt.execute_central(central, src, dst, job, "src", "central")
        central_s, central_phases = time.perf_counter() - t0, dict(rt.phases)
        checked += check_state(dst.with_allocation(central.scatter.allocation), tensors, rt.fetch(job, "central")[0])
    finally:
        for tag in ("src", "p2p", "central"):
            rt.drop(job, tag)
    have = _dst_bytes(placed)
    growth = {h: (after[h]["peak"] - b["rss"]) / have[h] for h, b in before.items() if have.get(h)}
    bound = plan.stats.lower_bound_seconds
    return {
        "state_bytes": state_bytes, "p2p_network_bytes": plan.stats.network_bytes,
        "lower_bound_bytes": plan.stats.network_lower_bound_bytes, "central_network_bytes": central.network_bytes,
        "bound_s": bound, "p2p_s": p2p_s, "central_s": central_s, "speedup": central_s / p2p_s,
        "p2p_over_bound": p2p_s / bound if bound else None, "p2p_phases": p2p_phases, "central_phases": central_phases,
        "rss_growth": growth, "rss_ratio": max(growth.values(), default=0.0), "budget_bytes": plan.options.memory_budget_bytes,
        "rounds": plan.stats.rounds, "messages": len(plan.messages), "checked_bytes": checked,
        "equal": plan.stats.network_bytes == plan.stats.network_lower_bound_bytes,
    }  # fmt: skip


def _spec(model: str, layout: str) -> str:
    return f"{model}{',' if ':' in model else ':'}{layout}"


def unavailable() -> str | None:
    """Why emulated hosts with agents cannot run here, or None."""
    from tenplex.runtime.netns import netns_unavailable_reason
    from tenplex.runtime.transport.ucx import ucx_available

    return netns_unavailable_reason() or ucx_available()


def run_hosts(model: str, moves: Sequence[tuple[str, str, str]], rate: str = RATE,
              rate_bytes: float = RATE_BYTES, mtu: int | None = None) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """[{name, src, dst, **compare(...)} or {name, error}] per (name, src layout, dst layout)
    move of `model` on one emulated cluster (links of `mtu`, else 1500); ([], reason) when it
    cannot run here."""
    reason = unavailable()
    if reason is not None:
        return [], reason
    from tenplex.runtime.agent.fleet import AgentFleet
    from tenplex.runtime.netns import EmulatedHosts
    from tenplex.runtime.runtime import Runtime

    pairs = [(name, shaped(ptc_from_spec(_spec(model, a)), rate_bytes), shaped(ptc_from_spec(_spec(model, b)), rate_bytes))
             for name, a, b in moves]  # fmt: skip
    hosts = sorted({h for _, s, d in pairs for h in s.topology.union(d.topology).hosts})
    rows: list[dict[str, Any]] = []
    with EmulatedHosts(len(hosts), rate=rate, mtu=mtu) as net, AgentFleet(hosts, hosts=net, timeout=120.0) as fleet, \
            Runtime.connect(fleet.controls, round_timeout=600.0) as rt:  # fmt: skip
        for (name, a, b), (_, src, dst) in zip(moves, pairs):
            row = {"name": name, "src": _spec(model, a), "dst": _spec(model, b)}
            try:
                rows.append({**row, **compare(rt, src, dst, f"demo-{os.getpid()}")})
            except TenplexError as e:
                rows.append({**row, "error": f"{type(e).__name__}: {e}"})
    return rows, ""


HEADERS = ("move", "P2P net", "central net", "bound", "P2P", "central", "speedup", "P2P/bound", "checked")


def hosts_title() -> str:
    return f"5. Emulated hosts: 4 network namespaces, links shaped to {RATE}, one `tenplex agent` each (UCX over TCP)"


def show_hosts(p: Any, model: str, rows: list[dict[str, Any]], skipped: str) -> None:
    """The comparison as a table on the demo's printer (its title, `hosts_title`, comes first)."""
    from tenplex.compiler.emit import human_bytes

    if skipped:
        p.line(f"  skipped: {skipped}")
        return
    p.line(f"  model {model}, 4 GPUs on 2 hosts -> 8 GPUs on 4 hosts")
    p.line("  P2P = the compiled plan; central = gather on h0, then scatter (Tenplex-Central); seconds of execute")
    body = [[r["name"], "error", *[""] * 6, r["error"][:60]] if "error" in r else
            [r["name"], human_bytes(r["p2p_network_bytes"]), human_bytes(r["central_network_bytes"]), f"{r['bound_s']:.2f}s",
             f"{r['p2p_s']:.2f}s", f"{r['central_s']:.2f}s", f"{r['speedup']:.1f}x", f"{r['p2p_over_bound']:.2f}x",
             human_bytes(r["checked_bytes"])] for r in rows]  # fmt: skip
    p.table(HEADERS, body, "lrrrrrrrr")


def hosts_ok(rows: list[dict[str, Any]], skipped: str) -> bool:
    return bool(skipped) or (bool(rows) and all("error" not in r and r["checked_bytes"] > 0 and r["equal"] for r in rows))
