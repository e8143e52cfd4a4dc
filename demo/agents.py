"""Part 3 of the demo: the small GPT's first reconfigurations executed by local agent processes.

(2,2,1) -> (1,2,2) -> (4,1,1) by two local agent processes over UCX (`Runtime.local`; the 4
devices re-homed alternately onto hosts w0 and w1), each step's dst state fetched and compared
with the oracle byte for byte; per step the bytes moved (between workers / local), the plan's
lower bound, the wall time and the time of a numpy memcpy of the same bytes in this process.
Skipped (with a line saying why) when ucxx cannot be imported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import attrs

from demo.paper import spec, tpd_text
from demo.printer import Printer
from demo.steps import SMALL_STEPS
from tenplex.compiler import compile_plan
from tenplex.compiler.emit import human_bytes
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_state

AGENT_STEPS = SMALL_STEPS[:3]  # (2,2,1) -> (1,2,2) -> (4,1,1) on one host's 4 devices
AGENT_WORKERS = 2


def on_workers(ptc: PTC, workers: int) -> PTC:
    """`ptc` with device k on host `w{k % workers}` (allocation unchanged): one host's devices
    spread over `workers` local agent processes, as `tenplex.runtime.reshard.rehome` does."""
    topo = Topology(tuple(Device(d.id, f"w{d.id % workers}") for d in ptc.topology.devices), ptc.topology.links)
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, ptc.allocation, topo)


def memcpy_seconds(nbytes: int, repeat: int = 3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best time of a numpy copy of `nbytes` between two already-touched buffers (this process),
    by `clock` (wall time; `time.thread_time` for the CPU seconds of the copy)."""
    if nbytes <= 0:
        return 0.0
    import numpy as np

    a, b = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        np.copyto(b, a)
        best = min(best, clock() - t0)
    return best


@attrs.frozen
class AgentStep:
    """One step executed by agents: bytes from the plan, seconds of `Runtime.execute`."""

    src: tuple[tuple[int, int, int], str]
    dst: tuple[tuple[int, int, int], str]
    network: int = 0  # between workers
    local: int = 0  # within a worker (host + same-device copies)
    bound: int = 0
    sent: int = 0  # bytes the agents report sending
    seconds: float = 0.0
    memcpy: float = 0.0
    checked_bytes: int = 0
    error: str = ""

    @property
    def moved(self) -> int:
        return self.network + self.local

    @property
    def ok(self) -> bool:
        return not self.error and self.network == self.bound == self.sent and self.checked_bytes > 0


def run_agent_steps(model: str, steps: Sequence, workers: int = AGENT_WORKERS,
                    timeout: float = 30.0) -> tuple[list[AgentStep], str]:  # fmt: skip
    """Run the chain on `workers` local agents (one `Runtime.local` for all steps, the dst of
    one step the src of the next). Returns (steps, skip reason); the reason is "" unless ucxx
    cannot be imported, and then no step is run."""
    from tenplex.runtime.transport.ucx import ucx_available

    reason = ucx_available()
    if reason is not None:
        return [], reason
    from tenplex.runtime.runtime import Runtime

    out: list[AgentStep] = []
    src = on_workers(ptc_from_spec(spec(model, *steps[0])), workers)
    tensors = arange_tensors(src)
    values = arange_values(src)
    job = f"demo-{os.getpid()}"
    try:
        with Runtime.local([f"w{i}" for i in range(workers)], timeout=timeout, round_timeout=4 * timeout,
                           start_timeout=4 * timeout) as rt:  # fmt: skip
            rt.load(job, "s0", src, materialize_all(src, tensors), values)
            for i, (before, after) in enumerate(zip(steps, steps[1:])):
                try:
                    dst = on_workers(ptc_from_spec(spec(model, *after)), workers)
                    plan = compile_plan(src, dst)
                    placed = dst.with_allocation(plan.allocation)
                    t0 = time.perf_counter()
                    sent = rt.execute(plan, src, dst, job, f"s{i}", f"s{i + 1}")
                    seconds = time.perf_counter() - t0
                    got, _ = rt.fetch(job, f"s{i + 1}")
                    checked = check_state(placed, tensors, got)
                except TenplexError as e:
                    out.append(AgentStep(before, after, error=f"{type(e).__name__}: {e}"))
                    break
                st = plan.stats
                local = st.host_bytes + st.device_bytes
                out.append(AgentStep(before, after, st.network_bytes, local, st.network_lower_bound_bytes,
                                     sum(sent.values()), seconds, memcpy_seconds(st.network_bytes + local), checked))  # fmt: skip
                src = placed
    except TenplexError as e:  # starting the agents failed
        out.append(AgentStep(steps[0], steps[1], error=f"{type(e).__name__}: {e}"))
    return out, ""


def agents_title(model: str) -> str:
    return (f"3. {model}: the first {len(AGENT_STEPS) - 1} reconfigurations of part 2 (on one host's 4 devices) executed "
            f"by {AGENT_WORKERS} local agent processes over UCX (the devices alternately on hosts w0, w1), "
            "checked against the source")  # fmt: skip


def show_agents(p: Printer, agents: list[AgentStep], skipped: str) -> None:
    """Part 3's table (its title, `agents_title`, comes before the agents run)."""
    if skipped:
        p.line(f"  skipped: ucxx cannot be imported ({skipped})")
        return
    rows = []
    for a in agents:
        move = f"{tpd_text(a.src[0])} -> {tpd_text(a.dst[0])}"
        if a.error:
            rows.append([move, "FAILED", "", "", "", "", "", a.error[:70]])
            continue
        ratio = f"{a.memcpy / a.seconds:.2f}x" if a.seconds > 0 else "-"
        rows.append([move, human_bytes(a.network), human_bytes(a.local), human_bytes(a.bound),
                     f"{a.seconds * 1e3:.0f} ms", f"{a.memcpy * 1e3:.1f} ms", ratio,
                     f"ok, {human_bytes(a.checked_bytes)}" if a.ok else "MISMATCH"])  # fmt: skip
    p.table(["T,P,D", "network", "local", "lower bound", "wall", "memcpy", "memcpy/wall", "checked"],
            rows, align="lrrrrrrl")  # fmt: skip
    p.line("  network: bytes between the workers; local: within one (host + same-device copies); wall:")
    p.line("  Runtime.execute (prepare, rounds, commit); memcpy: one numpy copy of network + local bytes in")
    p.line("  this process (the memcpy bound); memcpy/wall = 1.00x would match it.")
