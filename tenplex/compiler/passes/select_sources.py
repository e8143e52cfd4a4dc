"""`select-sources`: choose where each needed region is read from.

Locality first: a holder on the dst device (device class), else on the dst host (host class,
least-loaded device first), else the network. Network regions are gathered per dst host and cut
into disjoint *atoms*; each atom crosses the network once, lands on one dst device and is
forwarded to the host's other devices that need it (`src_side="dst"` copies behind an order
edge), so network bytes equal the per-host lower bound. The sending host is the least-loaded
holder host (largest atoms first), so the busiest NIC sends as little as possible. Transfers
between devices larger than `max_message_bytes` are cut into row-major chunks.

With `options.baseline == "reference"`, sources are chosen as the reference Tenplex does: every
dst device pulls every region from the first replica (DP rank 0) of the first holder, with no
locality and no deduplication. Such plans still verify; they only move more bytes.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable

import attrs

from tenplex.compiler.diff import ValueNeed
from tenplex.compiler.graph import OpGraph
from tenplex.compiler.ops import CopyOp, Holder, Need, ValueOp, trusted_copy
from tenplex.compiler.program import Program
from tenplex.ir.box import Box, split_box, subtract_all
from tenplex.ir.sweep import overlapping_pairs

Want = tuple[Need, int]  # a need on one dst device
Atom = tuple[Box, list[Want], dict[str, list[Holder]]]  # region, wants (landing first), holders by host


@attrs.frozen
class SelectSources:
    name = "select-sources"
    requires = frozenset({"lowered"})
    provides = frozenset({"sources"})

    def apply(self, program: Program) -> Program:
        state = _State(program)
        ops: list = []  # the new graph's ops in key order (added in bulk: one add per op costs)
        remote: dict[tuple[str, str], list[Want]] = defaultdict(list)
        reference = program.options.baseline == "reference"
        for _, op in program.graph.items():
            if isinstance(op, Need):
                if reference:
                    for d in op.dst_devices:
                        ops.extend(state.reference_copies(op, d))
                else:
                    state.local_copies(op, ops, remote)
            elif isinstance(op, ValueNeed):
                ops.extend(state.value_ops(op))
            else:
                ops.append(op)
        atoms = [atom for key in sorted(remote) for atom in state.atoms(remote[key])]
        size = state.size
        atoms.sort(key=lambda a: (-a[0].volume * size[a[1][0][0].tensor], a[1][0][1], a[0].start, a[0].stop))
        edges: list[tuple[int, int]] = []
        for box, wants, hosts in atoms:
            state.network(ops, edges, box, wants, hosts)
        out = OpGraph()
        out.add_all(ops)
        out.add_edges(edges)
        return attrs.evolve(program, graph=out)


class _State:
    """Load counters and lookup tables shared by the choices of one pass run."""

    def __init__(self, program: Program):
        self.p = program
        self.host = {d.id: d.host for d in program.topology.devices}
        self.host_rank = {h: i for i, h in enumerate(program.topology.hosts)}
        self.size = {t.name: program.itemsize(t.name) for t in program.dst.tensors}
        self.sent_host = LeastSent(self.host_rank)
        self.sent_device: Counter[int] = Counter()
        self.holder_hosts: dict[tuple[int, ...], dict[str, list[Holder]]] = {}
        self.indexes: dict[int, tuple] = {}
        self.atom_shapes: dict[tuple, list[tuple[Box, list[int], dict[str, list[Holder]]]]] = {}

    def copy(self, need: Need, device: int, holder: Holder, box: Box) -> CopyOp:
        return trusted_copy(need.tensor, box, holder.device, holder.subtensor, holder.piece, device, need.dst_subtensor, need.dst_piece)

    def chunked(self, op: CopyOp) -> list[CopyOp]:
        if op.src_device == op.dst_device:
            return [op]
        limit = max(1, self.p.options.max_message_bytes // self.size[op.tensor])
        if op.box.volume <= limit:
            return [op]
        return [trusted_copy(op.tensor, b, op.src_device, op.src_subtensor, op.src_piece, op.dst_device, op.dst_subtensor,
                             op.dst_piece) for b in split_box(op.box, limit)]  # fmt: skip

    def index(self, holders: tuple[Holder, ...]) -> tuple[dict[int, Holder], dict[str, list[Holder]]]:
        """The first holder per device and all holders per host (cached: diff shares tuples)."""
        key = id(holders)
        if key not in self.indexes:
            on_device: dict[int, Holder] = {}
            on_host: dict[str, list[Holder]] = defaultdict(list)
            for h in holders:  # sorted
                on_device.setdefault(h.device, h)
                on_host[self.host[h.device]].append(h)
            self.indexes[key] = (holders, on_device, on_host)  # keeps `holders` alive for id()
        return self.indexes[key][1:]

    def local_copies(self, need: Need, ops: list, remote: dict[tuple[str, str], list[Want]]) -> None:
        """Copies of `need` onto each of its dst devices that has a holder on the device or on
        its host (least-loaded device first); the others go to `remote`, per (host, tensor)."""
        on_device, on_host = self.index(need.holders)
        host, box = self.host, need.box
        for d in need.dst_devices:
            holder = on_device.get(d)
            if holder is not None:  # same device: never chunked
                ops.append(trusted_copy(need.tensor, box, holder.device, holder.subtensor, holder.piece, d, need.dst_subtensor, need.dst_piece))
                continue
            same_host = on_host.get(host[d])
            if not same_host:
                remote[(host[d], need.tensor)].append((need, d))
                continue
            best = min(same_host, key=lambda h: (self.sent_device[h.device], h))
            self.sent_device[best.device] += box.volume * self.size[need.tensor]
            ops.extend(self.chunked(self.copy(need, d, best, box)))

    def reference_copies(self, need: Need, device: int) -> list[CopyOp]:
        first = need.holders[0].subtensor, need.holders[0].piece
        dp0 = min(self.p.src.devices_of_subtensor(first[0]))
        return self.chunked(self.copy(need, device, Holder(dp0, *first), need.box))

    def value_ops(self, vn: ValueNeed) -> list[ValueOp]:
        if not vn.holders:
            return [ValueOp(d, vn.dst_partition, vn.name, value=vn.value) for d in vn.dst_devices]
        on_device, on_host = {}, {}
        for dev, part in vn.holders:  # sorted: the first holder per device and per host wins
            on_device.setdefault(dev, (dev, part))
            on_host.setdefault(self.host[dev], (dev, part))
        out = []
        for d in vn.dst_devices:
            dev, part = on_device.get(d) or on_host.get(self.host[d]) or vn.holders[0]
            out.append(ValueOp(d, vn.dst_partition, vn.name, dev, part))
        return out

    def atoms(self, wants: list[Want]) -> list[Atom]:
        """`cut`'s atoms, memoized by the wants' needs and the order of their devices: hosts
        alike (DP replicas of one stage) want the same needs on their own devices, so their
        atoms are the same with their own devices in the wants."""
        rank = {d: i for i, d in enumerate(sorted({d for _, d in wants}))}
        key = tuple([(id(n), rank[d]) for n, d in wants])  # needs stay alive in the lowered graph
        shape = self.atom_shapes.get(key)
        if shape is None:
            pos = {(id(n), d): i for i, (n, d) in enumerate(wants)}
            shape = [(box, [pos[(id(n), d)] for n, d in ws], hosts) for box, ws, hosts in self.cut(wants)]
            self.atom_shapes[key] = shape
        return [(box, [wants[i] for i in idx], hosts) for box, idx, hosts in shape]

    def cut(self, wants: list[Want]) -> list[Atom]:
        """Disjoint regions of one tensor needed on one host, each with the wants containing it
        (landing first) and their holders by host, cut to the message size limit."""
        by_box: dict[Box, list[Want]] = defaultdict(list)
        for w in wants:
            by_box[w[0].box].append(w)
        boxes = list(by_box)
        if len(boxes) > 1 and any(i < j for i, j in overlapping_pairs(boxes, boxes)):
            by_box = _refine(by_box)
        limit = max(1, self.p.options.max_message_bytes // self.size[wants[0][0].tensor])
        out = []
        for box, ws in by_box.items():
            ws, hosts = sorted(ws, key=_want_order), self.by_host(ws)
            out.extend((chunk, ws, hosts) for chunk in split_box(box, limit))
        return out

    def by_host(self, wants: list[Want]) -> dict[str, list[Holder]]:
        """Holders of all `wants` grouped by host (cached: needs share their holder tuples)."""
        groups = {id(n.holders): n.holders for n, _ in wants}
        key = tuple(sorted(groups))
        if key not in self.holder_hosts:
            out: dict[str, list[Holder]] = defaultdict(list)
            for h in sorted({h for hs in groups.values() for h in hs}):
                out[self.host[h.device]].append(h)
            self.holder_hosts[key] = out
        return self.holder_hosts[key]

    def network(self, ops: list, edges: list[tuple[int, int]], box: Box, wants: list[Want], hosts: dict[str, list[Holder]]) -> None:
        """The atom's landing copy from the least-loaded holder host (its least-loaded device)
        and the forwards to the other wants on the dst host, each behind an order edge."""
        host = self.sent_host.least(hosts)
        on_host = hosts[host]
        holder = on_host[0] if len(on_host) == 1 else min(on_host, key=lambda h: (self.sent_device[h.device], h))
        landing, at = wants[0]
        nbytes = box.volume * self.size[landing.tensor]
        self.sent_host.add(host, nbytes)
        self.sent_device[holder.device] += nbytes
        first = len(ops)
        ops.append(trusted_copy(landing.tensor, box, holder.device, holder.subtensor, holder.piece, at, landing.dst_subtensor, landing.dst_piece))
        for n, d in wants[1:]:
            edges.append((first, len(ops)))
            ops.append(trusted_copy(n.tensor, box, at, landing.dst_subtensor, landing.dst_piece, d, n.dst_subtensor, n.dst_piece, "dst"))


class LeastSent:
    """Bytes sent per host, and the host of a holder set that has sent the fewest (first in
    `rank` order on ties), from one heap per set: O(log n) a choice instead of a scan of all
    holder hosts (which grow with DP). Counts only grow, so a heap entry whose count is stale
    is too small: it surfaces first and is pushed back with its count."""

    def __init__(self, rank: dict[str, int]):
        self.rank = rank
        self.sent: Counter[str] = Counter()
        self.heaps: dict[int, tuple[object, list[tuple[int, int, str]]]] = {}  # id(set) -> (set, heap)
        self.shared: dict[tuple[str, ...], list[tuple[int, int, str]]] = {}  # equal sets share a heap

    def add(self, host: str, nbytes: int) -> None:
        self.sent[host] += nbytes

    def least(self, hosts: Iterable[str]) -> str:
        """`hosts` must not change while it is used here (the heap is kept by its id)."""
        entry = self.heaps.get(id(hosts))
        if entry is None:
            key = tuple(sorted(hosts))
            if key not in self.shared:  # one heap per distinct set: a count goes stale in few heaps
                self.shared[key] = [(self.sent[h], self.rank[h], h) for h in key]
                heapq.heapify(self.shared[key])
            entry = self.heaps[id(hosts)] = (hosts, self.shared[key])  # keeps `hosts` alive for id()
        heap, sent = entry[1], self.sent
        while heap[0][0] != sent[heap[0][2]]:
            _, rank, h = heap[0]
            heapq.heapreplace(heap, (sent[h], rank, h))
        return heap[0][2]


def _want_order(w: Want) -> tuple:
    return (w[1], w[0].dst_subtensor, w[0].dst_piece)


def _refine(by_box: dict[Box, list[Want]]) -> dict[Box, list[Want]]:
    """Disjoint atoms of overlapping need boxes, each listing every want that contains it."""
    atoms: list[tuple[Box, list[Want]]] = []
    for box, wants in by_box.items():
        rest, refined = [box], []
        for a, aws in atoms:
            inter = a.intersect(box)
            if inter is None:
                refined.append((a, aws))
                continue
            refined.append((inter, aws + wants))
            refined.extend((q, aws) for q in a.subtract(inter))
            rest = subtract_all(rest, inter)
        atoms = refined + [(r, list(wants)) for r in rest]
    return dict(sorted(atoms, key=lambda x: x[0]))
