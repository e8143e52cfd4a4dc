"""Offline resharding of a checkpoint directory (`tenplex reshard`; the format: `checkpoint.directory`).

`reshard(src_dir, dst, out_dir, workers=N)` reads SRC (the src files memory-mapped, not read:
`checkpoint.npy.map_npy`), compiles the plan and writes OUT_DIR. Src partition i (sorted by id;
first replica only) goes on device i and the dst allocation is renumbered onto devices 0..D-1
(old ids in order), in one topology shared by both PTCs (`rehome`).

- Peer to peer (the default): the plan is compiled for one host (all devices on `w0`: the
  files are on one machine) and each dst file is written once, straight from the plan's copies
  (`checkpoint.planned`: copies in the kernel from the mapped src files). With `workers` N >= 2
  the files are shared out by bytes among N worker processes forked once the plan is compiled
  (`checkpoint.workers`), each writing its share the same way: every worker reads the src
  files it needs itself, so no byte moves between workers. A worker that dies fails the
  reshard with an error naming it (`host 'w1'`).
- `central=True`: the paper's Tenplex-Central baseline. Device k lives on host `w{k % N}`; the
  state is gathered on the host of device 0 and scattered from there (`compile_central`), so
  every byte that changes workers goes through that one: in-process (executor, local
  transport) for one worker, else on N local agent processes (`Runtime.local`, forked while the
  plan compiles; the bytes between them read out of each other's memory, `transport="cma"`,
  UCX where the kernel forbids that), which map the src files themselves and execute into the
  dst files (`agent.files`).

OUT_DIR is written into a temporary directory beside it, made durable and renamed at the end
(`checkpoint.directory.write_checkpoint_dir`): it is complete or absent, never partial, also
after a crash, and an existing OUT_DIR is an error.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tenplex.compiler import CompileOptions, Plan, compile_plan
from tenplex.compiler.nogc import without_gc
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC, Allocation
from tenplex.ir.topology import Device, Topology
from tenplex.runtime.checkpoint.apply import plan_values
from tenplex.runtime.checkpoint.directory import (
    CheckpointError,
    read_checkpoint,
    relative_paths,
    write_checkpoint,
    write_checkpoint_dir,
)
from tenplex.runtime.checkpoint.planned import PlannedFiles
from tenplex.runtime.checkpoint.tree import OutDir


@attrs.frozen
class ReshardResult:
    out_dir: str
    workers: int
    central: bool
    plans: tuple[Plan, ...]  # the plan, or the central baseline's gather and scatter plans
    bytes_moved: int  # bytes that crossed devices (host links + network), from the plans
    network_bytes: int  # bytes between workers
    seconds: float
    verified: bool  # plans checked by the compiler's verifier; every OUT_DIR file written in full, durably

    def summary(self) -> str:
        from tenplex.compiler.emit import human_bytes

        mode = "central (gathered on w0, then scattered)" if self.central else "peer to peer"
        checked = "plan verified, every file written in full and synced" if self.verified else "not verified"
        messages = sum(len(p.messages) for p in self.plans)
        return (f"tenplex: resharded into {self.out_dir} with {self.workers} worker(s), {mode}: "
                f"{human_bytes(self.bytes_moved)} moved between devices ({human_bytes(self.network_bytes)} "
                f"between workers) in {messages} messages, {self.seconds:.2f}s; {checked}.")  # fmt: skip


def rehome(src: PTC, dst: PTC, workers: int) -> tuple[PTC, PTC]:
    """Both PTCs on `workers` local hosts (see the module docstring)."""
    if workers < 1:
        raise CheckpointError(f"workers must be >= 1, got {workers}")
    src_alloc = Allocation({p.id: (i,) for i, p in enumerate(src.partitions)})
    renum = {d: i for i, d in enumerate(dst.allocation.devices)}
    dst_alloc = Allocation({pid: tuple(renum[d] for d in devs) for pid, devs in dst.allocation.items})
    n = max(len(src.partitions), len(renum))
    topo = Topology(tuple(Device(k, f"w{k % workers}") for k in range(n)), src.topology.links)
    return _with(src, src_alloc, topo), _with(dst, dst_alloc, topo)


def _with(ptc: PTC, alloc: Allocation, topo: Topology) -> PTC:
    """`ptc` on `topo` with `alloc`: only the allocation is re-verified (the rest is unchanged)."""
    moved = copy.copy(ptc)
    object.__setattr__(moved, "topology", topo)
    return moved.with_allocation(alloc)


@without_gc  # its objects (two PTCs, a plan) hold no cycles; the collector's scans of them cost ~5%
def reshard(src_dir: str | os.PathLike, dst: PTC, out_dir: str | os.PathLike, *, workers: int = 1,
            central: bool = False, timeout: float = 30.0, round_timeout: float = 600.0,
            on_round: Callable[[int, int], None] | None = None, outdir: OutDir | None = None) -> ReshardResult:  # fmt: skip
    """Reshard the checkpoint in `src_dir` to `dst`'s layout into `out_dir` (complete or absent).
    `on_round(done, total)` is called after each round (progress). `outdir`: an entered
    `OutDir(dst, out_dir)` (not `central`) that the caller started ahead (`tenplex reshard`
    does, before importing numpy); it is committed here, and left to the caller's block on an error.

    Raises CheckpointError (bad src, existing out_dir), CompileError, ExecutionError."""
    start = time.monotonic() if outdir is None else outdir.started_at
    out = Path(out_dir)
    if outdir is not None and (central or outdir.out != out or outdir.dst is not dst):
        raise ValueError("outdir: an OutDir of this dst and out_dir, for a reshard that is not central")
    if outdir is None and out.exists():
        raise CheckpointError(f"{out}: already exists (refusing to overwrite)")
    run = _central if central else functools.partial(_direct, outdir=outdir)
    steps = run(src_dir, dst, out, workers, timeout, round_timeout, on_round)
    plans = tuple(plan for plan, _, _ in steps)
    return ReshardResult(str(out), workers, central, plans, sum(p.stats.host_bytes + p.stats.network_bytes for p in plans),
                         sum(p.stats.network_bytes for p in plans), time.monotonic() - start, True)  # fmt: skip


def _direct(src_dir: str | os.PathLike, dst: PTC, out: Path, workers: int, timeout: float, round_timeout: float,
            on_round: Callable[[int, int], None] | None, outdir: OutDir | None = None) -> list[Step]:  # fmt: skip
    """Peer to peer: OUT's tree made and its files allocated (`OutDir`, here or by the caller
    ahead) while the src is read and the plan compiled for one host, then each dst file written
    once from the mapped src."""
    with contextlib.ExitStack() as stack:
        o = outdir if outdir is not None else stack.enter_context(OutDir(dst, out))
        orig_src, arrays, values = read_checkpoint(src_dir, mapped=True)
        src, dst_h = rehome(orig_src, dst, 1)
        steps = _steps(src, dst_h, False)
        plan = steps[0][0]
        files = PlannedFiles(plan, src, dst_h, {(sid, _first(src, sid)): a for sid, a in arrays.items()})
        files.preallocated = o.pre.started
        write_checkpoint(dst, _writer(files, workers, on_round), plan_values(plan, values), o.tmp, o.tree)
        o.commit()
    return steps


def _central(src_dir: str | os.PathLike, dst: PTC, out: Path, workers: int, timeout: float, round_timeout: float,
             on_round: Callable[[int, int], None] | None) -> list[Step]:  # fmt: skip
    """The central baseline: in-process for one worker, else on agents started while the plan compiles."""
    with _agents(workers, timeout, round_timeout) as rt:
        orig_src, arrays, values = read_checkpoint(src_dir, mapped=True)
        relative_paths(dst)  # fail before any work if dst cannot be written
        src, dst_h = rehome(orig_src, dst, workers)
        steps = _steps(src, dst_h, True)
        src_arrays = {(sid, _first(src, sid)): a for sid, a in arrays.items()}
        if rt is None:
            write_checkpoint_dir(dst, *_executed(steps, src_arrays, values, workers, timeout, round_timeout, on_round),
                                 out)  # fmt: skip
        else:
            rt.link(max(60.0, timeout))
            files = _src_files(src_dir, src, relative_paths(orig_src), src_arrays)
            _on_agents(rt, steps, files, values, dst, out, on_round)
    return steps


def _first(ptc: PTC, sid: str) -> int:
    """The first device of sub-tensor `sid`'s partition."""
    return ptc.allocation.devices_of(ptc.partition_of[sid])[0]


def _writer(files: PlannedFiles, workers: int, on_file: Callable[[int, int], None] | None) -> Any:
    """`files` as written by this process (`workers` 1, or no `fork` here), else by `workers`
    forked worker processes (`checkpoint.workers`)."""
    if workers == 1:
        return files
    from tenplex.runtime.checkpoint.workers import WorkerFiles, fork_available  # multiprocessing: not for one

    return WorkerFiles(files, workers, on_file) if fork_available() else files


def _src_files(src_dir: str | os.PathLike, src: PTC, rel: dict[str, str], arrays: dict) -> dict:
    """{(sub-tensor, device): (absolute path, dtype, shape)} of the src arrays' files."""
    root = Path(src_dir).resolve()
    out = {}
    for sid, device in arrays:
        st = src.subtensor_map[sid]
        out[(sid, device)] = (str(root / rel[sid]), src.tensor_map[st.tensor].dtype, list(st.shape))
    return out


Step = tuple[Plan, PTC, PTC]  # (plan, its src, its dst)


def _steps(src: PTC, dst: PTC, central: bool) -> list[Step]:
    """The plans to run in order: one (on one host: placing ranks moves nothing there), or the
    central baseline's gather then scatter."""
    if not central:
        return [(compile_plan(src, dst, CompileOptions(place_ranks=False)), src, dst)]
    from tenplex.compiler.central import compile_central  # the baseline's only: not imported for a reshard

    c = compile_central(src, dst, src.topology.host_of(src.allocation.devices[0]))
    return [(c.gather, src, c.mid), (c.scatter, c.mid, dst)]


def _executed(steps: list[Step], src_arrays: dict, values: dict, workers: int, timeout: float, round_timeout: float,
              on_round: Callable[[int, int], None] | None) -> tuple[dict, dict]:  # fmt: skip
    """(dst sub-tensor id -> array, dst partition id -> values) of the steps run on `workers`."""
    src = steps[0][1]
    src_values = {(pid, src.allocation.devices_of(pid)[0]): v for pid, v in values.items()}
    got_arrays, got_values = execute_steps(steps, src_arrays, src_values, workers, timeout, round_timeout, on_round)
    return first_instances(steps[-1][2].with_allocation(steps[-1][0].allocation), got_arrays, got_values)


def _agents(workers: int, timeout: float, round_timeout: float) -> contextlib.AbstractContextManager:
    """None for one worker, else `workers` local agent processes, started but not yet linked
    (`Runtime.local(link=False)`): they start up while the caller compiles."""
    if workers == 1:
        return contextlib.nullcontext(None)
    from tenplex.runtime.runtime import Runtime

    hosts = [f"w{i}" for i in range(workers)]
    return Runtime.local(hosts, timeout=timeout, round_timeout=round_timeout, start_timeout=max(60.0, timeout),
                         link=False, fork=True, transport="cma")  # fmt: skip


def _on_agents(rt: Any, steps: list[Step], src_files: dict, values: dict, dst: PTC, out: Path,
               on_round: Callable[[int, int], None] | None) -> None:  # fmt: skip
    """OUT_DIR from the steps run on the agents of `rt`: they map the `src_files` ({(sid,
    device): (path, dtype, shape)}) and write the dst files in place (`AgentFiles`)."""
    src = steps[0][1]
    src_values = {(pid, src.allocation.devices_of(pid)[0]): v for pid, v in values.items()}
    dst_values = functools.reduce(lambda v, step: plan_values(step[0], v), steps, values)
    load = lambda job: rt.load(job, "src", src, src_files, src_values, command="load_files")  # noqa: E731
    write_checkpoint_dir(dst, AgentFiles(rt, steps, load, on_round), dst_values, out)


class AgentFiles:
    """The dst arrays as files the agents write: `write_files(out, files)` (called by
    `checkpoint.directory.write_checkpoint` once the directories exist) runs the steps, the last
    one into new memory-mapped files (`Runtime.execute`'s `files`), each sub-tensor from its
    partition's first device."""

    def __init__(self, rt: Any, steps: list[Step], load: Callable[[str], None],
                 on_round: Callable[[int, int], None] | None):  # fmt: skip
        self.rt, self.steps, self.load, self.on_round = rt, steps, load, on_round

    def write_files(self, out: Path, files: dict[str, str], meanwhile: Callable[[], None]) -> None:
        meanwhile()
        placed = self.steps[-1][2].with_allocation(self.steps[-1][0].allocation)
        first = {p.id: placed.allocation.devices_of(p.id)[0] for p in placed.partitions}
        per_host: dict[str, list] = {}
        for sid, rel in files.items():
            device = first[placed.partition_of[sid]]
            per_host.setdefault(placed.topology.host_of(device), []).append((sid, device, str(out / rel)))
        _run_steps(self.rt, self.steps, self.load, self.on_round, per_host)


def first_instances(placed: PTC, arrays: dict, values: dict) -> tuple[dict, dict]:
    """Sub-tensor id -> array and partition id -> values of an execution's result
    ({(id, device): ...}), each from its partition's first device in `placed`."""
    first = {p.id: placed.allocation.devices_of(p.id)[0] for p in placed.partitions}
    try:
        out_arrays = {st.id: arrays[(st.id, first[placed.partition_of[st.id]])] for st in placed.subtensors}
    except KeyError as e:
        raise ExecutionError(f"the execution returned no array for dst instance {e}") from None
    return out_arrays, {pid: values.get((pid, d), {}) for pid, d in first.items()}


def execute_steps(steps: list[Step], arrays: dict, values: dict, workers: int, timeout: float, round_timeout: float,
                  on_round: Callable[[int, int], None] | None) -> tuple[dict, dict]:  # fmt: skip
    """Run (plan, src, dst) steps in order from `arrays`/`values` (keyed by (id, device) of the
    first step's src): in-process for one worker, else on `workers` local agents (each step's dst
    the next one's src); returns the last step's dst arrays and values, keyed the same way."""
    if workers == 1:
        from tenplex.runtime.executor import Executor, State
        from tenplex.runtime.transport.local import LocalTransport

        state = State(arrays, values)
        for plan, src, dst in steps:
            state = Executor(plan, src, dst, LocalTransport()).run(state)
        return state.arrays, state.values
    from tenplex.runtime.runtime import Runtime

    with Runtime.local([f"w{i}" for i in range(workers)], timeout=timeout, round_timeout=round_timeout,
                       start_timeout=max(60.0, timeout)) as rt:  # fmt: skip
        job = _run_steps(rt, steps, lambda job: rt.load(job, "src", steps[0][1], arrays, values), on_round)
        return rt.fetch(job, "dst")


def _run_steps(rt: Any, steps: list[Step], load: Callable[[str], None], on_round: Callable[[int, int], None] | None,
               files: dict[str, list] | None = None) -> str:  # fmt: skip
    """`load(job)` the src tag, then run the steps on `rt` from tag `src` to `dst` (the last one
    into `files`, `Runtime.execute`); returns the job."""
    job = f"reshard-{os.getpid()}"
    tags = ["src", *(f".step-{i}" for i in range(1, len(steps))), "dst"]
    total = sum(plan.stats.rounds for plan, _, _ in steps)
    load(job)
    done = 0
    for (plan, src, dst), a, b in zip(steps, tags, tags[1:]):
        progress = None if on_round is None else lambda r, _, done=done: on_round(done + r, total)
        rt.execute(plan, src, dst, job, a, b, on_round=progress, files=files if b == "dst" else None)
        done += plan.stats.rounds
        if a != "src":
            rt.drop(job, a)
    return job
