"""Bounds and the cost model.

`network_lower_bound` is docs/design.md §9's figure, computed from the PTCs alone (independently of any
plan): for every dst host, the bytes its dst devices need that no src device on that host holds,
each element counted once, fills excluded. `predict` models a plan's time round by round: a
round lasts as long as its slowest host needs to push its NIC egress, its NIC ingress and its
local copies through the link bandwidths.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from tenplex.ir.box import Box, disjoint_union
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.topology import Links, Topology


def _overlap_volume(a: Sequence[Box], b: Sequence[Box]) -> int:
    """Volume of (∪a) ∩ (∪b) for two lists of disjoint boxes."""
    if not a or not b:
        return 0
    return sum(a[i].overlap_volume(b[j]) for i, j in overlapping_pairs(a, b))


Held = dict[tuple[str, str], set[Box]]


def held_by_host(ptc: PTC, host: dict[int, str]) -> Held:
    """(host, tensor) -> global boxes the PTC's devices on that host hold."""
    have: Held = defaultdict(set)
    for st in ptc.subtensors:
        boxes = [p.global_box for p in st.pieces]
        for h in {host[d] for d in ptc.devices_of_subtensor(st.id)}:
            have[(h, st.tensor)].update(boxes)
    return have


def host_lower_bounds(src: PTC, dst: PTC, allocation=None, held: Held | None = None) -> dict[str, int]:
    """Per dst host: bytes it must receive over the network (at least). `held` (from
    `held_by_host(src, ...)`) may be passed to share it between calls."""
    allocation = allocation or dst.allocation
    host = {d.id: d.host for d in src.topology.union(dst.topology).devices}
    need: Held = defaultdict(set)
    for st in dst.subtensors:
        boxes = [p.global_box for p in st.pieces]
        for h in {host[d] for d in allocation.devices_of(dst.partition_of[st.id])}:
            need[(h, st.tensor)].update(boxes)
    have = held if held is not None else held_by_host(src, host)
    out: dict[str, int] = defaultdict(int)
    for (host, tensor), boxes in sorted(need.items()):
        held_boxes = have.get((host, tensor), set())
        if boxes <= held_boxes:  # every needed box is held as is: nothing to receive
            out[host] += 0
            continue
        needed = disjoint_union(boxes)
        held = disjoint_union(held_boxes)
        missing = sum(b.volume for b in needed) - _overlap_volume(needed, held)
        out[host] += missing * dst.itemsize(tensor)
    return dict(out)


def network_lower_bound(src: PTC, dst: PTC, allocation=None) -> int:
    return sum(host_lower_bounds(src, dst, allocation).values())


def lower_bound_seconds(per_host: dict[str, int], topology: Topology) -> float:
    """No host can receive faster than its NIC, and all NICs together cannot send faster."""
    bw = topology.links.network
    if not per_host:
        return 0.0
    return max(max(per_host.values()) / bw, sum(per_host.values()) / (bw * max(1, len(topology.hosts))))


Load = dict[tuple[str, str, object], int]  # (link class name, host, "out" | "in" | dst device) -> bytes


def round_loads(ops: Sequence, messages: Iterable, itemsizes: dict[str, int]) -> dict[int, Load]:
    """Round -> bytes per link end: network messages by their byte counts (NIC egress and
    ingress of their hosts), local ones op by op (into each dst device over the device or the
    host link). Shared by `freeze` and `check_plan`, so both price a plan alike."""
    loads: dict[int, Load] = defaultdict(lambda: defaultdict(int))
    for m in messages:
        load = loads[m.round]
        if m.src_host != m.dst_host:
            load[("network", m.src_host, "out")] += m.bytes
            load[("network", m.dst_host, "in")] += m.bytes
            continue
        for i in m.ops:
            op = ops[i]
            link = "device" if op.src_device == op.dst_device else "host"
            load[(link, m.dst_host, op.dst_device)] += op.box.volume * itemsizes[op.tensor]
    return loads


def predict_seconds(rounds: Iterable[Load], links: Links) -> float:
    """Sum over rounds of the slowest link's time in that round: each host's NIC egress and
    ingress, and the copies into each device over the host or device links."""
    return sum(max((b / getattr(links, key[0]) for key, b in load.items()), default=0.0) for load in rounds)
