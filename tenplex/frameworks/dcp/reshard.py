"""`reshard_dcp`: DCP directory in layout A → DCP directory in a DTensor layout B (what a DCP
directory holds, in plain words: `dcp.describe.inspect_dcp`).

`reshard_dcp(src_dir, dst_layout, out_dir, workers=1)` reads SRC (`read_dcp`), builds the dst
PTC from `dst_layout` (a `MeshLayout`, its JSON dict, a JSON string or a file path; see
`dtensor.mesh`), compiles the plan and writes OUT_DIR with `write_dcp` (one `__{rank}_0.distcp`
per dst rank; the flatten mapping of SRC kept). With `workers == 1` the plan runs in-process and
streams: each dst chunk is produced from the memory-mapped source into a reused per-thread
buffer right before `write_dcp` writes its record (`dcp.apply.StreamedArrays`; a chunk that is
whole contiguous source regions is written from the mapping itself, not produced), so the reshard
holds neither the source nor a second copy of the state in memory (the "execute" time is then
part of "write"). With `workers >= 2` it runs on local agents through
`tenplex.runtime.reshard`'s `rehome`/`execute_steps` and the dst arrays are materialized.
OUT_DIR is complete or absent: it is written beside itself and renamed; on any error nothing is
left. The result loads with `torch.distributed.checkpoint.load` into layout-B DTensors with no
resharding left to do (each rank's chunk is one stored chunk).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tenplex.compiler import CompileOptions, Plan, compile_plan
from tenplex.compiler.emit import human_bytes
from tenplex.frameworks.dcp.apply import StreamedArrays
from tenplex.frameworks.dcp.format import DcpError
from tenplex.frameworks.dcp.read import read_dcp, read_index
from tenplex.frameworks.dcp.write import write_dcp
from tenplex.frameworks.dtensor.mesh import MeshLayout, dst_ptc
from tenplex.ir.ptc import PTC
from tenplex.runtime.checkpoint.apply import plan_values
from tenplex.runtime.reshard import execute_steps, first_instances, rehome


@attrs.frozen
class DcpReshardResult:
    out_dir: str
    workers: int
    plan: Plan
    bytes_moved: int  # bytes the plan copies between devices (host links + network)
    seconds: dict[str, float]  # read, compile, execute, write

    def summary(self) -> str:
        total = sum(self.seconds.values())
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        return f"tenplex: resharded DCP into {self.out_dir} with {self.workers} worker(s): {human_bytes(self.bytes_moved)} moved between ranks, {total:.2f}s ({parts})"


def reshard_dcp(src_dir: str | os.PathLike, dst_layout: MeshLayout | dict | str | os.PathLike, out_dir: str | os.PathLike,
                workers: int = 1, *, sync: bool = True, timeout: float = 30.0, trust_pickles: bool = False) -> DcpReshardResult:  # fmt: skip
    """Reshard the DCP checkpoint in `src_dir` to `dst_layout` into `out_dir` (see above;
    `trust_pickles`: see `read_index`).

    Raises:
        DcpError: bad SRC (names file and key, or the class its metadata needs outside the
            pickle allow-list), an existing OUT_DIR, an I/O error writing OUT_DIR.
        PlacementError: a bad layout. CompileError / ExecutionError: planning or execution."""
    out = Path(out_dir)
    if out.exists():
        raise DcpError(f"{out}: already exists (refusing to overwrite)")
    layout = dst_layout if isinstance(dst_layout, MeshLayout) else MeshLayout.from_json(dst_layout)
    clock = {"read": time.perf_counter()}
    index = read_index(src_dir, trust_pickles=trust_pickles)
    src, arrays, values = read_dcp(src_dir, index)
    dst = dst_ptc(src, layout)
    clock["compile"] = time.perf_counter()
    out_arrays, out_values, plan = reshard_arrays(src, arrays, values, dst, workers, timeout=timeout, clock=clock,
                                                  stream=workers == 1)  # fmt: skip
    clock["write"] = time.perf_counter()
    write_dcp(dst, out_arrays, out_values, out, mapping=index.mapping, sync=sync)
    clock["end"] = time.perf_counter()
    steps = list(clock)
    seconds = {k: clock[n] - clock[k] for k, n in zip(steps, steps[1:])}
    stats = plan.stats
    return DcpReshardResult(str(out), workers, plan, stats.host_bytes + stats.network_bytes, seconds)


def reshard_arrays(src: PTC, arrays: Mapping[str, np.ndarray], values: Mapping[str, Mapping[str, Any]], dst: PTC,
                   workers: int = 1, *, timeout: float = 30.0, clock: dict[str, float] | None = None,
                   stream: bool = False) -> tuple[Mapping[str, np.ndarray], dict, Plan]:  # fmt: skip
    """Move a PTC triple (`read_dcp` / `ptc_from_state_dicts` output) into `dst`'s layout:
    (sub-tensor id -> array, partition id -> values, plan), in-process for `workers == 1`, else
    on local agents. `stream` (workers == 1 only) returns a lazy `StreamedArrays` instead of
    arrays. `clock["execute"]` is set when compiling is done (for timings).

    Raises CompileError when src lacks what dst needs; ExecutionError when a run fails."""
    src_h, dst_h = rehome(src, dst, workers)
    plan = compile_plan(src_h, dst_h, CompileOptions(place_ranks=workers > 1))  # placing ranks matters across hosts only
    if clock is not None:
        clock["execute"] = time.perf_counter()
    first_src = {p.id: src_h.allocation.devices_of(p.id)[0] for p in src_h.partitions}
    src_arrays = {(sid, first_src[src_h.partition_of[sid]]): a for sid, a in arrays.items()}
    if stream and workers == 1:
        return StreamedArrays(plan, src_h, dst_h, src_arrays), plan_values(plan, values), plan
    src_values = {(pid, first_src[pid]): v for pid, v in values.items()}
    got_arrays, got_values = execute_steps([(plan, src_h, dst_h)], src_arrays, src_values, workers, timeout, 600.0, None)
    out_arrays, out_values = first_instances(dst_h.with_allocation(plan.allocation), got_arrays, got_values)
    return out_arrays, out_values, plan


@attrs.frozen
class StoredReshard:
    plan: Plan
    bytes_moved: int  # bytes the plan copies between devices (host links + network)
    sent: dict[str, int]  # bytes each host sent over the network
    seconds: dict[str, float]  # plan (read the src PTC, build dst, compile and verify), move (execute + commit)


def reshard_stored(runtime: Any, job: str, src_tag: str, dst_tag: str, dst_layout: MeshLayout | dict | str | os.PathLike,
                   *, hosts: Mapping[int, str] | None = None, records: Mapping[str, Any] | None = None,
                   src_hook: Callable[[PTC], PTC] | None = None, dst_hook: Callable[[PTC], PTC] | None = None) -> StoredReshard:  # fmt: skip
    """Move a DCP state that ranks saved into the agents' stores (`storage.StoreWriter`, tag
    `src_tag`) into `dst_layout` under `dst_tag`, through `runtime` (a `Runtime`): compile and
    verify the plan, execute it peer to peer, commit on every host at once with the new tag's
    PTC and record, so `storage.StoreReader` loads it. `hosts` maps each dst rank to its host
    (default: every rank on the src's first host): rank r keeps device id r where that device is
    on its host, and gets a new id otherwise (ids name one device on both sides of a plan).
    `records` ({name: JSON}) are committed with the tag's own, as `.meta/<name>` on every host.
    `src_hook(src)` may leave holders out of the src (the instances on lost hosts) and
    `dst_hook(dst)` add holders to the dst (store replicas on other hosts) before planning.
    The src tag is only read.

    Raises DcpError (no complete state under `src_tag`), PlacementError, CompileError,
    ExecutionError (naming the host; then `dst_tag` exists nowhere)."""
    from tenplex.ir.serialize import ptc_from_json, ptc_to_json

    start = time.perf_counter()
    meta = runtime.tag_meta(job, src_tag)
    if "ptc" not in meta or "dcp" not in meta:
        raise DcpError(f"/job/{job}/{src_tag}: no complete tenplex DCP state in the agents' stores (hosts {sorted(runtime.agents)})")
    src = ptc_from_json(meta["ptc"])
    if src_hook is not None:
        src = src_hook(src)
    layout = dst_layout if isinstance(dst_layout, MeshLayout) else MeshLayout.from_json(dst_layout)
    dst = dst_ptc(src, layout)
    dst = _on_hosts(src, dst, hosts or {})
    if dst_hook is not None:
        dst = dst_hook(dst)
    plan = compile_plan(src, dst, CompileOptions(place_ranks=False))  # rank r stays rank r: it loads its own partition
    planned = time.perf_counter()
    sent = runtime.execute(plan, src, dst, job, src_tag, dst_tag,
                           meta={**(records or {}), "ptc": ptc_to_json(dst), "dcp": meta["dcp"]})  # fmt: skip
    stats = plan.stats
    return StoredReshard(plan, stats.host_bytes + stats.network_bytes, sent,
                         {"plan": planned - start, "move": time.perf_counter() - planned})  # fmt: skip


def _on_hosts(src: PTC, dst: PTC, hosts: Mapping[int, str]) -> PTC:
    """`dst` (partitions `rank<r>`) with rank r on host `hosts[r]` (see `reshard_stored`)."""
    from tenplex.ir.ptc import Allocation
    from tenplex.ir.topology import Device, Topology

    src_host = {d.id: d.host for d in src.topology.devices}
    first = src.topology.devices[0].host
    fresh = max([*src_host, len(dst.partitions) - 1]) + 1  # above every id kept
    alloc, devices = {}, []
    for p in dst.partitions:
        rank = int(p.id.removeprefix("rank"))
        host = hosts.get(rank, first)
        device = rank if src_host.get(rank, host) == host else fresh
        fresh += device != rank
        alloc[p.id] = (device,)
        devices.append(Device(device, host))
    return PTC(dst.tensors, dst.subtensors, dst.partitions, Allocation(alloc), Topology(tuple(devices)))

