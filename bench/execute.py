"""`python -m bench --only agents,execute`: agents on one host against memcpy, and the fixed cost of an execute.

`agents`: 2 agent processes (`Runtime.local`), the runtime table's TP2 → PP2 reshard. Fresh: the
first `Runtime.execute` of new agents (every dst page faulted in by the move); fresh, pool
reserved: the same after `Runtime.reserve` faulted each agent's arena pool in and had its peer
map it (off the clock, as long-lived agents do while idle); repeated: the next executes on the same agents (dst tag dropped
in between, its arenas recycled). Each execute alternates with a
warm `np.copyto` of the same bytes in the bench process (the anchor); ratio = memcpy s /
execute s, min/median/max over the repeats (goals: fresh ≥ 0.8×, repeated ≥ 0.9×). Fresh agents
are also timed against a fresh memcpy (`bench.runtime.fresh_memcpy_seconds`: a new process copying
the same bytes into pages that the copy faults in), the physical limit of a first execute whose
dst pages are new on this VM kind, and against a fresh memfd memcpy (the same into a new memory
file, faulted in by MADV_POPULATE_WRITE: the memory kind of the agents' shared dst arenas). Repeated
executes are also timed against the copy limit (`bench.copy_limit`: the plan's region copies on
arrays made here, one thread per host at once, no agent: what the copy pattern itself allows,
copied as the agents copy: the bench's process starts with their glibc tunables,
`runtime.agent.tunables`, which leave the memcpy anchor, one copy above any threshold, as it is;
timed after the agents exit, three times per repeated execute, so that its arrays, about twice the
state, never sit beside the agents' arenas), whose ratio to the memcpy is
its own column. Repeated executes are also timed in CPU seconds of the
runtime and both agents (every thread, `cpu_seconds`) against the CPU seconds of the memcpy
(`demo.agents.memcpy_seconds` by `time.thread_time`): the work they cost, which other load on the machine does not inflate. The dst of the first and the last
execute of the first agents is checked byte for byte against the source.

`execute`: a small plan (gpt-tiny, 328 ops) executed repeatedly on the same 2 agents: ms per
`Runtime.execute` (prepare, rounds, commit) and ms of its prepare, min/median/max over 30 repeats
(10 with --quick) (goal ≤ 5 ms), as a ratio to the goal, and the CPU ms of one execute in the
runtime and both agents (every thread, from /proc: what a loaded machine does not inflate). Each case runs in a fresh subprocess; results in
bench/results/{agents,execute}.{md,json}.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.copy_limit import CopyLimit
from bench.runtime import MODEL, QUICK_MODEL
from tenplex.runtime.agent import tunables

WORKERS = 2
MOVE = ("tp2,pp1,dp1@1x2", "tp1,pp2,dp1@1x2")
SMALL = "gpt-tiny"  # 328 ops for MOVE
GOAL_FRESH, GOAL_REPEATED, GOAL_MS = 0.8, 0.9, 5.0


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def fmt(s: dict[str, float], unit: str = "x", scale: float = 1.0) -> str:
    return f"{s['min'] * scale:.2f} / {s['median'] * scale:.2f} / {s['max'] * scale:.2f}{unit}"


def _case(model: str) -> tuple[Any, Any, Any, int]:
    from demo.agents import on_workers
    from tenplex.compiler import compile_plan
    from tenplex.frontends.spec import ptc_from_spec

    sep = "," if ":" in model else ":"
    src = on_workers(ptc_from_spec(f"{model}{sep}{MOVE[0]}"), WORKERS)
    dst = on_workers(ptc_from_spec(f"{model}{sep}{MOVE[1]}"), WORKERS)
    plan = compile_plan(src, dst)
    st = plan.stats
    return src, dst, plan, st.network_bytes + st.host_bytes + st.device_bytes


def _arena_bytes(placed: Any, host: str) -> int:
    """Bytes of the arena an agent makes for its dst arrays (`store.shared.layout`)."""
    from tenplex.runtime.arrays import np_dtype
    from tenplex.runtime.store.shared import layout

    sizes = [math.prod(st.shape) * np_dtype(placed.tensor_map[st.tensor].dtype).itemsize
             for st in placed.subtensors for d in placed.devices_of_subtensor(st.id) if placed.topology.host_of(d) == host]  # fmt: skip
    return layout(sizes)[1]


def measure_agents(model: str, repeats: int) -> dict[str, Any]:
    from bench.runtime import fresh_memcpy_seconds
    from demo.agents import memcpy_seconds
    from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
    from tenplex.runtime.oracle import check_state
    from tenplex.runtime.runtime import Runtime

    src, dst, plan, moved = _case(model)
    tensors, placed = arange_tensors(src), dst.with_allocation(plan.allocation)
    dst_bytes = max(_arena_bytes(placed, h) for h in placed.topology.hosts)
    kinds = ("fresh", "reserved", "repeated", "fresh_vs_fresh", "fresh_vs_memfd", "repeated_cpu", "limit", "repeated_vs_limit")
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    repeated: list[tuple[float, float]] = []  # (memcpy anchor, execute seconds) of each repeated execute
    checked = 0
    for k in range(repeats):
        for reserve in (k % 2 == 1, k % 2 == 0):  # alternate which kind of fresh agents goes first
            with Runtime.local([f"w{i}" for i in range(WORKERS)], timeout=120.0, start_timeout=120.0) as rt:
                rt.load("bench", "src", src, materialize_all(src, tensors), arange_values(src))
                if reserve:
                    rt.reserve(dst_bytes)  # the pool faulted in, and mapped by the peer, before the clock starts
                runs = repeats + 1 if (k, reserve) == (0, False) else 1  # these agents also run the repeated executes
                pids = [os.getpid(), *(a.proc.pid for a in rt.agents.values())]
                for j in range(runs):
                    anchor = memcpy_seconds(moved)
                    first_fresh = j == 0 and not reserve
                    fresh_anchor = fresh_memcpy_seconds(moved) if first_fresh else None
                    memfd_anchor = fresh_memcpy_seconds(moved, "memfd") if first_fresh else None
                    c0, t0 = cpu_seconds(pids), time.perf_counter()
                    rt.execute(plan, src, dst, "bench", "src", "dst")
                    took, cpu = time.perf_counter() - t0, cpu_seconds(pids) - c0
                    kind = "repeated" if j else "reserved" if reserve else "fresh"
                    ratios[kind].append(anchor / took)
                    if j:  # the work of an execute, which other load on the machine does not inflate
                        ratios["repeated_cpu"].append(memcpy_seconds(moved, clock=time.thread_time) / cpu)
                        repeated.append((anchor, took))
                    if first_fresh:  # the same bytes into new pages
                        ratios["fresh_vs_fresh"].append(fresh_anchor / took)
                        ratios["fresh_vs_memfd"].append(memfd_anchor / took)
                    if j in (0, runs - 1) and k == 0:
                        checked += check_state(placed, tensors, rt.fetch("bench", "dst")[0])
                    rt.drop("bench", "dst")
    # the copy limit once the agents are gone: its arrays (about twice the state) beside the agents'
    # arenas would double the case's memory
    copies = CopyLimit(plan, src, dst, [f"w{i}" for i in range(WORKERS)])  # the plan's copies, no agents
    for anchor, took in repeated:
        limit = min(copies.seconds() for _ in range(3))
        ratios["limit"].append(anchor / limit)
        ratios["repeated_vs_limit"].append(limit / took)
    kinds = {}  # the copy limit's two kinds of copies: one run each side, or strided runs
    for name, strided in (("flat", False), ("strided", True)):
        work = copies.of_kind(strided)
        nbytes = sum(d.nbytes for pairs in work.values() for _, d in pairs)
        kinds[name] = {"bytes": nbytes, "gbps": nbytes / min(copies.seconds(work) for _ in range(3)) / 1e9 if nbytes else 0.0}
    return {"moved_bytes": moved, "ops": len(plan.ops), **{k: spread(v) for k, v in ratios.items()},
            "all": ratios, "limit_kinds": kinds, "memcpy_gbps": moved / memcpy_seconds(moved) / 1e9, "checked_bytes": checked}  # fmt: skip


def measure_execute(model: str, repeats: int) -> dict[str, Any]:
    from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
    from tenplex.runtime.oracle import check_state
    from tenplex.runtime.runtime import Runtime

    src, dst, plan, moved = _case(model)
    tensors = arange_tensors(src)
    total, prepare, cpu = [], [], []
    with Runtime.local([f"w{i}" for i in range(WORKERS)]) as rt:
        rt.load("bench", "src", src, materialize_all(src, tensors), arange_values(src))
        pids = [os.getpid(), *(a.proc.pid for a in rt.agents.values())]
        for _ in range(repeats + 1):  # the first one slices the plan and warms the agents up
            c0 = cpu_seconds(pids)
            t0 = time.perf_counter()
            rt.execute(plan, src, dst, "bench", "src", "dst")
            total.append(time.perf_counter() - t0)
            cpu.append(cpu_seconds(pids) - c0)
            prepare.append(rt.phases["prepare"])
            rt.drop("bench", "dst")
        rt.execute(plan, src, dst, "bench", "src", "dst")
        checked = check_state(dst.with_allocation(plan.allocation), tensors, rt.fetch("bench", "dst")[0])
    return {"ops": len(plan.ops), "moved_bytes": moved, "first_ms": total[0] * 1e3, "ms": spread([t * 1e3 for t in total[1:]]),
            "prepare_ms": spread([t * 1e3 for t in prepare[1:]]), "cpu_ms": spread([t * 1e3 for t in cpu[1:]]),
            "checked_bytes": checked}  # fmt: skip


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the processes `pids` (every thread) ran so far (/proc/PID/task/*/schedstat, ns):
    the work of an execute, which a loaded machine does not inflate as it does wall time."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


# ---- the driver --------------------------------------------------------------------------
def _table(kind: str, quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    from bench.report import fmt_bytes, md_table, text_table, write_results
    from bench.runner import progress, run_json

    model = SMALL if kind == "execute" else (QUICK_MODEL if quick else MODEL)
    repeats = (10 if quick else 30) if kind == "execute" else (3 if quick else 5)
    # the agents' copy tunables (`tunables`) in the bench's process too, so that the copy limit copies as the
    # agents do; the memcpy anchor (one copy of the moved bytes, above any threshold) is the same either way
    env = tunables.environ(os.environ) if kind == "agents" else None
    row = run_json(["bench.execute", kind, model, str(repeats)], {"name": f"{model} {MOVE[0]} -> {MOVE[1]}"}, timeout_s, env)
    progress(row, row["name"])
    if kind == "agents":
        headers = ["case", "status", "moved", "fresh / memcpy", "fresh / fresh memcpy", "fresh / fresh memfd memcpy",
                   "fresh, pool reserved / memcpy", "repeated / memcpy", "repeated: memcpy / CPU", "copy limit / memcpy",
                   "repeated / copy limit", "copy limit GB/s: flat / strided (strided share); memcpy", "checked"]  # fmt: skip
        cells = [row["name"], row["status"], *([fmt_bytes(row["moved_bytes"]), fmt(row["fresh"]), fmt(row["fresh_vs_fresh"]),
                 fmt(row["fresh_vs_memfd"]), fmt(row["reserved"]), fmt(row["repeated"]), fmt(row["repeated_cpu"]), fmt(row["limit"]),
                 fmt(row["repeated_vs_limit"]), _kinds(row), fmt_bytes(row["checked_bytes"])] if row["status"] == "ok"
                 else ["", "", "", "", "", "", "", "", "", "", row.get("error", "")[:80]])]  # fmt: skip
        what = (f"{WORKERS} agent processes on one host vs a warm numpy memcpy of the moved bytes, min / median / max "
                f"of the ratio over {repeats} repeats (goals: fresh ≥ {GOAL_FRESH}×, repeated ≥ {GOAL_REPEATED}×). "
                "Fresh memcpy: a new process copying the same bytes into pages that the copy faults in (numpy's "
                "anonymous memory, transparent huge pages); fresh memfd memcpy: into a new memory file faulted in by "
                "MADV_POPULATE_WRITE, the memory kind of the agents' shared dst arenas (4 KiB pages where shmem has no "
                "huge pages): the physical limit of a first execute, whose dst pages are new. Copy limit: the plan's "
                "region copies without agents, one thread per host at once (`bench.copy_limit`), the limit of a "
                "repeated execute; its copies split into flat ones (one run of bytes on both sides) and strided "
                "ones (column blocks: runs of a few KiB, each copied with ordinary stores), each kind timed alone, "
                "beside the warm memcpy's GB/s. memcpy / CPU: the CPU seconds of the memcpy over "
                "those of the runtime and both agents (every thread) during a repeated execute: the work it costs, "
                "which other load on the machine does not inflate (1x: every byte copied once at memcpy speed).")
    else:
        headers = ["case", "status", "ops", "execute ms", "prepare ms", "execute / goal", "CPU ms (runtime + agents)", "checked"]
        ok = row["status"] == "ok"
        cells = [row["name"], row["status"], *([str(row["ops"]), fmt(row["ms"], ""), fmt(row["prepare_ms"], ""),
                 fmt(row["ms"], "x", 1 / GOAL_MS), fmt(row["cpu_ms"], ""), fmt_bytes(row["checked_bytes"])]
                 if ok else ["", "", "", "", "", row.get("error", "")[:80]])]  # fmt: skip
        what = (f"Fixed cost of `Runtime.execute` on {WORKERS} warm agents, small plan, min / median / max over {repeats} "
                f"repeats (goal ≤ {GOAL_MS} ms). CPU ms: the CPU time of the runtime and both agents (every thread) "
                "during one execute, which other load on the machine does not inflate.")
    print(f"\n{what}\n" + text_table(headers, [cells]) + "\n", flush=True)
    md = "\n".join([f"# `python -m bench --only {kind}`", "",
                    f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
                    what, "", md_table(headers, [cells]), ""])  # fmt: skip
    stem = f"{kind}-quick" if quick else kind
    return [row], write_results(out_dir, stem, {"machine": info, kind: [row]}, md)


def _kinds(row: dict[str, Any]) -> str:
    k = row["limit_kinds"]
    share = k["strided"]["bytes"] / max(1, k["flat"]["bytes"] + k["strided"]["bytes"])
    return f"{k['flat']['gbps']:.1f} / {k['strided']['gbps']:.1f} ({share:.0%}); {row['memcpy_gbps']:.1f}"


def run_agents(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    return _table("agents", quick, timeout_s, out_dir, info)


def run_execute(quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]) -> tuple[list[dict], list[Path]]:
    return _table("execute", quick, timeout_s, out_dir, info)


if __name__ == "__main__":
    kind, model, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps((measure_agents if kind == "agents" else measure_execute)(model, repeats)))
