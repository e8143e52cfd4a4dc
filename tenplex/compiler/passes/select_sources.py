"""`select-sources`: choose where each needed region is read from.

Locality first: a holder on the dst device (device class), else on the dst host (host class,
least-loaded device first), else the network. Network regions are gathered per dst host and cut
into disjoint *atoms*; each atom crosses the network once, lands on one dst device and is
forwarded to the host's other devices that need it (`src_side="dst"` copies behind an order
edge), so network bytes equal the per-host lower bound. The sending host is the least-loaded
holder host (largest atoms first), so the busiest NIC sends as little as possible. Transfers
larger than `max_message_bytes` are cut into row-major chunks.

With `options.baseline == "reference"`, sources are chosen as the reference Tenplex does: every
dst device pulls every region from the first replica (DP rank 0) of the first holder, with no
locality and no deduplication. Such plans still verify; they only move more bytes.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import attrs

from tenplex.compiler.diff import ValueNeed
from tenplex.compiler.graph import OpGraph
from tenplex.compiler.ops import CopyOp, Holder, Need, ValueOp
from tenplex.compiler.program import Program
from tenplex.ir.box import Box, split_box, subtract_all
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.topology import LinkClass


@attrs.frozen
class SelectSources:
    name = "select-sources"
    requires = frozenset({"lowered"})
    provides = frozenset({"sources"})

    def apply(self, program: Program) -> Program:
        state = _State(program)
        out = OpGraph()
        remote: dict[tuple[str, str], list[Need]] = defaultdict(list)
        for _, op in program.graph.items():
            if isinstance(op, Need):
                if program.options.baseline == "reference":
                    out.add_all(state.reference_copies(op))
                elif (copy := state.local_copy(op)) is not None:
                    out.add_all(state.chunked(copy))
                else:
                    remote[(program.host_of(op.dst_device), op.tensor)].append(op)
            elif isinstance(op, ValueNeed):
                out.add_all(state.value_ops(op))
            else:
                out.add(op)
        atoms = [atom for key in sorted(remote) for atom in state.atoms(remote[key])]
        atoms.sort(key=lambda a: (-a[0].volume * program.itemsize(a[1][0].tensor), a[1][0].dst_device, a[0]))
        for box, needs in atoms:
            state.network(out, box, needs)
        return attrs.evolve(program, graph=out)


class _State:
    """Load counters shared by the choices of one pass run."""

    def __init__(self, program: Program):
        self.p = program
        self.host_rank = {h: i for i, h in enumerate(program.topology.hosts)}
        self.sent_host: Counter[str] = Counter()
        self.sent_device: Counter[int] = Counter()

    def nbytes(self, need: Need, box: Box) -> int:
        return box.volume * self.p.itemsize(need.tensor)

    def copy(self, need: Need, holder: Holder, box: Box) -> CopyOp:
        return CopyOp(need.tensor, box, holder.device, holder.subtensor, holder.piece, need.dst_device, need.dst_subtensor, need.dst_piece)

    def chunked(self, op: CopyOp) -> list[CopyOp]:
        if op.src_device == op.dst_device:
            return [op]
        limit = max(1, self.p.options.max_message_bytes // self.p.itemsize(op.tensor))
        return [attrs.evolve(op, box=b) for b in split_box(op.box, limit)]

    def local_copy(self, need: Need) -> CopyOp | None:
        host = self.p.host_of(need.dst_device)
        same_device = [h for h in need.holders if h.device == need.dst_device]
        if same_device:
            return self.copy(need, same_device[0], need.box)
        same_host = [h for h in need.holders if self.p.host_of(h.device) == host]
        if not same_host:
            return None
        holder = min(same_host, key=lambda h: (self.sent_device[h.device], h))
        self.sent_device[holder.device] += self.nbytes(need, need.box)
        return self.copy(need, holder, need.box)

    def reference_copies(self, need: Need) -> list[CopyOp]:
        first = need.holders[0].subtensor, need.holders[0].piece
        dp0 = min(self.p.src.devices_of_subtensor(first[0]))
        return self.chunked(self.copy(need, Holder(dp0, *first), need.box))

    def value_ops(self, vn: ValueNeed) -> list[ValueOp]:
        if not vn.holders:
            return [ValueOp(d, vn.dst_partition, vn.name, value=vn.value) for d in vn.dst_devices]
        out = []
        for d in vn.dst_devices:
            dev, part = min(vn.holders, key=lambda h: (_LINK_RANK[self.p.topology.link(h[0], d)], h))
            out.append(ValueOp(d, vn.dst_partition, vn.name, dev, part))
        return out

    def atoms(self, needs: list[Need]) -> list[tuple[Box, list[Need]]]:
        """Disjoint regions of one tensor needed on one host, each with the needs containing it,
        cut to the message size limit."""
        by_box: dict[Box, list[Need]] = defaultdict(list)
        for n in needs:
            by_box[n.box].append(n)
        boxes = list(by_box)
        if any(i < j for i, j in overlapping_pairs(boxes, boxes)):
            by_box = _refine(by_box)
        limit = max(1, self.p.options.max_message_bytes // self.p.itemsize(needs[0].tensor))
        return [(chunk, sorted(ns, key=_need_order)) for box, ns in by_box.items() for chunk in split_box(box, limit)]

    def network(self, out: OpGraph, box: Box, needs: list[Need]) -> None:
        holders = sorted({h for n in needs for h in n.holders})
        host = min({self.p.host_of(h.device) for h in holders}, key=lambda h: (self.sent_host[h], self.host_rank[h]))
        holder = min((h for h in holders if self.p.host_of(h.device) == host), key=lambda h: (self.sent_device[h.device], h))
        nbytes = self.nbytes(needs[0], box)
        self.sent_host[host] += nbytes
        self.sent_device[holder.device] += nbytes
        landing, *rest = needs
        first = out.add(self.copy(landing, holder, box))
        for n in rest:
            fwd = CopyOp(n.tensor, box, landing.dst_device, landing.dst_subtensor, landing.dst_piece,
                         n.dst_device, n.dst_subtensor, n.dst_piece, src_side="dst")  # fmt: skip
            out.add_edge(first, out.add(fwd))


_LINK_RANK = {LinkClass.DEVICE: 0, LinkClass.HOST: 1, LinkClass.NETWORK: 2}


def _need_order(n: Need) -> tuple:
    return (n.dst_device, n.dst_subtensor, n.dst_piece)


def _refine(by_box: dict[Box, list[Need]]) -> dict[Box, list[Need]]:
    """Disjoint atoms of overlapping need boxes, each listing every need that contains it."""
    atoms: list[tuple[Box, list[Need]]] = []
    for box, needs in by_box.items():
        rest, refined = [box], []
        for a, ans in atoms:
            inter = a.intersect(box)
            if inter is None:
                refined.append((a, ans))
                continue
            refined.append((inter, ans + needs))
            refined.extend((q, ans) for q in a.subtract(inter))
            rest = subtract_all(rest, inter)
        atoms = refined + [(r, list(needs)) for r in rest]
    return dict(sorted(atoms, key=lambda x: x[0]))
