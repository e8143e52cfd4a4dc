"""One agent's share of a plan, round by round: the parsed execution and the three kinds of work.

`Execution` holds what `Agent.prepare` parsed (plan, PTCs, views of this host's src and dst
arrays, the prefaulter) and times each activity. A round runs `fills_and_values` (round 0),
then `local` for each message within this host (region to region), then `network` for all the
round's messages to and from other hosts at once (`UcxPeer.exchange`; direct parts zero-copy,
the rest packed through the scratch pool, see `parts`). Every failure is an ExecutionError
naming the op or message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Message, Plan
from tenplex.ir.errors import ExecutionError
from tenplex.ir.ptc import PTC
from tenplex.runtime.agent import parts
from tenplex.runtime.arrays import np_dtype, view
from tenplex.runtime.executor import pack, source_region, target_region, unpack
from tenplex.runtime.store.layout import Instance, staging_tag, value_path
from tenplex.runtime.store.tree import TensorStore


class Execution:
    """One plan being executed by this host: parsed plan, PTCs, and views of its arrays."""

    def __init__(self, host: str, job: str, src_tag: str, dst_tag: str, plan: Plan, src: PTC, dst: PTC):
        self.host, self.job, self.src_tag, self.dst_tag = host, job, src_tag, dst_tag
        self.plan, self.src, self.dst = plan, src, dst.with_allocation(plan.allocation)
        self.topology = src.topology.union(dst.topology)
        self.host_of = self.topology.host_of
        self.staging = staging_tag(dst_tag)
        self.src_arrays: dict[Instance, np.ndarray] = {}
        self.dst_arrays: dict[Instance, np.ndarray] = {}
        self.rounds_done: set[int] = set()
        self.seconds: dict[str, float] = {}  # time per activity: local, pack, exchange, unpack
        self.first_round: dict[Instance, int] = {}  # dst array -> the first round that writes it
        self.prefaulter: parts.Prefaulter | None = None

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0


def guard(m: Message, fn: Callable[[], Any]) -> Any:
    """`fn()`, with any failure re-raised as an ExecutionError naming message `m`."""
    try:
        return fn()
    except Exception as e:
        ops = list(m.ops)
        raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}, round {m.round}, ops {ops[:4]}"
                             f"{'...' if len(ops) > 4 else ''}) failed: {type(e).__name__}: {e}") from e  # fmt: skip


def fills_and_values(ex: Execution, store: TensorStore, values: Mapping[int, Any]) -> None:
    """Round 0: this host's fill ops, and its value ops (`values`: {op id: src value} gathered by the runtime)."""
    for i, op in enumerate(ex.plan.ops):
        if isinstance(op, (FillOp, ValueOp)) and ex.host_of(op.dst_device) == ex.host:
            try:
                if isinstance(op, FillOp):
                    view(ex.dst_arrays[(op.dst_subtensor, op.dst_device)], op.box)[...] = op.value
                else:
                    value = op.value if op.src_partition is None else values[i]
                    path = value_path(ex.job, ex.staging, op.dst_device, op.dst_partition, op.name)
                    store.put(path, value, replace=True)
            except Exception as e:
                raise ExecutionError(
                    f"op {i} ({type(op).__name__} on device {op.dst_device}) failed: {type(e).__name__}: {e}"
                ) from e


def local(ex: Execution, messages: list[Message]) -> Iterator[None]:
    """The messages within this host, one op (region to region) per step: a generator, so that
    `network` can interleave the copies with the round's transfers."""
    for m in messages:
        for i in m.ops:
            op = ex.plan.ops[i]
            try:
                with ex.timed("local"):
                    _target(op, ex)[...] = _source(op, ex)
            except Exception as e:
                raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}, round {m.round}), op {i} (copy of "
                                     f"{op.tensor!r} box {op.box}, device {op.src_device} -> {op.dst_device}): "
                                     f"{type(e).__name__}: {e}") from e  # fmt: skip
            yield


def network(ex: Execution, messages: list[Message], peer: Any, endpoint: Callable[[str], Any],
            scratch: parts.Scratch, work: Iterator[None] | None = None) -> int:  # fmt: skip
    """Exchange this round's network messages with every peer at once; returns bytes sent.

    Single-op parts go from src views and into dst views where those are contiguous; the rest
    is packed into and unpacked from the scratch pool (see `parts`). `work` (the round's local
    copies) runs while the transfers progress."""
    sends: list = []
    recvs: list = []
    expect: list[tuple[Message, np.ndarray | None, list[CopyOp], int]] = []  # (message, buffer to unpack, ops, bytes)
    with ex.timed("pack"):
        layout = [(m, *parts.split([(i, ex.plan.ops[i]) for i in m.ops], ex.src, ex.dst)) for m in messages]
        with ex.timed("scratch"):
            scratch.reserve(
                sum(_scratch_bytes(m.src_host == ex.host, singles, packed, ex) for m, singles, packed in layout)
            )
        for m, singles, packed in layout:
            outgoing = m.src_host == ex.host
            ep = endpoint(m.dst_host if outgoing else m.src_host)
            pieces = [(parts.SINGLE | sg.op_id, [sg.op], sg.src_contiguous if outgoing else sg.dst_contiguous, sg.nbytes)
                      for sg in singles]  # fmt: skip
            if packed:
                pieces.append((m.id, packed, False, _nbytes(packed, ex)))
            for tag, ops, in_place, nbytes in pieces:
                if outgoing:
                    sends.append((ep, _outgoing(ex, m, ops, in_place, scratch, nbytes), tag))
                else:
                    buffer = guard(m, lambda op=ops[0]: _target(op, ex)) if in_place else scratch.take(nbytes)
                    recvs.append((ep, buffer, tag))
                    expect.append((m, None if in_place else buffer, ops, nbytes))
    try:
        with ex.timed("exchange"):
            got = peer.exchange(sends, recvs, work=work)
    except ExecutionError:
        raise
    except Exception as e:
        ids = [m.id for m in messages]
        raise ExecutionError(f"round {messages[0].round}: exchanging messages {ids[:8]}{'...' if len(ids) > 8 else ''}"
                             f" with peers failed: {type(e).__name__}: {e}") from e  # fmt: skip
    with ex.timed("unpack"):
        for (m, buffer, ops, nbytes), received in zip(expect, got):
            if received.data.nbytes != nbytes:
                raise ExecutionError(f"message {m.id} ({m.src_host} -> {m.dst_host}): received "
                                     f"{received.data.nbytes} B for ops {ops[:1]}..., expected {nbytes} B")  # fmt: skip
            if buffer is not None:
                guard(m, lambda ops=ops, buffer=buffer: unpack(ops, ex.dst, ex.dst_arrays, buffer))
    return sum(p.nbytes for _, p, _ in sends)


def _outgoing(ex: Execution, m: Message, ops: list[CopyOp], in_place: bool, scratch: parts.Scratch,
              nbytes: int) -> np.ndarray:  # fmt: skip
    """What a part sends: its one op's source view (in place), or the ops packed into scratch."""
    if in_place:
        return guard(m, lambda: _source(ops[0], ex))
    buffer = scratch.take(nbytes)
    guard(m, lambda: pack(ops, ex.src, ex.dst, ex.src_arrays, ex.dst_arrays, buffer))
    return buffer


def _scratch_bytes(outgoing: bool, singles: list[parts.Single], packed: list[CopyOp], ex: Execution) -> int:
    """Scratch a message needs on this side: its packed ops, and singles not contiguous here."""
    copied = sum(sg.nbytes for sg in singles if not (sg.src_contiguous if outgoing else sg.dst_contiguous))
    return copied + _nbytes(packed, ex)


def _source(op: CopyOp, ex: Execution) -> np.ndarray:
    return source_region(op, ex.src, ex.dst, ex.src_arrays, ex.dst_arrays)


def _target(op: CopyOp, ex: Execution) -> np.ndarray:
    return target_region(op, ex.dst, ex.dst_arrays)


def first_rounds(ex: Execution) -> dict[Instance, int]:
    """The first round writing each of this host's dst arrays (0 for arrays with fills)."""
    first: dict[Instance, int] = {}
    for m in ex.plan.messages:
        for i in m.ops:
            op = ex.plan.ops[i]
            key = (op.dst_subtensor, op.dst_device)
            if key in ex.dst_arrays:
                first[key] = min(first.get(key, m.round), m.round)
    for op in ex.plan.ops:
        if isinstance(op, FillOp) and (op.dst_subtensor, op.dst_device) in ex.dst_arrays:
            first[(op.dst_subtensor, op.dst_device)] = 0
    return first


def _nbytes(ops: list[CopyOp], ex: Execution) -> int:
    """Bytes of the ops' boxes (their packed size)."""
    return sum(op.box.volume * np_dtype(ex.dst.tensor_map[op.tensor].dtype).itemsize for op in ops)
