"""An independent judge of plans: is this plan right for (src, dst)? Written without `check_plan`.

`wrongs(plan, src, dst)` returns the reasons a plan is wrong (empty: it is right). It decides by
*executing* the plan on provenance arrays and by recounting, in the plainest way:

- execution: every dst instance (dst under the plan's allocation) starts as NaN; fills are
  applied, then the copies round by round, where every read of a round sees the state at the
  end of the previous round (the runtime runs a round's messages at once, so a copy may not
  read what its own round writes). It runs twice: fills first with messages in order, and fills
  last with messages and their ops in reverse, so overlapping writes show. Every element must
  then equal its global identity (`OFFSET` + a number unique over all tensors), fill elements
  their sub-tensor's fill: float64 holds both exactly, and NaN never equals anything.
- values: each (dst partition, device) gets exactly the dst literal or the value src holds, with
  JSON types compared strictly (1, 1.0 and True differ).
- everything the runtime relies on without executing it: ops are ops; every copy is in exactly
  one message between its devices' hosts with its bytes; message ids are unique, rounds are
  non-negative, order edges go forward in rounds, no host moves more network bytes in a round
  than the budget; the allocation keeps dst's partitions, replica counts and devices; the stats
  are the recounted ones.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from tenplex.compiler.cost import host_lower_bounds, lower_bound_seconds, predict_seconds
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Plan
from tenplex.ir import PTC, Box, TenplexError, itemsize

OFFSET = 1000.0  # identities start above every fill value the strategies draw


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON documents, types included (1 != 1.0 != True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return a == b


def wrongs(plan: Plan, src: PTC, dst: PTC) -> list[str]:
    out: list[str] = []
    try:
        out += _structure(plan, src, dst)
        if not out:
            out += _execution(plan, src, dst)
    except (TenplexError, KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        out.append(f"judging raised {type(e).__name__}: {e}")
    return out


def _structure(plan: Plan, src: PTC, dst: PTC) -> list[str]:
    out = []
    if not all(isinstance(op, (CopyOp, FillOp, ValueOp)) for op in plan.ops):
        return ["an op is not an op"]
    old, new = dict(dst.allocation.items), dict(plan.allocation.items)
    if {p: len(d) for p, d in old.items()} != {p: len(d) for p, d in new.items()} or \
            {d for ds in old.values() for d in ds} != {d for ds in new.values() for d in ds}:  # fmt: skip
        return ["allocation changes partitions, replica counts or devices"]
    host = {d.id: d.host for d in src.topology.union(dst.topology).devices}
    placed = dst.with_allocation(plan.allocation)
    n = len(plan.ops)
    if len({m.id for m in plan.messages}) != len(plan.messages):
        out.append("message ids repeat")
    member: Counter[int] = Counter()
    load: Counter[tuple[int, str]] = Counter()
    for m in plan.messages:
        if m.round < 0:
            out.append(f"message {m.id} has a negative round")
        total = 0
        for i in m.ops:
            op = plan.ops[i] if 0 <= i < n else None
            if not isinstance(op, CopyOp) or (host.get(op.src_device), host.get(op.dst_device)) != (m.src_host, m.dst_host):
                return [f"message {m.id} lists op {i}, not a copy between its hosts"]
            member[i] += 1
            total += op.box.volume * _itemsize(placed, op.dst_subtensor)
        if total != m.bytes:
            out.append(f"message {m.id} bytes")
        if m.src_host != m.dst_host:
            load[(m.round, m.src_host)] += m.bytes
            load[(m.round, m.dst_host)] += m.bytes
    if any(member[i] != 1 for i, op in enumerate(plan.ops) if isinstance(op, CopyOp)):
        out.append("a copy is not in exactly one message")
    if any(v > plan.options.memory_budget_bytes for v in load.values()):
        out.append("over the memory budget")
    round_of = {i: m.round for m in plan.messages for i in m.ops}
    if any(not (0 <= a < n and 0 <= b < n) or round_of.get(a, 0) >= round_of.get(b, 0) for a, b in plan.edges):
        out.append("an order edge does not go forward in rounds")
    if not out and _stats(plan, src, placed, host) != plan.stats:
        out.append("stats differ from the recount")
    return out


def _itemsize(ptc: PTC, sid: str) -> int:
    return itemsize(ptc.tensor_map[ptc.subtensor_map[sid].tensor].dtype)


def _stats(plan: Plan, src: PTC, placed: PTC, host: dict[int, str]):
    moved: Counter[str] = Counter()
    loads: dict[int, Counter] = defaultdict(Counter)
    for m in plan.messages:
        load = loads[m.round]
        if m.src_host != m.dst_host:
            moved["network"] += m.bytes
            load[("network", m.src_host, "out")] += m.bytes
            load[("network", m.dst_host, "in")] += m.bytes
            continue
        for i in m.ops:
            op = plan.ops[i]
            link = "device" if op.src_device == op.dst_device else "host"
            moved[link] += op.box.volume * _itemsize(placed, op.dst_subtensor)
            load[(link, m.dst_host, op.dst_device)] += op.box.volume * _itemsize(placed, op.dst_subtensor)
    fill = sum(op.box.volume * _itemsize(placed, op.dst_subtensor) for op in plan.ops if isinstance(op, FillOp))
    per_host = host_lower_bounds(src, placed)
    topology = src.topology.union(placed.topology)
    return type(plan.stats)(
        moved["device"], moved["host"], moved["network"], fill, sum(per_host.values()),
        predict_seconds((loads[r] for r in sorted(loads)), topology.links), lower_bound_seconds(per_host, topology), len(loads),
    )  # fmt: skip


def identities(ptc: PTC) -> dict[str, np.ndarray]:
    """Each tensor as float64 identities, unique over all tensors of `ptc`."""
    out, at = {}, OFFSET
    for meta in ptc.tensors:
        n = math.prod(meta.shape)
        out[meta.name] = np.arange(at, at + n, dtype=np.float64).reshape(meta.shape)
        at += n
    return out


def _local(ptc: PTC, tensors: dict[str, np.ndarray], sid: str) -> np.ndarray:
    st = ptc.subtensor_map[sid]
    out = np.full(st.shape, st.fill, dtype=np.float64)
    for p in st.pieces:
        _piece(out, p)[...] = tensors[st.tensor][p.global_box.to_slices() + (...,)]
    return out


def _piece(array: np.ndarray, piece) -> np.ndarray:
    local = array[piece.local_box.to_slices() + (...,)]
    return local.reshape(piece.global_box.shape) if piece.flat else local


def _region(array: np.ndarray, piece, box: Box) -> np.ndarray:
    g = piece.global_box
    if box.ndim != g.ndim or not all(a <= c and d <= b for a, b, c, d in zip(g.start, g.stop, box.start, box.stop)):
        raise ValueError(f"box {box} is not inside piece {g}")
    return _piece(array, piece)[box.relative_to(g.start).to_slices() + (...,)]


def _execution(plan: Plan, src: PTC, dst: PTC) -> list[str]:
    placed = dst.with_allocation(plan.allocation)
    tensors = identities(src)
    src_arrays = {(st.id, d): _local(src, tensors, st.id) for st in src.subtensors for d in src.devices_of_subtensor(st.id)}
    want = {(st.id, d): _local(placed, tensors, st.id) for st in placed.subtensors for d in placed.devices_of_subtensor(st.id)}
    for fills_first in (True, False):
        got = _run(plan, src, placed, src_arrays, want, fills_first)
        for key, w in want.items():
            if not np.array_equal(got[key], w):
                return [f"instance {key} differs from the oracle"]
    return _values(plan, src, placed)


def _run(plan: Plan, src: PTC, placed: PTC, src_arrays: dict, want: dict, forward: bool) -> dict:
    got = {key: np.full(w.shape, np.nan) for key, w in want.items()}
    fills = [op for op in plan.ops if isinstance(op, FillOp)]
    by_round: dict[int, list] = defaultdict(list)
    for m in plan.messages if forward else reversed(plan.messages):
        by_round[m.round] += [plan.ops[i] for i in (m.ops if forward else reversed(m.ops))]
    if forward:
        _fill(got, fills)
    for r in sorted(by_round):
        reads = []
        for op in by_round[r]:
            side, arrays = (src, src_arrays) if op.src_side == "src" else (placed, got)
            reads.append(_region(arrays[(op.src_subtensor, op.src_device)], side.subtensor_map[op.src_subtensor].pieces[op.src_piece], op.box).copy())
        for op, data in zip(by_round[r], reads):
            piece = placed.subtensor_map[op.dst_subtensor].pieces[op.dst_piece]
            _region(got[(op.dst_subtensor, op.dst_device)], piece, op.box)[...] = data
    if not forward:
        _fill(got, fills)
    return got


def _fill(got: dict, fills: list[FillOp]) -> None:
    for op in fills:
        array = got[(op.dst_subtensor, op.dst_device)]
        if op.box.ndim != array.ndim or any(b > s for b, s in zip(op.box.stop, array.shape)):
            raise ValueError(f"fill box {op.box} is not inside local shape {array.shape}")
        array[op.box.to_slices() + (...,)] = op.value


def _values(plan: Plan, src: PTC, placed: PTC) -> list[str]:
    held = {(p.id, d): dict(p.values) for p in src.partitions for d in src.allocation.devices_of(p.id)}
    got: dict[tuple[str, int], dict] = {}
    for op in plan.ops:
        if isinstance(op, ValueOp):
            value = op.value if op.src_partition is None else held[(op.src_partition, op.src_device)][op.name].value
            got.setdefault((op.dst_partition, op.dst_device), {})[op.name] = value
    literal = {n: v.value for p in src.partitions for n, v in p.values}
    want = {
        (p.id, d): {n: literal[n] if v.value is None and v.policy == "replicated" else v.value for n, v in p.values}
        for p in placed.partitions for d in placed.allocation.devices_of(p.id) if p.values
    }  # fmt: skip
    return [] if same_json(got, want) else [f"values {got} differ from {want}"]
