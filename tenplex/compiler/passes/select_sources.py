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
import numpy as np

from tenplex.compiler.diff import ValueNeed
from tenplex.compiler.ops import Holder, Need, ValueOp
from tenplex.compiler.passes.atoms import Atoms, Want
from tenplex.compiler.program import Program
from tenplex.compiler.table import I64, OpTable, pad
from tenplex.ir.box import Box, split_box


@attrs.frozen
class SelectSources:
    name = "select-sources"
    requires = frozenset({"lowered"})
    provides = frozenset({"sources"})

    def apply(self, program: Program) -> Program:
        state = _State(program)
        remote: dict[tuple[str, str], list[Want]] = defaultdict(list)
        reference = program.options.baseline == "reference"
        for _, op in program.graph.items():
            if isinstance(op, Need):
                if reference:
                    for d in op.dst_devices:
                        state.reference_copy(op, d)
                else:
                    state.local_copies(op, remote)
            elif isinstance(op, ValueNeed):
                base = state.next_id()
                state.others.extend((base + i, v) for i, v in enumerate(state.value_ops(op)))
            else:
                state.others.append((state.next_id(), op))
        table, edges = state.table(Atoms(state, remote))
        return attrs.evolve(program, graph=None, table=table, edges=edges)


class _State:
    """Load counters, lookup tables and the copies chosen so far (rows of ints: tensor, box,
    src device, sub-tensor and piece, dst device, sub-tensor and piece; all read the src state)."""

    def __init__(self, program: Program):
        self.p = program
        self.host = {d.id: d.host for d in program.topology.devices}
        self.host_rank = {h: i for i, h in enumerate(program.topology.hosts)}
        self.size = {t.name: program.itemsize(t.name) for t in program.dst.tensors}
        self.tensor_ix = {t.name: i for i, t in enumerate(program.dst.tensors)}
        self.sid_ix = {s: i for i, s in enumerate(dict.fromkeys([s.id for ptc in (program.src, program.dst) for s in ptc.subtensors]))}
        self.sent_host = LeastSent(self.host_rank)
        self.sent_device: Counter[int] = Counter()
        self.indexes: dict[int, tuple] = {}
        self.box_ids: dict[int, int] = {}
        self.boxes: list[Box] = []
        self.rows: list[tuple[int, ...]] = []
        self.others: list[tuple[int, object]] = []  # (op id, fill or value op)

    def next_id(self) -> int:
        return len(self.rows) + len(self.others)

    def box_id(self, box: Box) -> int:
        """The box's index in `boxes`, by object (`boxes` keeps them alive for id())."""
        i = self.box_ids.get(id(box))
        if i is None:
            i = self.box_ids[id(box)] = len(self.boxes)
            self.boxes.append(box)
        return i

    def copy(self, need: Need, device: int, holder: Holder, box: Box) -> None:
        """The copy of `box` of `need` onto `device` from `holder`, cut into row-major chunks
        when it crosses devices and exceeds the message size limit."""
        t, ds, sid = self.tensor_ix[need.tensor], self.sid_ix[need.dst_subtensor], self.sid_ix[holder.subtensor]
        limit = max(1, self.p.options.max_message_bytes // self.size[need.tensor])
        chunks = [box] if holder.device == device or box.volume <= limit else split_box(box, limit)
        for b in chunks:
            self.rows.append((t, self.box_id(b), holder.device, sid, holder.piece, device, ds, need.dst_piece))

    def index(self, holders: tuple[Holder, ...]) -> tuple[dict[int, tuple], dict[str, list[Holder]]]:
        """The first holder per device (as ints: device, sub-tensor id, piece) and all holders
        per host (cached: diff shares tuples)."""
        key = id(holders)
        if key not in self.indexes:
            on_device: dict[int, tuple] = {}
            on_host: dict[str, list[Holder]] = defaultdict(list)
            for h in holders:  # sorted
                if h.device not in on_device:
                    on_device[h.device] = (h.device, self.sid_ix[h.subtensor], h.piece)
                on_host[self.host[h.device]].append(h)
            self.indexes[key] = (holders, on_device, on_host)  # keeps `holders` alive for id()
        return self.indexes[key][1:]

    def local_copies(self, need: Need, remote: dict[tuple[str, str], list[Want]]) -> None:
        """Copies of `need` onto each of its dst devices that has a holder on the device or on
        its host (least-loaded device first); the others go to `remote`, per (host, tensor)."""
        on_device, on_host = self.index(need.holders)
        host, rows = self.host, self.rows
        head = None
        for d in need.dst_devices:
            holder = on_device.get(d)
            if holder is not None:  # same device: never chunked
                if head is None:
                    head = (self.tensor_ix[need.tensor], self.box_id(need.box))
                    tail = (self.sid_ix[need.dst_subtensor], need.dst_piece)
                rows.append((*head, *holder, d, *tail))
                continue
            same_host = on_host.get(host[d])
            if not same_host:
                remote[(host[d], need.tensor)].append((need, d))
                continue
            best = min(same_host, key=lambda h: (self.sent_device[h.device], h))
            self.sent_device[best.device] += need.box.volume * self.size[need.tensor]
            self.copy(need, d, best, need.box)

    def reference_copy(self, need: Need, device: int) -> None:
        first = need.holders[0].subtensor, need.holders[0].piece
        dp0 = min(self.p.src.devices_of_subtensor(first[0]))
        self.copy(need, device, Holder(dp0, *first), need.box)

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

    def sources(self, hosts: list[dict[str, list[Holder]]], nbytes: list[int]) -> tuple[np.ndarray, ...]:
        """Each atom's landing source, in the order given: the least-loaded holder host (its
        least-loaded device); (device, sub-tensor id, piece) arrays."""
        least, add, sent_device = self.sent_host.least, self.sent_host.add, self.sent_device
        chosen = []
        for on_hosts, n in zip(hosts, nbytes):
            host = least(on_hosts)
            on_host = on_hosts[host]
            holder = on_host[0] if len(on_host) == 1 else min(on_host, key=lambda h: (sent_device[h.device], h))
            add(host, n)
            sent_device[holder.device] += n
            chosen.append(holder)
        sid = self.sid_ix
        return (np.fromiter((h.device for h in chosen), I64, len(chosen)),
                np.fromiter((sid[h.subtensor] for h in chosen), I64, len(chosen)),
                np.fromiter((h.piece for h in chosen), I64, len(chosen)))  # fmt: skip

    def table(self, atoms: Atoms) -> tuple[OpTable, np.ndarray]:
        """The pass's copies as columns: the local ones in need order, then the fills and
        values, then each atom's landing copy and forwards, largest atoms first."""
        lo, hi, nd = pad(self.boxes)
        volume = np.prod(hi - lo, axis=1)
        itemsize = np.array([self.size[t] for t in self.tensor_ix], I64)
        order = atoms.order(volume, itemsize, lo, nd, hi)
        nbytes = (volume[atoms.box] * itemsize[atoms.tensor])[order]
        holders = self.sources([atoms.hosts[i] for i in order.tolist()], nbytes.tolist())
        first = self.next_id()
        cols, edges = atoms.copies(order, first, holders)
        local = np.array(self.rows, I64).reshape(-1, 8)
        names = ("tensor", "box", "src_dev", "src_sid", "src_piece", "dst_dev", "dst_sid", "dst_piece")
        merged = {k: np.concatenate((local[:, j], cols[k])) for j, k in enumerate(names)}
        forward = np.concatenate((np.zeros(len(local), bool), cols["forward"]))
        others = tuple(self.others)
        is_copy = np.ones(first + len(forward) - len(local), bool)
        is_copy[np.array([i for i, _ in others], I64)] = False
        table = OpTable(len(is_copy), np.flatnonzero(is_copy), tuple(self.tensor_ix), tuple(self.sid_ix),
                        tuple(self.boxes), forward=forward, others=others, **merged)  # fmt: skip
        return table, edges


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
