"""In-process measurements of one case; `bench.worker` runs them in a fresh process.

`measure_compile` times the three phases separately in CPU seconds of this process
(`time.process_time`: build the PTCs, compile, verify) and reads the process's peak RSS; `measure_bytes` compiles the Tenplex plan and the reference
baseline and compares their network bytes with the lower bound. Both return JSON-ready dicts.
"""

from __future__ import annotations

import resource
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tenplex.compiler import CompileOptions, Plan, check_plan, compile_plan, network_lower_bound
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.ptc import PTC


def peak_rss_bytes() -> int:
    """High-water RSS of this process (VmHWM; ru_maxrss, in KiB on Linux, as a fallback)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> tuple[Any, float]:
    start = clock()
    out = fn()
    return out, clock() - start


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    return _timed(fn, time.process_time)


def _compile_unchecked(src: PTC, dst: PTC, options: CompileOptions) -> Plan | None:
    """compile_plan without its final check_plan, via the compiler's internals; None when
    those internals are not there (then the caller subtracts check time from compile_plan)."""
    try:
        from tenplex.compiler.compile import Program, default_passes, freeze, run_passes
        from tenplex.compiler.nogc import without_gc

        # the collector paused for the whole of it, as in compile_plan: paused only pass by pass,
        # it ran ~300 collections (0.04-0.1 CPU s at 1024 GPUs) that compile_plan never runs
        return without_gc(lambda: freeze(run_passes(Program.start(src, dst, options), default_passes(options))))()
    except (ImportError, AttributeError, TypeError):  # internals renamed or re-signed
        return None


def op_counts(plan: Plan) -> dict[str, int]:
    kinds = Counter(type(op).__name__ for op in plan.ops)
    return {"ops": len(plan.ops), **{k: kinds[k] for k in sorted(kinds)}, "edges": len(plan.edges),
            "messages": len(plan.messages), "rounds": plan.stats.rounds}  # fmt: skip


def ptc_counts(ptc: PTC) -> dict[str, int]:
    return {"devices": len(ptc.allocation.devices), "hosts": len(ptc.topology.hosts),
            "tensors": len(ptc.tensors), "subtensors": len(ptc.subtensors)}  # fmt: skip


def measure_compile(src_spec: str, dst_spec: str) -> dict[str, Any]:
    """CPU seconds to build the PTCs, compile (without the check) and check; peak RSS; op counts."""
    rss_start = peak_rss_bytes()
    (src, dst), build_s = _cpu(lambda: (ptc_from_spec(src_spec), ptc_from_spec(dst_spec)))
    options = CompileOptions()
    plan, compile_s = _cpu(lambda: _compile_unchecked(src, dst, options))
    method = "run_passes+freeze"
    if plan is None:
        plan, compile_s = _cpu(lambda: compile_plan(src, dst, options))
        method = "compile_plan-check_plan"
    _, check_s = _cpu(lambda: check_plan(plan, src, dst))
    if method == "compile_plan-check_plan":
        compile_s -= check_s
    return {
        "build_s": build_s, "compile_s": compile_s, "check_s": check_s, "compile_method": method,
        "peak_rss_bytes": peak_rss_bytes(), "import_rss_bytes": rss_start,
        "src": ptc_counts(src), "dst": ptc_counts(dst), "plan": op_counts(plan),
        "network_bytes": plan.stats.network_bytes, "network_lower_bound_bytes": plan.stats.network_lower_bound_bytes,
    }  # fmt: skip


def state_bytes(ptc: PTC) -> int:
    """Bytes of all sub-tensors on all devices (DP replicas counted once per device)."""
    return sum(ptc.nbytes_of(st) * len(ptc.devices_of_subtensor(st.id)) for st in ptc.subtensors)


def measure_bytes(src_spec: str, dst_spec: str) -> dict[str, Any]:
    """Network bytes of the Tenplex plan and of the reference baseline, with the lower bound
    recomputed from the PTCs for the allocation the plan realizes."""
    src, dst = ptc_from_spec(src_spec), ptc_from_spec(dst_spec)
    plan, compile_s = _timed(lambda: compile_plan(src, dst, CompileOptions()))
    ref, ref_s = _timed(lambda: compile_plan(src, dst, CompileOptions(baseline="reference")))
    lower = network_lower_bound(src, dst, plan.allocation)
    s = plan.stats
    return {
        "dst_state_bytes": state_bytes(dst),
        "network_bytes": s.network_bytes,
        "lower_bound_bytes": lower,
        "stats_lower_bound_bytes": s.network_lower_bound_bytes,
        "lower_bound_unplaced_bytes": network_lower_bound(src, dst),
        "equal": s.network_bytes == lower == s.network_lower_bound_bytes,
        "reference_network_bytes": ref.stats.network_bytes,
        "predicted_s": s.predicted_seconds,
        "lower_bound_s": s.lower_bound_seconds,
        "reference_predicted_s": ref.stats.predicted_seconds,
        "stats": {"device": s.device_bytes, "host": s.host_bytes, "fill": s.fill_bytes, "rounds": s.rounds},
        "compile_s": compile_s, "reference_compile_s": ref_s,
    }  # fmt: skip
