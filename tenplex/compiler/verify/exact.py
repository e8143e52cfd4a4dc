"""`check_plan_exact`: every check of `check_plan` (the package docstring), one op and one
message at a time, raising `PlanVerifyError` that names the first broken thing. `_Checker` also
holds the side tables (`_with_allocation`, pieces, hosts) that `verify.columns` reads."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from tenplex.compiler.cost import host_lower_bounds, lower_bound_seconds, predict_seconds, round_loads
from tenplex.compiler.nogc import without_gc
from tenplex.compiler.ops import CopyOp, FillOp, ValueOp
from tenplex.compiler.plan import Plan
from tenplex.ir.box import Box
from tenplex.ir.errors import IRError, PlanVerifyError
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs


@without_gc
def check_plan_exact(plan: Plan, src: PTC, dst: PTC) -> None:
    """`check_plan` one op and message at a time: raises naming the first broken thing."""
    try:
        dst = _with_allocation(dst, plan.allocation)
        c = _Checker(plan, src, dst)
        c.ops()
        c.cover()
        c.values(enumerate(plan.ops))
        c.messages()
        c.stats()
    except IRError as e:  # e.g. a device on two hosts: the plan cannot be checked, so it fails
        raise PlanVerifyError(f"plan cannot be checked: {e}") from None


def same_json(a: object, b: object) -> bool:
    """Equal as JSON data, types included: 1, 1.0 and True differ (a job reading its iteration
    back would get another type); a list equals a tuple of equal items (JSON has arrays only)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)  # type: ignore[attr-defined]
    return bool(a == b)


def _same_number(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN fills NaN


def _with_allocation(dst: PTC, alloc) -> PTC:
    old = {pid: len(devs) for pid, devs in dst.allocation.items}
    new = {pid: len(devs) for pid, devs in alloc.items}
    if old != new:
        raise PlanVerifyError(f"plan allocation {dict(alloc.items)} does not keep dst's partitions and replica counts {old}")
    if sorted(alloc.by_device) != sorted(dst.allocation.by_device):
        raise PlanVerifyError(f"plan allocation uses devices {sorted(alloc.by_device)}, dst uses {sorted(dst.allocation.by_device)}")
    try:
        return dst.with_allocation(alloc)
    except IRError as e:
        raise PlanVerifyError(f"plan allocation is invalid for dst: {e}") from None


class _Checker:
    def __init__(self, plan: Plan, src: PTC, dst: PTC):
        self.plan, self.src, self.dst = plan, src, dst
        self.topology = src.topology.union(dst.topology)
        self.writes: dict[tuple[str, int, int], list[Box]] = defaultdict(list)
        self.pieces: dict[tuple[str, str, int, int], tuple[str, Box]] = {}  # checked (side, sid, device, piece) -> (tensor, global box)
        self.same_meta: set[str] = set()  # tensors whose src and dst shape and dtype were compared
        self.fills: dict[tuple[str, int], list[Box]] = defaultdict(list)
        self.preds: dict[int, list[int]] = defaultdict(list)
        for a, b in plan.edges:
            self.preds[b].append(a)

    def fail(self, msg: str) -> PlanVerifyError:
        return PlanVerifyError(msg)

    def holds(self, ptc: PTC, sid: str, device: int) -> bool:
        parts = ptc.partition_of
        return sid in parts and device in ptc.allocation.mapping[parts[sid]]

    def ops(self) -> None:
        for i, op in enumerate(self.plan.ops):
            if isinstance(op, CopyOp):
                self.copy(i, op)
            elif isinstance(op, FillOp):
                self.fill(i, op)
        rounds = self.plan.round_of
        for a, b in self.plan.edges:
            if not 0 <= a < len(self.plan.ops) or not 0 <= b < len(self.plan.ops) or rounds.get(a, 0) >= rounds.get(b, 0):
                raise self.fail(f"order edge {a} -> {b} does not go from an op to an op in a later round (so the plan may have a cycle)")

    def copy(self, i: int, op: CopyOp) -> None:
        tensor, box = op.tensor, op.box
        dst_tensor, dst_box = self.piece(self.dst, "dst", op.dst_subtensor, op.dst_device, op.dst_piece, f"op {i} writes")
        if dst_tensor != tensor:
            raise self.fail(f"op {i} writes tensor {tensor!r} into dst sub-tensor {op.dst_subtensor!r} of tensor {dst_tensor!r}")
        meta = self.dst.tensor_map[tensor]
        if len(box.start) != len(meta.shape):
            raise self.fail(f"op {i} copies {tensor!r} box {box} of {box.ndim} dims, but the tensor has {len(meta.shape)} (shape {meta.shape})")
        if not dst_box.contains(box):
            raise self.fail(f"op {i} writes {tensor!r} box {box} outside dst piece {dst_box} of {op.dst_subtensor!r}")
        side = self.src if op.src_side == "src" else self.dst
        src_tensor, src_box = self.piece(side, op.src_side, op.src_subtensor, op.src_device, op.src_piece, f"op {i} reads {op.src_side}")
        if src_tensor != tensor or not src_box.contains(box):
            raise self.fail(f"op {i} reads {tensor!r} box {box} from {op.src_side} sub-tensor {op.src_subtensor!r} piece {op.src_piece}, which holds {src_tensor!r} box {src_box}")
        if op.src_side == "dst":
            self.forward(i, op)
        elif tensor not in self.same_meta:
            have = self.src.tensor_map[tensor]
            if have != meta:
                raise self.fail(f"op {i} copies tensor {tensor!r}, which is {have.dtype}{list(have.shape)} in src but {meta.dtype}{list(meta.shape)} in dst")
            self.same_meta.add(tensor)
        self.writes[(op.dst_subtensor, op.dst_device, op.dst_piece)].append(box)

    def piece(self, ptc: PTC, side: str, sid: str, device: int, piece: int, what: str) -> tuple[str, Box]:
        """(tensor, global box) of a piece that `device` holds (checked once per piece and device)."""
        key = (side, sid, device, piece)
        found = self.pieces.get(key)
        if found is None:
            st = self.piece_owner(ptc, sid, device, piece, what)
            found = self.pieces[key] = (st.tensor, st.pieces[piece].global_box)
        return found

    def forward(self, i: int, op: CopyOp) -> None:
        for p in self.preds[i]:
            prev = self.plan.ops[p] if 0 <= p < len(self.plan.ops) else None  # an edge from no op wrote nothing
            if (isinstance(prev, CopyOp) and (prev.dst_subtensor, prev.dst_device, prev.dst_piece) == (op.src_subtensor, op.src_device, op.src_piece)
                    and prev.box.contains(op.box) and self.plan.round_of.get(p, 0) < self.plan.round_of.get(i, 0)):  # fmt: skip
                return
        raise self.fail(f"op {i} forwards {op.tensor!r} box {op.box} from dst {op.src_subtensor!r} on device {op.src_device}, but no order-edge predecessor in an earlier round wrote it there")

    def piece_owner(self, ptc: PTC, sid: str, device: int, piece: int, what: str):
        st = ptc.subtensor_map.get(sid)
        if st is None or not self.holds(ptc, sid, device):
            raise self.fail(f"{what} sub-tensor {sid!r} on device {device}, which does not hold it")
        if not 0 <= piece < len(st.pieces):
            raise self.fail(f"{what} piece {piece} of sub-tensor {sid!r}, which has {len(st.pieces)} pieces")
        return st

    def fill(self, i: int, op: FillOp) -> None:
        st = self.dst.subtensor_map.get(op.dst_subtensor)
        if st is None or not self.holds(self.dst, op.dst_subtensor, op.dst_device):
            raise self.fail(f"op {i} fills sub-tensor {op.dst_subtensor!r} on device {op.dst_device}, which does not hold it")
        if not _same_number(op.value, st.fill) or op.box.ndim != len(st.shape) or not st.local_box.contains(op.box):
            raise self.fail(f"op {i} fills {op.dst_subtensor!r} local box {op.box} with {op.value}; expected fill {st.fill} inside shape {st.shape}")
        self.fills[(op.dst_subtensor, op.dst_device)].append(op.box)

    def cover(self) -> None:
        writes = self.writes
        for st in self.dst.subtensors:
            pieces = [p.local_box for p in st.pieces]
            gap = st.volume - sum(b.volume for b in pieces)
            for d in self.dst.devices_of_subtensor(st.id):
                for j, piece in enumerate(st.pieces):
                    boxes = writes.get((st.id, d, j), [])
                    if len(boxes) != 1 or boxes[0].volume != piece.global_box.volume:  # else one write inside fills it
                        self.exact(st.tensor, st.id, d, (j, piece.global_box), piece.global_box.volume, boxes)
                self.cover_fills(st, d, pieces, gap)

    def cover_fills(self, st, d: int, pieces: list[Box], gap: int) -> None:
        """The fills of `st` on device `d` cover the `gap` elements outside its `pieces` once."""
        fills = self.fills.get((st.id, d), [])
        if not fills and not gap:
            return
        for fi, pi in overlapping_pairs(fills, pieces) if fills else ():
            raise self.fail(f"fill of {st.id!r} on device {d} local box {fills[fi]} overlaps piece local box {pieces[pi]}")
        self.exact(st.tensor, st.id, d, st.shape, gap, fills)

    def exact(self, tensor: str, sid: str, device: int, where: tuple, volume: int, boxes: list[Box]) -> None:
        """`boxes` (already known inside the region) cover it exactly once. `where` is
        (piece index, global box) for a piece, or the local shape for the fill region."""
        pairs = overlapping_pairs(boxes, boxes) if len(boxes) > 1 else ()
        what = lambda: f"piece {where[0]} {where[1]}" if len(where) == 2 and isinstance(where[1], Box) else f"fill region of shape {where}"  # noqa: E731
        for a, b in pairs:
            if a < b:
                raise self.fail(f"tensor {tensor!r} sub-tensor {sid!r} on device {device}: {what()} is written twice at {boxes[a].intersect(boxes[b])} (boxes {boxes[a]} and {boxes[b]})")
        got = sum(b.volume for b in boxes)
        if got != volume:
            raise self.fail(f"tensor {tensor!r} sub-tensor {sid!r} on device {device}: {what()} has {volume} elements but the plan writes {got}")

    def values(self, ops: Iterable[tuple[int, object]]) -> None:
        """Check the value ops among `ops` ((id, op) pairs: all of the plan's value ops), and
        that each value of each dst partition on each device is set once."""
        seen: Counter[tuple[str, int, str]] = Counter()
        for i, op in ops:
            if isinstance(op, ValueOp):
                self.value(i, op)
                seen[(op.dst_partition, op.dst_device, op.name)] += 1
        for part in self.dst.partitions:
            for d in self.dst.allocation.devices_of(part.id):
                for name, _ in part.values:
                    if seen[(part.id, d, name)] != 1:
                        raise self.fail(f"value {name!r} of partition {part.id!r} on device {d} is set {seen[(part.id, d, name)]} times")

    def value(self, i: int, op: ValueOp) -> None:
        part = self.dst.partition_map.get(op.dst_partition)
        if part is None or op.dst_device not in self.dst.allocation.devices_of(part.id) or op.name not in part.value_map:
            raise self.fail(f"op {i} sets value {op.name!r} of partition {op.dst_partition!r} on device {op.dst_device}, which does not hold it")
        want = part.value_map[op.name]
        inherit = want.value is None and want.policy == "replicated"
        if op.src_partition is None:
            if inherit or not same_json(op.value, want.value):
                raise self.fail(f"op {i} sets value {op.name!r} of {op.dst_partition!r} to {op.value!r}; dst wants {'it inherited from src' if inherit else repr(want.value)}")
            return
        srcp = self.src.partition_map.get(op.src_partition)
        if not inherit or srcp is None or op.src_device not in self.src.allocation.devices_of(srcp.id) or op.name not in srcp.value_map:
            raise self.fail(f"op {i} copies value {op.name!r} from src partition {op.src_partition!r} on device {op.src_device}, which does not hold it (or dst does not inherit it)")

    def messages(self) -> None:
        in_message: Counter[int] = Counter()
        budget = self.plan.options.memory_budget_bytes
        load: dict[tuple[int, str], int] = defaultdict(int)
        host = {d.id: d.host for d in self.topology.devices}  # ops() checked every copy's devices
        size = self.dst.itemsizes
        ops, n = self.plan.ops, len(self.plan.ops)
        for m in self.plan.messages:
            if m.round < 0:
                raise self.fail(f"message {m.id} has negative round {m.round}")
            total = 0
            ends = (m.src_host, m.dst_host)
            for i in m.ops:
                op = ops[i] if 0 <= i < n else None
                if not isinstance(op, CopyOp):
                    raise self.fail(f"message {m.id} lists op {i}, which is not a copy")
                hosts = (host[op.src_device], host[op.dst_device])
                if hosts != ends:
                    raise self.fail(f"message {m.id} goes {m.src_host} -> {m.dst_host} but op {i} goes {hosts[0]} -> {hosts[1]}")
                total += op.box.volume * size[op.tensor]
            in_message.update(m.ops)
            if total != m.bytes:
                raise self.fail(f"message {m.id} says {m.bytes} bytes but its ops hold {total}")
            if m.src_host != m.dst_host:
                load[(m.round, m.src_host)] += m.bytes
                load[(m.round, m.dst_host)] += m.bytes
        for i, op in enumerate(self.plan.ops):
            if isinstance(op, CopyOp) and in_message[i] != 1:
                raise self.fail(f"copy op {i} ({op.tensor!r} box {op.box} to device {op.dst_device}) is in {in_message[i]} messages; expected 1")
        limit = self.plan.options.max_message_bytes
        for m in self.plan.messages:
            if m.bytes > limit and not self.uncuttable(m):
                raise self.fail(f"message {m.id} holds {m.bytes} bytes in {len(m.ops)} ops, over max_message_bytes {limit}")
        for (r, host), nbytes in sorted(load.items()):
            if nbytes > budget:
                raise self.fail(f"host {host} moves {nbytes} network bytes in round {r}, over the memory budget of {budget}")

    def uncuttable(self, m) -> bool:
        """A message that may exceed the size limit: one same-device copy, or one element."""
        if len(m.ops) != 1:
            return False
        op = self.plan.ops[m.ops[0]]
        return op.src_device == op.dst_device or op.box.volume == 1

    def stats(self) -> None:
        by_class: Counter[str] = Counter()
        fill = 0
        host = {d.id: d.host for d in self.topology.devices}
        size = self.dst.itemsizes
        for op in self.plan.ops:
            if isinstance(op, CopyOp):
                link = "device" if op.src_device == op.dst_device else "host" if host[op.src_device] == host[op.dst_device] else "network"
                by_class[link] += op.box.volume * size[op.tensor]
            elif isinstance(op, FillOp):
                fill += op.box.volume * self.dst.itemsize(self.dst.subtensor_map[op.dst_subtensor].tensor)
        s = self.plan.stats
        if s.fill_bytes != fill:
            raise self.fail(f"plan stats say fill bytes {s.fill_bytes} but its fills write {fill}")
        got = (by_class["device"], by_class["host"], by_class["network"])
        if got != (s.device_bytes, s.host_bytes, s.network_bytes):
            raise self.fail(f"plan stats say device/host/network bytes {(s.device_bytes, s.host_bytes, s.network_bytes)} but its ops move {got}")
        rounds = len({m.round for m in self.plan.messages})
        if s.rounds != rounds:
            raise self.fail(f"plan stats say {s.rounds} rounds but its messages use {rounds}")
        per_host = host_lower_bounds(self.src, self.dst)
        bound = sum(per_host.values())
        if s.network_lower_bound_bytes != bound or s.network_bytes < bound:
            raise self.fail(f"plan stats say network lower bound {s.network_lower_bound_bytes} bytes; it is {bound}, and the plan moves {s.network_bytes}")
        loads = round_loads(self.plan.ops, self.plan.messages, size)
        seconds = (predict_seconds((loads[r] for r in sorted(loads)), self.topology.links), lower_bound_seconds(per_host, self.topology))
        if (s.predicted_seconds, s.lower_bound_seconds) != seconds:
            raise self.fail(f"plan stats say predicted and lower-bound seconds {(s.predicted_seconds, s.lower_bound_seconds)}; the cost model gives {seconds}")
