"""`python -m bench.recovery [--quick]`: failure recovery from store replicas vs restarting from a checkpoint.

4 emulated hosts (network namespaces behind a bridge, every link shaped to 1 Gbit/s with tbf),
one `tenplex agent` per host (UCX over TCP), one device per host, a GPT-style model (bf16
weights, fp32 Adam state) laid out tp2,pp2 over the 4 hosts. Measured, each on the same agents:

(a) keeping replicas: executing `replication_plan(src, 1)` (state + one store replica of every
    partition on the next host), the steady-state cost paid at every checkpoint step;
then host h1's agent is killed and a runtime connects to the 3 survivors, which recover into a
3-host layout (tp1,pp3 on h0, h2, h3):
(b) tenplex recovery: the recovery plan from the surviving holders (`recovery_plan`);
(c) restart: the src state was written beforehand (untimed) as a tenplex checkpoint directory
    on this machine's disk and dropped from the page cache; timed: `read_checkpoint`, loading
    the partitions round-robin onto the survivors' agents (through their control sockets, not
    the shaped links: a best case for the checkpoint's storage), compiling and executing the
    plan into the 3-host layout. `reshard(...)` is not used: it runs on local worker processes,
    not on the emulated hosts' agents. The training lost since that checkpoint is not counted;
(d) central: (b)'s move as the centralized baseline (`compile_central`, gather on h0 then
    scatter, `Runtime.execute_central`) from the same surviving holders.
Every dst state is fetched and compared byte for byte with the arange oracle. Results:
bench/results/recovery.{md,json} (recovery-quick.* with --quick). Needs root and iproute2.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RATE, RATE_BYTES = "1gbit", 125e6
HOSTS, FAILED = ["h0", "h1", "h2", "h3"], "h1"
MODEL = "gpt-tiny:layers=6,hidden=768,heads=12,ffn=3072,vocab=8192"
QUICK_MODEL = "gpt-tiny:layers=6,hidden=256,heads=8,ffn=1024,vocab=4096"
SRC, DST = "tp2,pp2,dp1@4x1", "tp1,pp3,dp1@3x1"
JOB = "bench-recovery"
WHAT = {
    "(a) keep replicas": "state + 1 store replica on the next host",
    "(b) tenplex recovery": "from survivors' holders + store replicas",
    "(c) restart": "read checkpoint, load (not counted), reshard",
    "(d) central": "gather on h0, then scatter",
}
HEADERS = ["variant", "what", "network", "bound s", "seconds", "vs recovery", "checked"]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _write_cold_checkpoint(src, tensors, path: Path) -> None:
    """The src state as a checkpoint directory, fsynced and evicted from the page cache."""
    from tenplex.runtime.arrays import arange_values, materialize
    from tenplex.runtime.checkpoint.directory import write_checkpoint

    arrays = {st.id: materialize(src, tensors, st) for st in src.subtensors}
    values = arange_values(src)
    write_checkpoint(src, arrays, {p.id: values[(p.id, src.allocation.devices_of(p.id)[0])] for p in src.partitions}, path)
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _restored(ptc, hosts: list[str], first_device: int):
    """A checkpoint's PTC with partition i on a new device of hosts[i % len(hosts)]."""
    from tenplex.ir.ptc import PTC, Allocation
    from tenplex.ir.topology import Device, Topology

    devices = [Device(first_device + i, hosts[i % len(hosts)]) for i in range(len(ptc.partitions))]
    alloc = Allocation({p.id: (first_device + i,) for i, p in enumerate(ptc.partitions)})
    return PTC(ptc.tensors, ptc.subtensors, ptc.partitions, alloc, Topology(devices, ptc.topology.links))


def _restart(rt, ckpt: Path, dst, alive: list[str], first_device: int) -> tuple[float, dict[str, float], Any, Any]:
    """(seconds, phases, plan, restored PTC) of the restart baseline (module docstring, (c))."""
    from tenplex.compiler import compile_plan
    from tenplex.runtime.checkpoint.directory import read_checkpoint

    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    ptc, arrays, values = read_checkpoint(ckpt)
    phases["read"] = time.perf_counter() - t0
    src = _restored(ptc, alive, first_device)
    dev = {p.id: src.allocation.devices_of(p.id)[0] for p in src.partitions}
    phases["load"] = _timed(lambda: rt.load(JOB, "ckpt", src, {(sid, dev[src.partition_of[sid]]): a for sid, a in arrays.items()},
                                            {(pid, dev[pid]): v for pid, v in values.items()}))  # fmt: skip
    t1 = time.perf_counter()
    plan = compile_plan(src, dst)
    phases["compile"] = time.perf_counter() - t1
    phases["execute"] = _timed(lambda: rt.execute(plan, src, dst, JOB, "ckpt", "restart"))
    return time.perf_counter() - t0, phases, plan, src


def measure(quick: bool) -> dict[str, Any]:
    """Every variant's row (see the module docstring), or {"skipped": reason}."""
    from demo.hosts import shaped, unavailable
    from tenplex.compiler.central import compile_central
    from tenplex.elastic.recovery import onto_hosts, recovery_plan, replication_plan, survivors
    from tenplex.frontends.spec import ptc_from_spec
    from tenplex.runtime.agent.fleet import AgentFleet
    from tenplex.runtime.arrays import arange_tensors, arange_values, materialize_all
    from tenplex.runtime.netns import EmulatedHosts
    from tenplex.runtime.oracle import check_state
    from tenplex.runtime.runtime import Runtime

    reason = unavailable()
    if reason is not None:
        return {"skipped": reason}
    model = QUICK_MODEL if quick else MODEL
    src = shaped(ptc_from_spec(f"{model},{SRC}"), RATE_BYTES)
    rep, rep_plan = replication_plan(src, 1)
    alive = [h for h in HOSTS if h != FAILED]
    top = max(d.id for d in rep.topology.devices) + 1
    dst = shaped(onto_hosts(ptc_from_spec(f"{model},{DST}"), alive, top), RATE_BYTES)
    left = survivors(rep, [FAILED])
    rec_plan, central = recovery_plan(rep, [FAILED], dst), compile_central(left, dst, alive[0])
    tensors = arange_tensors(src)
    tmp = Path(tempfile.mkdtemp(prefix="tenplex-bench-recovery-"))
    rows: list[dict[str, Any]] = []
    try:
        _write_cold_checkpoint(src, tensors, tmp / "ckpt")
        with EmulatedHosts(len(HOSTS), rate=RATE) as net, AgentFleet(HOSTS, hosts=net, timeout=120.0) as fleet:
            with Runtime.connect(fleet.controls, round_timeout=600.0) as rt:
                arrays = materialize_all(src, tensors)
                state_bytes = sum(a.nbytes for a in arrays.values())
                rt.load(JOB, "v0", src, arrays, arange_values(src))
                del arrays
                run = lambda: rt.execute(rep_plan, src, rep, JOB, "v0", "rep")  # noqa: E731
                rows.append(_variant(rt, "(a) keep replicas", rep_plan, run, rep, "rep", tensors, keep=True))
                rt.drop(JOB, "v0")
            fleet.kill(FAILED)
            with Runtime.connect({h: fleet.controls[h] for h in alive}, round_timeout=600.0) as rt:
                run = lambda: rt.execute(rec_plan, left, dst, JOB, "rep", "recovered")  # noqa: E731
                rows.append(_variant(rt, "(b) tenplex recovery", rec_plan, run, dst, "recovered", tensors))
                run = lambda: rt.execute_central(central, left, dst, JOB, "rep", "central")  # noqa: E731
                rows.append(_variant(rt, "(d) central", central, run, dst, "central", tensors))
                s, phases, plan, _ = _restart(rt, tmp / "ckpt", dst, alive, top + len(dst.topology.devices))
                placed = dst.with_allocation(plan.allocation)
                rows.append(
                    _row("(c) restart", plan, s, phases, check_state(placed, tensors, rt.fetch(JOB, "restart")[0]))
                )
                for tag in ("rep", "ckpt", "restart"):
                    rt.drop(JOB, tag)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = next(r["seconds"] for r in rows if r["variant"].startswith("(b)"))
    for r in rows:
        r["vs_recovery"] = r["seconds"] / base
    return {"model": model, "src": SRC, "dst": DST, "failed": FAILED, "hosts": HOSTS, "rate": RATE,
            "state_bytes": state_bytes, "rows": sorted(rows, key=lambda r: r["variant"])}  # fmt: skip


def _variant(rt, variant: str, plan: Any, run, dst, tag: str, tensors, keep: bool = False) -> dict[str, Any]:
    """Time `run`, check `tag` against the oracle (dst placed as the plan placed it), drop it unless `keep`."""
    from tenplex.runtime.oracle import check_state

    seconds = _timed(run)
    alloc = plan.scatter.allocation if hasattr(plan, "scatter") else plan.allocation
    checked = check_state(dst.with_allocation(alloc), tensors, rt.fetch(JOB, tag)[0])
    if not keep:
        rt.drop(JOB, tag)
    return _row(variant, plan, seconds, dict(rt.phases), checked)


def _row(variant: str, plan: Any, seconds: float, phases: dict[str, float], checked: int) -> dict[str, Any]:
    stats = [plan.gather.stats, plan.scatter.stats] if hasattr(plan, "gather") else [plan.stats]
    return {"variant": variant, "what": WHAT[variant], "network_bytes": sum(s.network_bytes for s in stats),
            "bound_s": sum(s.lower_bound_seconds for s in stats), "seconds": seconds, "phases": phases,
            "checked_bytes": checked}  # fmt: skip


def cells(r: dict[str, Any]) -> list[str]:
    from bench.report import fmt_bytes

    return [r["variant"], r["what"], fmt_bytes(r["network_bytes"]), f"{r['bound_s']:.2f}", f"{r['seconds']:.2f}",
            f"{r['vs_recovery']:.2f}x", fmt_bytes(r["checked_bytes"])]  # fmt: skip


def markdown(info: dict[str, Any], res: dict[str, Any]) -> str:
    from bench.report import fmt_bytes, md_table

    phases = [f"- {r['variant']}: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["phases"].items()) for r in res["rows"]]
    return "\n".join([
        "# Failure recovery vs restart (`python -m bench.recovery`)", "",
        f"{info['date']}, git {info['git_rev'] or '?'}, Python {info['python']}, {info['nproc']} CPUs ({info['cpu']})", "",
        f"{len(HOSTS)} emulated hosts (tbf {RATE} on every link), one `tenplex agent` each, UCX over TCP. Model "
        f"`{res['model']}` ({fmt_bytes(res['state_bytes'])} of state), src `{SRC}`; host {FAILED} dies; dst `{DST}` "
        f"on the survivors. Seconds of execution (restart: read + load + compile + execute). 'bound': the plans' "
        "bandwidth bound. 'checked': dst bytes compared with the arange oracle. See bench/recovery.py for the "
        "variants; (a) is the steady-state cost of keeping one store replica, paid at each state save.", "",
        md_table(HEADERS, [cells(r) for r in res["rows"]]), "", "Phases:", "", *phases, "",
    ])  # fmt: skip


def main(argv: list[str]) -> int:
    from bench.report import machine_info, text_table, write_results

    quick = "--quick" in argv
    res = measure(quick)
    if "skipped" in res:
        print(f"bench.recovery skipped: {res['skipped']}")
        return 0
    print(f"\nFailure recovery on {len(HOSTS)} emulated hosts ({RATE}), {res['model']}, host {FAILED} killed")
    print(text_table(HEADERS, [cells(r) for r in res["rows"]]) + "\n", flush=True)
    out = Path(__file__).resolve().parent / "results"
    stem, info = "recovery-quick" if quick else "recovery", machine_info()
    write_results(out, stem, {"machine": info, **res}, markdown(info, res))
    print(f"wrote {out / stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
