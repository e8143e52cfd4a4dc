"""`python -m bench --only runtime`: reshard throughput of the agent runtime on one host.

N = 2 agent processes (`Runtime.local`, UCX shared memory between them), a GPT-style model
whose bf16 weights + fp32 Adam state are ≥ 2 GB, resharded TP2 → PP2 (every device keeps half
of what it needs and gets the other half from the other agent). Per case: seconds of
`Runtime.execute`, GB/s of the bytes the plan moves (between agents + local), a numpy memcpy of
the same bytes in one process (GB/s) and the ratio (goal ≥ 0.5× memcpy); the in-process numpy
executor on the same plan for comparison. Every dst byte of both runs is checked against the
source. Each case runs in a fresh subprocess (`python -m bench.runtime SRC DST`) under a
timeout; results go to bench/results/runtime.{md,json} (runtime-quick.* with --quick).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

GOAL_RATIO = 0.5
WORKERS = 2
MODEL = "gpt-tiny:layers=8,hidden=1280,heads=16,ffn=5120,vocab=8192"  # 2.35 GB of model + Adam state
QUICK_MODEL = "gpt-tiny:layers=8,hidden=256,heads=8,ffn=1024,vocab=4096"  # ~100 MB
MOVES = (("tp2,pp1,dp1@1x2", "tp1,pp2,dp1@1x2"),)
HEADERS = ["case", "status", "state", "network", "local", "agents s", "agents GB/s", "memcpy GB/s",
           "agents/memcpy", "fresh memcpy GB/s", "agents/fresh", "in-process s", "in-process GB/s", "checked"]  # fmt: skip


def cases(quick: bool) -> list[tuple[str, str, str]]:
    model = QUICK_MODEL if quick else MODEL
    return [(f"{model.split(':')[0]}{'-quick' if quick else ''} {a.split('@')[0]} -> {b.split('@')[0]}",
             f"{model},{a}", f"{model},{b}") for a, b in MOVES]  # fmt: skip


# ---- one case, in a fresh process ------------------------------------------------------
def fresh_memcpy_seconds(nbytes: int, memory: str = "anon") -> float:
    """Seconds a new process takes to allocate `nbytes` and copy into them (the pages are faulted
    in by the copy, as a reshard's dst arrays are). `memory="anon"`: a numpy array (anonymous
    memory, which numpy advises for transparent huge pages: 2 MiB faults); `"memfd"`: a memory
    file mapped shared, as the agents' dst arenas are (`store.shared`; 4 KiB pages where shmem
    has no huge pages, as on this VM kind), faulted in by MADV_POPULATE_WRITE, then copied into:
    the physical limit of a first execute on that memory. On this VM kind the first touch of
    memory the guest gave back to the host is slow, so both vary much more than a warm memcpy."""
    import subprocess

    from tenplex.runtime.store.shared import MADV_POPULATE_WRITE

    code = ("import numpy as np, sys, time; n = int(sys.argv[1]); src = np.ones(n, np.uint8); "
            "t = time.perf_counter(); dst = np.empty(n, np.uint8); np.copyto(dst, src); print(time.perf_counter() - t)")  # fmt: skip
    if memory == "memfd":
        code = ("import ctypes, mmap, os, numpy as np, sys, time; n = int(sys.argv[1]); src = np.ones(n, np.uint8); "
                "t = time.perf_counter(); fd = os.memfd_create('bench-fresh'); os.ftruncate(fd, n); "
                "dst = np.frombuffer(mmap.mmap(fd, n), np.uint8); "
                f"ctypes.CDLL(None).madvise(ctypes.c_void_p(dst.ctypes.data), ctypes.c_size_t(n), {MADV_POPULATE_WRITE}); "
                "np.copyto(dst, src); print(time.perf_counter() - t)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(nbytes)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def measure(src_spec: str, dst_spec: str, workers: int = WORKERS) -> dict[str, Any]:
    import numpy as np

    from demo.agents import memcpy_seconds, on_workers
    from tenplex.compiler import compile_plan
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
    from tenplex.runtime.executor import Executor, State
    from tenplex.runtime.oracle import check_state
    from tenplex.runtime.runtime import Runtime
    from tenplex.runtime.transport.local import LocalTransport

    src = on_workers(ptc_from_spec(src_spec), workers)
    dst = on_workers(ptc_from_spec(dst_spec), workers)
    t0 = time.perf_counter()
    plan = compile_plan(src, dst)
    compile_s = time.perf_counter() - t0
    placed = dst.with_allocation(plan.allocation)
    st = plan.stats
    moved = st.network_bytes + st.host_bytes + st.device_bytes
    tensors = arange_tensors(src)
    values = arange_values(src)
    state_bytes = sum(a.nbytes for a in tensors.values())


    job = "bench"
    with Runtime.local([f"w{i}" for i in range(workers)], timeout=120.0, round_timeout=600.0,
                       start_timeout=120.0) as rt:  # fmt: skip
        arrays = materialize_all(src, tensors)
        t0 = time.perf_counter()
        rt.load(job, "src", src, arrays, values)
        load_s = time.perf_counter() - t0
        del arrays
        gc.collect()
        t0 = time.perf_counter()
        sent = rt.execute(plan, src, dst, job, "src", "dst")
        agents_s = time.perf_counter() - t0
        phases = {"runtime": dict(rt.phases), **rt.host_seconds}
        t0 = time.perf_counter()
        got, _ = rt.fetch(job, "dst")
        fetch_s = time.perf_counter() - t0
    checked = check_state(placed, tensors, got)
    del got
    gc.collect()
    arrays = materialize_all(src, tensors)
    t0 = time.perf_counter()
    state = Executor(plan, src, dst, LocalTransport()).run(State(arrays, values))
    inproc_s = time.perf_counter() - t0
    del arrays
    check_state(placed, tensors, state.arrays)
    del state
    gc.collect()
    memcpy_s = memcpy_seconds(moved)
    fresh_s = fresh_memcpy_seconds(moved)
    return {
        "workers": workers, "state_bytes": state_bytes, "moved_bytes": moved, "network_bytes": st.network_bytes,
        "local_bytes": st.host_bytes + st.device_bytes, "network_lower_bound_bytes": st.network_lower_bound_bytes,
        "sent_bytes": sum(sent.values()), "equal": st.network_bytes == st.network_lower_bound_bytes, "messages": len(plan.messages), "ops": len(plan.ops),
        "compile_s": compile_s, "load_s": load_s, "fetch_s": fetch_s, "agents_s": agents_s, "inproc_s": inproc_s,
        "memcpy_s": memcpy_s, "fresh_memcpy_s": fresh_s, "fresh_ratio": fresh_s / agents_s, "phases": phases, "agents_gbps": moved / agents_s / 1e9, "inproc_gbps": moved / inproc_s / 1e9,
        "memcpy_gbps": moved / memcpy_s / 1e9, "ratio": memcpy_s / agents_s, "inproc_ratio": memcpy_s / inproc_s,
        "checked_bytes": checked, "numpy": np.__version__,
    }  # fmt: skip


# ---- the driver --------------------------------------------------------------------------
def run_case(name: str, src: str, dst: str, timeout_s: float) -> dict[str, Any]:
    from bench.runner import run_json

    return run_json(["bench.runtime", src, dst], {"name": name, "src": src, "dst": dst}, timeout_s)


def row_cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    if r["status"] != "ok":
        return [r["name"], r["status"], *[""] * (len(HEADERS) - 3), r.get("error", "")[:80]]
    return [r["name"], "ok", fmt_bytes(r["state_bytes"]), fmt_bytes(r["network_bytes"]), fmt_bytes(r["local_bytes"]),
            f"{r['agents_s']:.2f}", f"{r['agents_gbps']:.2f}", f"{r['memcpy_gbps']:.2f}", f"{r['ratio']:.2f}x",
            f"{r['moved_bytes'] / r['fresh_memcpy_s'] / 1e9:.2f}", f"{r['fresh_ratio']:.2f}x",
            f"{r['inproc_s']:.2f}", f"{r['inproc_gbps']:.2f}", fmt_bytes(r["checked_bytes"]) + " x2"]  # fmt: skip


def markdown(info: dict[str, Any], rows: list[dict]) -> str:
    from bench.report import md_table

    return "\n".join([
        "# Runtime benchmark (`python -m bench --only runtime`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        f"One host, {WORKERS} agent processes (`Runtime.local`, UCX between them). GB/s = bytes the plan moves "
        "(between agents + local copies) / seconds of `Runtime.execute` (prepare, rounds, commit). memcpy: "
        f"one `np.copyto` of the same number of bytes in one process, between touched buffers. Goal: agents ≥ "
        f"{GOAL_RATIO}× memcpy. Fresh memcpy: a new process allocating the bytes and copying into them "
        "(pages faulted in by the copy, like a reshard's dst arrays; on this VM kind the first touch of memory "
        "runs at 0.3-1 GB/s, so compare agents with it too). "
        "In-process: the numpy executor (`Executor` + `LocalTransport`) on the same plan. 'checked': dst "
        "bytes compared with the source oracle, for both runs.", "",
        md_table(HEADERS, [row_cells(r) for r in rows]), "",
        "\n".join(f"- {r['name']}: `{r['src']}` → `{r['dst']}`" for r in rows), "",
    ])  # fmt: skip


def run(
    quick: bool, timeout_s: float, out_dir: Path, info: dict[str, Any]
) -> tuple[list[dict], list[Path]]:
    from bench.report import text_table, write_results
    from bench.runner import progress

    rows = []
    for name, src, dst in cases(quick):
        rows.append(run_case(name, src, dst, timeout_s))
        progress(rows[-1], name)
    print(f"\nRuntime: reshard on one host, {WORKERS} agent processes vs numpy memcpy (goal >= {GOAL_RATIO}x)")
    print(text_table(HEADERS, [row_cells(r) for r in rows]) + "\n", flush=True)
    stem = "runtime-quick" if quick else "runtime"
    return rows, write_results(out_dir, stem, {"machine": info, "runtime": rows}, markdown(info, rows))


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:3])))
