"""`python -m demo.main` (`make demo`): tenplex end to end, in under a minute on two cores.

1. The paper's scale-up cases: GPT-3 XL / 2.7B / 6.7B at (T,P,D) = (4,2,1) on 2 hosts × 4 GPUs
   grown to 4 hosts × 4 GPUs at (4,2,2), (4,4,1) and (8,2,1). Per case: network bytes of
   tenplex's plan, the network lower bound, the bytes of the reference Tenplex's source choice
   (`CompileOptions(baseline="reference")`), and the compile + verify time.
2. A small GPT reconfigured step by step ((2,2,1) → (1,2,2) → (4,1,1) on one host, then out to
   a second host), each plan compiled, verified and executed in-process by the numpy executor
   from `arange` sources, every byte compared with the source tensors (`check_execution`).
3. The same chain (2,2,1) → (1,2,2) → (4,1,1) executed by two local agent processes over UCX
   (`Runtime.local`; the 4 devices re-homed alternately onto hosts w0 and w1), each step's dst
   state fetched and compared with the oracle byte for byte; per step the bytes moved (between
   workers / local), the plan's lower bound, the wall time and the time of a numpy memcpy of
   the same bytes in this process. Skipped (with a line saying why) when ucxx cannot be imported.
4. The Graphviz DOT of the last plan of part 2 in `demo-out/plan.dot`, rendered to PNG when
   `dot` is on PATH.

Exit status 0 when every plan verifies, moves exactly the network lower bound, and executes to
the oracle byte for byte; 1 otherwise (the failing case is named in the output).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import TextIO

import attrs

from tenplex.compiler import CompileOptions, Plan, compile_plan, network_lower_bound
from tenplex.compiler.emit import human_bytes, human_seconds, plural, table, to_dot, to_text
from tenplex.frontends.spec import ptc_from_spec
from tenplex.ir.errors import TenplexError
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
from tenplex.runtime.oracle import check_execution, check_state

PAPER_MODELS = ("gpt-1.3b", "gpt-2.7b", "gpt-6.7b")
PAPER_SRC = ((4, 2, 1), "2x4")
PAPER_DSTS = (((4, 2, 2), "4x4"), ((4, 4, 1), "4x4"), ((8, 2, 1), "4x4"))
SMALL_MODEL = "gpt-tiny:layers=8,hidden=256,heads=8,ffn=1024,vocab=4096"
SMALL_STEPS = (((2, 2, 1), "1x4"), ((1, 2, 2), "1x4"), ((4, 1, 1), "1x4"), ((4, 1, 2), "2x4"))
QUICK_MODEL = "gpt-tiny"
HOSTS_MODEL = "gpt-tiny:layers=4,hidden=512,heads=8,ffn=2048,vocab=8192"
HOSTS_MOVES = (("(2,2,1)->(2,2,2)", "tp2,pp2,dp1@2x2", "tp2,pp2,dp2@4x2"),
               ("(2,2,1)->(2,4,1)", "tp2,pp2,dp1@2x2", "tp2,pp4,dp1@4x2"))  # fmt: skip
AGENT_STEPS = SMALL_STEPS[:3]  # (2,2,1) -> (1,2,2) -> (4,1,1) on one host's 4 devices
AGENT_WORKERS = 2


def spec(model: str, tpd: tuple[int, int, int], cluster: str) -> str:
    """`gpt-1.3b:tp4,pp2,dp1@2x4`; model may carry its own options (`gpt-tiny:layers=8`)."""
    sep = "," if ":" in model else ":"
    return f"{model}{sep}tp{tpd[0]},pp{tpd[1]},dp{tpd[2]}@{cluster}"


def tpd_text(tpd: tuple[int, int, int]) -> str:
    return "(" + ",".join(map(str, tpd)) + ")"


@attrs.frozen
class Case:
    """One paper case's numbers (bytes are network bytes); `error` is set when it failed."""

    model: str
    dst: tuple[int, int, int]
    network: int = 0
    bound: int = 0
    bound_as_given: int = 0
    reference: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.network == self.bound


@lru_cache(maxsize=len(PAPER_MODELS))
def paper_src(model: str) -> PTC:
    """The paper's src PTC, built once per model and process."""
    return ptc_from_spec(spec(model, *PAPER_SRC))


def run_case(model: str, dst_tpd: tuple[int, int, int], dst_cluster: str) -> Case:
    """Compile (and so verify) tenplex's plan and the reference's for one case."""
    try:
        src, dst = paper_src(model), ptc_from_spec(spec(model, dst_tpd, dst_cluster))
        t0 = time.perf_counter()
        plan = compile_plan(src, dst)
        seconds = time.perf_counter() - t0
        reference = compile_plan(src, dst, CompileOptions(baseline="reference"))
    except TenplexError as e:
        return Case(model, dst_tpd, error=f"{type(e).__name__}: {e}")
    s = plan.stats
    return Case(model, dst_tpd, s.network_bytes, s.network_lower_bound_bytes, network_lower_bound(src, dst),
                reference.stats.network_bytes, seconds)  # fmt: skip


def run_cases(models: Sequence[str], dsts: Sequence, jobs: int) -> list[Case]:
    args = [(m, tpd, cluster) for m in models for tpd, cluster in dsts]
    if jobs <= 1:
        return [run_case(*a) for a in args]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_case, *zip(*args)))


@attrs.frozen
class Step:
    src: tuple[tuple[int, int, int], str]
    dst: tuple[tuple[int, int, int], str]
    plan: Plan | None
    seconds: float
    checked_bytes: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.plan is not None
            and self.plan.stats.network_bytes == self.plan.stats.network_lower_bound_bytes
        )


def run_steps(model: str, steps: Sequence) -> tuple[list[Step], PTC, PTC]:
    """Reconfigure through `steps`; each step's src is the previous dst as the plan placed it.
    Returns the steps and the last step's (src, dst) PTCs."""
    out: list[Step] = []
    src = ptc_from_spec(spec(model, *steps[0]))
    last = (src, src)
    for before, after in zip(steps, steps[1:]):
        try:
            dst = ptc_from_spec(spec(model, *after))
            t0 = time.perf_counter()
            plan = compile_plan(src, dst)
            seconds = time.perf_counter() - t0
            state = check_execution(plan, src, dst)
        except TenplexError as e:
            out.append(Step(before, after, None, 0.0, error=f"{type(e).__name__}: {e}"))
            break
        out.append(Step(before, after, plan, seconds, sum(a.nbytes for a in state.arrays.values())))
        last, src = (src, dst), dst.with_allocation(plan.allocation)
    return out, *last


def on_workers(ptc: PTC, workers: int) -> PTC:
    """`ptc` with device k on host `w{k % workers}` (allocation unchanged): one host's devices
    spread over `workers` local agent processes, as `tenplex.runtime.reshard.rehome` does."""
    topo = Topology(tuple(Device(d.id, f"w{d.id % workers}") for d in ptc.topology.devices), ptc.topology.links)
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, ptc.allocation, topo)


def memcpy_seconds(nbytes: int, repeat: int = 3) -> float:
    """Best time of a numpy copy of `nbytes` between two already-touched buffers (this process)."""
    if nbytes <= 0:
        return 0.0
    import numpy as np

    a, b = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
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


class Printer:
    """Tables through rich when it is importable and the output is a stream; plain text otherwise."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        try:
            from rich.console import Console
        except ImportError:
            self.console = None
            return
        self.console = Console(file=stream, highlight=False)
        if not self.console.is_terminal:
            self.console = Console(file=stream, highlight=False, width=110)

    def line(self, text: str = "", style: str | None = None) -> None:
        if self.console is None:
            print(text, file=self.stream)
        else:
            self.console.print(text, style=style, markup=False, soft_wrap=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]], align: str) -> None:
        if self.console is None:
            print(table(headers, rows, align=align), file=self.stream)
            return
        from rich import box
        from rich.table import Table

        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
        for h, a in zip(headers, align):
            t.add_column(h, justify="right" if a == "r" else "left", no_wrap=True)
        for row in rows:
            t.add_row(*map(str, row))
        self.console.print(t)

    def status(self, text: str):
        """A transient spinner on terminals; nothing elsewhere."""
        import contextlib

        if self.console is None or not self.console.is_terminal:
            return contextlib.nullcontext()
        return self.console.status(text)


def pct_saved(ours: int, theirs: int) -> str:
    return f"{100 * (theirs - ours) / theirs:.0f}%" if theirs else "-"


def headline(p: Printer, cases: list[Case], steps: list[Step], agents: list[AgentStep] | None = None,
             skipped: str = "") -> None:  # fmt: skip
    ok_cases = sum(c.ok for c in cases)
    ours, ref = sum(c.network for c in cases), sum(c.reference for c in cases)
    ok_steps = sum(s.ok for s in steps)
    checked = sum(s.checked_bytes for s in steps)
    p.line("tenplex demo: verified, minimal reconfiguration plans", style="bold")
    p.line(f"  paper cases: {ok_cases}/{len(cases)} plans verified at the network lower bound; "
           f"{human_bytes(ours)} over the network vs {human_bytes(ref)} for reference Tenplex ({pct_saved(ours, ref)} less)")  # fmt: skip
    p.line(f"  small GPT:   {ok_steps}/{len(steps)} reconfigurations executed in-process, "
           f"{human_bytes(checked)} of dst state equal to the source byte for byte")  # fmt: skip
    if skipped:
        p.line(f"  agents:      skipped (ucxx cannot be imported: {skipped})")
    elif agents is not None:
        moved, secs = sum(a.moved for a in agents), sum(a.seconds for a in agents)
        p.line(f"  agents:      {sum(a.ok for a in agents)}/{len(AGENT_STEPS) - 1} reconfigurations executed by "
               f"{AGENT_WORKERS} agent processes over UCX, {human_bytes(moved)} moved in {human_seconds(secs)}, "
               f"dst state equal to the source byte for byte")  # fmt: skip


def show_cases(p: Printer, cases: list[Case]) -> None:
    (tpd, cluster), n = PAPER_SRC, len(cases)
    p.line(f"1. Scale-up, (T,P,D) = {tpd_text(tpd)} on {cluster.replace('x', ' hosts x ')} GPUs -> 4 hosts x 4 GPUs "
           f"(model + Adam state, {plural(n, 'case')})", style="bold")  # fmt: skip
    rows = []
    for c in cases:
        if c.error:
            rows.append([c.model, f"-> {tpd_text(c.dst)}", "FAILED", "", "", "", "", c.error[:60]])
            continue
        rows.append([c.model, f"-> {tpd_text(c.dst)}", human_bytes(c.network), human_bytes(c.bound),
                     human_bytes(c.bound_as_given), human_bytes(c.reference), pct_saved(c.network, c.reference),
                     f"{c.seconds:.1f} s"])  # fmt: skip
    p.table(["model", "T,P,D", "tenplex", "lower bound", "bound, fixed ranks", "reference", "saved", "compile+verify"],
            rows, align="llrrrrrr")  # fmt: skip
    p.line("  lower bound: bytes each dst host needs that no src device on it holds, for the plan's rank placement;")
    p.line("  'fixed ranks': the same bound with every dst rank where the spec puts it (tenplex's place-ranks")
    p.line("  moves ranks to where their data already is; the reference cannot). compile_plan always verifies.")


def show_steps(p: Printer, model: str, steps: list[Step]) -> None:
    p.line(f"2. {model}: reconfigured, executed in-process, checked against the source", style="bold")
    rows = []
    for s in steps:
        move = f"{tpd_text(s.src[0])}@{s.src[1]} -> {tpd_text(s.dst[0])}@{s.dst[1]}"
        if s.plan is None:
            rows.append([move, "FAILED", "", "", "", "", s.error[:60]])
            continue
        st = s.plan.stats
        rows.append([move, human_bytes(st.network_bytes), human_bytes(st.network_lower_bound_bytes),
                     human_bytes(st.host_bytes), human_bytes(st.device_bytes), f"{s.seconds:.2f} s",
                     f"ok, {human_bytes(s.checked_bytes)}" if s.ok else "MISMATCH"])  # fmt: skip
    p.table(["T,P,D @ hosts x GPUs", "network", "lower bound", "host", "same device", "compile+verify", "executed"],
            rows, align="lrrrrrl")  # fmt: skip


def show_agents(p: Printer, model: str, agents: list[AgentStep], skipped: str) -> None:
    p.line(f"3. {model}: the same reconfigurations executed by {AGENT_WORKERS} local agent processes over UCX "
           f"(the 4 devices alternately on hosts w0, w1), checked against the source", style="bold")  # fmt: skip
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


def write_dot(p: Printer, plan: Plan, src: PTC, dst: PTC, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "plan.dot"
    path.write_text(to_dot(plan, src, dst))
    p.line(f"4. Graphviz: wrote {path} (the last plan of part 2)", style="bold")
    if shutil.which("dot") is None:
        p.line(f"  'dot' is not on PATH: PNG skipped (with graphviz: dot -Tpng {path} -o {path.with_suffix('.png')})")
        return
    png = path.with_suffix(".png")
    done = subprocess.run(["dot", "-Tpng", str(path), "-o", str(png)], capture_output=True, text=True)
    p.line(f"  rendered {png}" if done.returncode == 0 else f"  dot failed: {done.stderr.strip()[:200]}")


def show_last(p: Printer, step: Step, src: PTC, dst: PTC, out_dir: Path) -> None:
    assert step.plan is not None
    move = f"{tpd_text(step.src[0])}@{step.src[1]} -> {tpd_text(step.dst[0])}@{step.dst[1]}"
    p.line(f"plan of the last step, {move} (to_text):")
    p.line(to_text(step.plan, src, dst).rstrip())
    p.line()
    write_dot(p, step.plan, src, dst, out_dir)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m demo.main", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one paper case and gpt-tiny (for tests)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes for the paper cases")
    ap.add_argument("--out", type=Path, default=Path("demo-out"), help="where plan.dot goes (default demo-out)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> int:
    args = parse_args(argv)
    p = Printer(stream or sys.stdout)
    models, dsts = (PAPER_MODELS[:1], PAPER_DSTS[:1]) if args.quick else (PAPER_MODELS, PAPER_DSTS)
    small = QUICK_MODEL if args.quick else SMALL_MODEL
    t0 = time.perf_counter()
    with p.status(f"compiling {len(models) * len(dsts)} paper cases and the small GPT ..."):
        cases = run_cases(models, dsts, args.jobs)
        steps, src, dst = run_steps(small, SMALL_STEPS)
    with p.status(f"executing {len(AGENT_STEPS) - 1} reconfigurations on {AGENT_WORKERS} local agents ..."):
        agents, skipped = run_agent_steps(small, AGENT_STEPS)
    hosts, hosts_skipped = [], "not in --quick"
    elastic, elastic_why = None, "not in --quick"
    if not args.quick:
        from demo.elastic import run_elastic
        from demo.hosts import run_hosts

        with p.status("emulated hosts: peer-to-peer vs central over shaped links ..."):
            hosts, hosts_skipped = run_hosts(HOSTS_MODEL, HOSTS_MOVES)
        with p.status("an elastic job on 2 -> 1 -> 2 -> 2 -> 1 processes (tp, pp, dp, a crash) ..."):
            elastic, elastic_why = run_elastic()
    headline(p, cases, steps, agents, skipped)
    p.line()
    show_cases(p, cases)
    p.line()
    show_steps(p, small, steps)
    p.line()
    show_agents(p, small, agents, skipped)
    p.line()
    from demo.hosts import hosts_ok, show_hosts

    show_hosts(p, HOSTS_MODEL, hosts, hosts_skipped)
    if steps[-1].plan is not None:
        p.line()
        show_last(p, steps[-1], src, dst, args.out)
    if not args.quick:
        from demo.elastic import show_elastic

        p.line()
        show_elastic(p, elastic, elastic_why)
    ok = all(c.ok for c in cases) and all(s.ok for s in steps) and len(steps) == len(SMALL_STEPS) - 1
    ok = ok and (bool(skipped) or (all(a.ok for a in agents) and len(agents) == len(AGENT_STEPS) - 1))
    ok = ok and hosts_ok(hosts, hosts_skipped)
    if not args.quick:
        from demo.elastic import elastic_ok

        ok = ok and elastic_ok(elastic, elastic_why)
    p.line()
    p.line(
        f"demo {'OK' if ok else 'FAILED'} in {human_seconds(time.perf_counter() - t0)}",
        style="bold green" if ok else "bold red",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
