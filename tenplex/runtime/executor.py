"""Executes a `Plan` over numpy buffers, round by round, through a `Transport`.

Op handlers are transport-agnostic: `pack` turns a message's copies into one contiguous buffer
read from the source arrays, `unpack` writes such a buffer into the dst arrays. A transport only
moves buffers between hosts (in-process here; UCX in the runtime). The executor makes no
planning decision: it interprets ops exactly as the plan says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import numpy as np

from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Message, Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.arrays import empty_local, region, view

Instance = tuple[str, int]  # (sub-tensor id, device)


class Transport(Protocol):
    def deliver(self, message: Message, payload: np.ndarray) -> np.ndarray:
        """Move `payload` from the message's src host to its dst host; return the received buffer."""
        ...


@attrs.frozen
class State:
    """Arrays of sub-tensor instances and values of partition instances."""

    arrays: dict[Instance, np.ndarray]
    values: dict[tuple[str, int], dict[str, Any]] = attrs.field(factory=dict)


class Executor:
    def __init__(self, plan: Plan, src: PTC, dst: PTC, transport: Transport):
        self.plan, self.src, self.transport = plan, src, transport
        self.dst = dst.with_allocation(plan.allocation)

    def run(self, src_state: State) -> State:
        out = State({(st.id, d): empty_local(self.dst, st) for st in self.dst.subtensors for d in self.dst.devices_of_subtensor(st.id)})
        for op in self.plan.ops:
            if isinstance(op, FillOp):
                view(out.arrays[(op.dst_subtensor, op.dst_device)], op.box)[...] = op.value
            elif isinstance(op, ValueOp):
                self._value(op, src_state, out)
        by_round: dict[int, list[Message]] = defaultdict(list)
        for m in self.plan.messages:
            by_round[m.round].append(m)
        for r in sorted(by_round):
            for m in by_round[r]:
                self._message(m, src_state, out)
        return out

    def _value(self, op: ValueOp, src_state: State, out: State) -> None:
        if op.src_partition is None:
            value = op.value
        else:
            value = src_state.values[(op.src_partition, op.src_device)][op.name]
        out.values.setdefault((op.dst_partition, op.dst_device), {})[op.name] = value

    def _message(self, m: Message, src_state: State, out: State) -> None:
        ops = [self.plan.ops[i] for i in m.ops]
        try:
            if m.src_host == m.dst_host:  # same host: copy region to region, no buffer
                for op in ops:
                    target_region(op, self.dst, out.arrays)[...] = source_region(op, self.src, self.dst, src_state.arrays, out.arrays)
                return
            payload = pack(ops, self.src, self.dst, src_state.arrays, out.arrays)
            received = self.transport.deliver(m, payload)
            unpack(ops, self.dst, out.arrays, received)
        except (KeyError, ValueError) as e:
            raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}, ops {list(m.ops)[:4]}...) failed: {e!r}") from e


def source_region(op: CopyOp, src: PTC, dst: PTC, src_arrays: Mapping, dst_arrays: Mapping) -> np.ndarray:
    """The view a copy reads: its box in the src state, or in a dst array for a forward."""
    ptc, arrays = (src, src_arrays) if op.src_side == "src" else (dst, dst_arrays)
    piece = ptc.subtensor_map[op.src_subtensor].pieces[op.src_piece]
    return region(arrays[(op.src_subtensor, op.src_device)], piece, op.box)


def target_region(op: CopyOp, dst: PTC, dst_arrays: Mapping) -> np.ndarray:
    """The view a copy writes: its box in its dst piece."""
    return region(dst_arrays[(op.dst_subtensor, op.dst_device)], dst.subtensor_map[op.dst_subtensor].pieces[op.dst_piece], op.box)


def pack(ops: list[CopyOp], src: PTC, dst: PTC, src_arrays: Mapping, dst_arrays: Mapping,
         out: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """One contiguous byte buffer holding every op's region, in op order (`out`, if given, must
    be a uint8 buffer of exactly that size)."""
    parts = [source_region(op, src, dst, src_arrays, dst_arrays) for op in ops]
    total = sum(p.nbytes for p in parts)
    if out is None:
        out = np.empty(total, dtype=np.uint8)
    elif out.nbytes != total:
        raise ExecutionError(f"pack buffer has {out.nbytes} bytes but the ops take {total}")
    at = 0
    for p in parts:
        out[at : at + p.nbytes].view(p.dtype).reshape(p.shape)[...] = p
        at += p.nbytes
    return out


def unpack(ops: list[CopyOp], dst: PTC, dst_arrays: Mapping, buffer: np.ndarray) -> None:
    at = 0
    for op in ops:
        target = target_region(op, dst, dst_arrays)
        n = target.nbytes
        if at + n > buffer.nbytes:
            raise ExecutionError(f"message buffer of {buffer.nbytes} bytes is too short for op writing {op.tensor!r} box {op.box}")
        target[...] = buffer[at : at + n].view(target.dtype).reshape(target.shape)
        at += n
    if at != buffer.nbytes:
        raise ExecutionError(f"message buffer has {buffer.nbytes} bytes but its ops take {at}")
