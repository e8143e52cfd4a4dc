"""`load_dcp(state_dict, src_dir)`: tenplex as DCP's loader, for one rank of a live job.

A drop-in for `torch.distributed.checkpoint.load(state_dict, checkpoint_id=src_dir)` on state
dicts of DTensors (Shard/Replicate on any mesh), plain tensors (loaded whole) and other values:
the rank's tensors are filled in place. Instead of `torch.load`ing every saved chunk that
overlaps a local shard in full and then narrowing it (DCP's load-time resharding), tenplex
compiles a plan from the checkpoint's PTC (`read_dcp` with memory maps: no data is read up
front) to a PTC holding only this rank's partition, and copies each planned region straight
from the mapped `.distcp` bytes into the local tensors: every needed byte is read once, and
nothing else.

The plan is applied in-process by `tenplex.runtime.checkpoint.apply` (the runtime's region helpers, writing into the
caller's tensors, which the runtime's executor — it allocates its outputs — cannot). Ranks work
independently; no collective is used.

Raises DcpError (a bad checkpoint; names file and key), PlacementError (a tensor whose shape or
dtype differs from the checkpoint, or a key it lacks), CompileError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch.distributed.checkpoint._traverse import set_element

from tenplex.compiler import CompileOptions, compile_plan
from tenplex.frameworks.dcp.read import read_dcp, read_index
from tenplex.frameworks.dtensor.boxes import PlacementError
from tenplex.frameworks.dtensor.layout import LocalShard, partition_id, subtensor_id
from tenplex.frameworks.dtensor.state import flatten, local_state
from tenplex.frameworks.dtensor.values import python_value
from tenplex.ir.box import Box
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.tensor import Piece, SubTensor
from tenplex.runtime.checkpoint.apply import apply_ops, ops_by_dst, plan_values
from tenplex.runtime.reshard import rehome


def load_dcp(state_dict: Mapping[str, Any], src_dir: str | os.PathLike, *, rank: int | None = None,
             trust_pickles: bool = False) -> None:  # fmt: skip
    """Fill this rank's `state_dict` from the DCP checkpoint in `src_dir` (see above).
    `rank` defaults to the process group rank (0 without a process group); `trust_pickles`:
    see `read_index`."""
    if rank is None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    index = read_index(src_dir, trust_pickles=trust_pickles)
    src, arrays, values = read_dcp(src_dir, index)
    _, mapping = flatten(state_dict)
    dst, targets = _rank_ptc(src, local_state(state_dict, rank), rank)
    src_h, dst_h = rehome(src, dst, 1)
    plan = compile_plan(src_h, dst_h, CompileOptions(place_ranks=False))  # one rank: nothing to place
    first = {p.id: src_h.allocation.devices_of(p.id)[0] for p in src_h.partitions}
    src_arrays = {(sid, first[src_h.partition_of[sid]]): a for sid, a in arrays.items()}
    placed = dst_h.with_allocation(plan.allocation)
    for sid, ops in ops_by_dst(plan, dst_h).items():
        apply_ops(ops, src_h, placed, src_arrays, targets[sid])
    for name, value in plan_values(plan, values).get(partition_id(rank), {}).items():
        set_element(state_dict, mapping[name], python_value(value))  # type: ignore[arg-type]


def _rank_ptc(src: PTC, local: dict[str, Any], rank: int) -> tuple[PTC, dict[str, np.ndarray]]:
    """A PTC with one partition, this rank's, and the arrays (views of the state dict's
    tensors) its sub-tensors write into. Raises PlacementError on keys or shapes that differ."""
    subtensors, targets, names = [], {}, {}
    for fqn, leaf in sorted(local.items()):
        meta = src.tensor_map.get(fqn)
        if isinstance(leaf, (LocalShard, np.ndarray)):
            box, array, shape, dtype = _target(fqn, leaf, rank)
            if meta is None or meta.shape != shape or meta.dtype != dtype:
                have = "nothing" if meta is None else f"{meta.dtype}{list(meta.shape)}"
                raise PlacementError(f"{fqn}: the state dict holds {dtype}{list(shape)} but the checkpoint has {have}")
            if box is None:
                continue
            sid = subtensor_id(fqn, rank)
            pieces = (Piece(box, Box.from_shape(box.shape)),) if box.volume else ()
            subtensors.append(SubTensor(sid, fqn, fqn, box.shape, pieces))
            targets[sid] = array
        else:
            if not any(fqn in p.value_map for p in src.partitions):
                raise PlacementError(f"{fqn}: the checkpoint has no value for this key")
            names[fqn] = Value()
    used = sorted({st.tensor for st in subtensors})
    part = Partition(partition_id(rank), [st.id for st in subtensors], names)
    ptc = PTC([src.tensor_map[n] for n in used], subtensors, [part], Allocation({part.id: (0,)}), src.topology)
    return ptc, targets


def _target(fqn: str, leaf: LocalShard | np.ndarray, rank: int) -> tuple[Box | None, np.ndarray | None, tuple, str]:
    if isinstance(leaf, np.ndarray):
        return Box.from_shape(leaf.shape), leaf, tuple(leaf.shape), str(leaf.dtype)
    return leaf.spec(fqn).box_of_rank(rank), leaf.array, leaf.global_shape, leaf.dtype
