"""Apply a compiled plan into buffers the caller owns, one dst sub-tensor at a time.

The runtime's executor allocates every dst array before it copies, and copies every instance.
Offline writers need less: a checkpoint stores each dst sub-tensor once, and its bytes can go
straight into a file (`checkpoint.planned`), a live rank's own tensors (`load_dcp`) or a scratch
buffer that DCP's writer serializes (`dcp.apply.StreamedArrays`). `ops_by_dst` picks the ops of
one instance per dst sub-tensor, `apply_ops` runs them into an array with the runtime's region
helpers (`source_region`, `target_region`, `view`), `plan_values` gives the dst values; no
decision is made here.

Invariants:
- each dst sub-tensor is produced from one instance's ops that read only src state (a plan
  where every instance needs a forward raises ExecutionError; one-host plans have none);
- every dst sub-tensor is produced from its own ops only: its fills, then its copies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from tenplex.compiler import CopyOp, FillOp, Plan, ValueOp
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import view
from tenplex.runtime.executor import source_region, target_region

__all__ = ["apply_ops", "ops_by_dst", "plan_values"]


def ops_by_dst(plan: Plan, dst: PTC) -> dict[str, list[CopyOp | FillOp]]:
    """Dst sub-tensor id -> the fill and copy ops of one of its instances: the first, in its
    partition's device order, that reads only src state (replicas hold the same bytes; others
    may be forwarded from it). Raises ExecutionError when every instance needs a forward."""
    by_instance: dict[tuple[str, int], list[CopyOp | FillOp]] = defaultdict(list)
    for op in plan.ops:
        if isinstance(op, FillOp):
            by_instance[(op.dst_subtensor, op.dst_device)].insert(0, op)
        elif isinstance(op, CopyOp):
            by_instance[(op.dst_subtensor, op.dst_device)].append(op)
    placed = dst.with_allocation(plan.allocation)
    out: dict[str, list[CopyOp | FillOp]] = {}
    for st in placed.subtensors:
        devices = placed.devices_of_subtensor(st.id)
        direct = [d for d in devices if all(getattr(op, "src_side", "src") == "src" for op in by_instance[(st.id, d)])]
        if not direct:
            raise ExecutionError(f"every instance of dst sub-tensor {st.id!r} (devices {list(devices)}) reads forwarded dst state; only one-host plans apply here")
        out[st.id] = by_instance[(st.id, direct[0])]
    return out


def apply_ops(ops: list[CopyOp | FillOp], src: PTC, dst: PTC, src_arrays: Mapping, target: np.ndarray) -> None:
    """Write one dst sub-tensor's ops (from `ops_by_dst`) into `target`, its local array."""
    for op in ops:
        dst_arrays = {(op.dst_subtensor, op.dst_device): target}
        if isinstance(op, FillOp):
            view(target, op.box)[...] = op.value
        else:
            target_region(op, dst, dst_arrays)[...] = source_region(op, src, dst, src_arrays, dst_arrays)


def plan_values(plan: Plan, values: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Dst partition id -> {name: value}, from the plan's value ops and src partition values."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for op in plan.ops:
        if isinstance(op, ValueOp):
            out[op.dst_partition][op.name] = op.value if op.src_partition is None else values[op.src_partition][op.name]
    return dict(out)
