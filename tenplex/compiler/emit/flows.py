"""Byte flows of a plan, aggregated per (src device, dst device) pair: what the DOT and text
emitters draw and tabulate. Only copy ops move bytes; fills and values are local."""

from __future__ import annotations

from collections import Counter

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
