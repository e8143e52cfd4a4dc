"""Byte flows of a plan: per (src device, dst device) pair, what the DOT and text emitters draw
and tabulate (only copy ops move bytes; fills and values are local), and per (round, src host,
dst host), the coalesced messages that the DOT and picture emitters draw."""

from __future__ import annotations

from collections import Counter

import attrs

from tenplex.compiler.ops import CopyOp
from tenplex.compiler.plan import Plan
from tenplex.ir.ptc import PTC
from tenplex.ir.topology import LinkClass, Topology


def topology_of(src: PTC, dst: PTC) -> Topology:
    """The devices of both sides (a device in both must be on the same host)."""
    return src.topology.union(dst.topology)


def device_flows(plan: Plan, dst: PTC) -> dict[tuple[int, int], int]:
    """(src device, dst device) -> bytes copied, sorted by the pair."""
    flows: Counter[tuple[int, int]] = Counter()
    for op in plan.ops:
        if isinstance(op, CopyOp):
            flows[(op.src_device, op.dst_device)] += op.box.volume * dst.itemsize(op.tensor)
    return dict(sorted(flows.items()))


def host_network_bytes(flows: dict[tuple[int, int], int], topology: Topology) -> dict[str, tuple[int, int]]:
    """Host -> (bytes sent, bytes received) over the network, for every host of the topology."""
    out = {h: [0, 0] for h in topology.hosts}
    for (s, d), nbytes in flows.items():
        if topology.link(s, d) is LinkClass.NETWORK:
            out[topology.host_of(s)][0] += nbytes
            out[topology.host_of(d)][1] += nbytes
    return {h: (sent, received) for h, (sent, received) in out.items()}


def op_counts(plan: Plan) -> Counter[str]:
    """Op kind (`copy`, `fill`, `value`) -> number of ops."""
    return Counter(op.kind for op in plan.ops)


@attrs.frozen
class Traffic:
    """The coalesced messages from `src_host` to `dst_host` in one round (or, summed by
    `pair_traffic`, in all rounds: then `rounds` lists them)."""

    src_host: str
    dst_host: str
    rounds: tuple[int, ...]
    messages: int
    bytes: int

    @property
    def network(self) -> bool:
        """Between two hosts (a same-host message moves over NVLink or PCIe, not the NIC)."""
        return self.src_host != self.dst_host


def host_order(topology: Topology, plan: Plan) -> dict[str, int]:
    """Host -> its place: the topology's hosts first, then any other host a message names."""
    order = {h: i for i, h in enumerate(topology.hosts)}
    for h in sorted({h for m in plan.messages for h in (m.src_host, m.dst_host)} - order.keys()):
        order[h] = len(order)
    return order


def round_traffic(plan: Plan, order: dict[str, int]) -> list[Traffic]:
    """One entry per (round, src host, dst host) that has messages, sorted by round, then by
    the hosts' `order`."""
    sums: dict[tuple[int, str, str], list[int]] = {}
    for m in plan.messages:
        acc = sums.setdefault((m.round, m.src_host, m.dst_host), [0, 0])
        acc[0] += 1
        acc[1] += m.bytes
    keys = sorted(sums, key=lambda k: (k[0], order[k[1]], order[k[2]]))
    return [Traffic(s, d, (r,), *sums[(r, s, d)]) for r, s, d in keys]


def pair_traffic(traffic: list[Traffic], order: dict[str, int]) -> list[Traffic]:
    """`round_traffic` summed over rounds: one entry per (src host, dst host), in host order."""
    pairs: dict[tuple[str, str], list[Traffic]] = {}
    for t in traffic:
        pairs.setdefault((t.src_host, t.dst_host), []).append(t)
    keys = sorted(pairs, key=lambda k: (order[k[0]], order[k[1]]))
    return [Traffic(s, d, tuple(sorted({r for t in pairs[(s, d)] for r in t.rounds})),
                    sum(t.messages for t in pairs[(s, d)]), sum(t.bytes for t in pairs[(s, d)]))
            for s, d in keys]  # fmt: skip


def round_ranges(rounds: tuple[int, ...]) -> str:
    """`0-4, 7, 9-11`: sorted rounds as runs of consecutive ones."""
    runs: list[list[int]] = []
    for r in rounds:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
