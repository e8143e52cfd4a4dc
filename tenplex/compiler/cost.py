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


Held = dict[frozenset[str], dict[str, set[Box]]]  # src partitions of a host -> tensor -> boxes they hold


def _partitions_by_host(allocation, host: dict[int, str]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for pid, devs in allocation.items:
        for d in devs:
            out[host[d]].add(pid)
    return {h: frozenset(ps) for h, ps in out.items()}


def _boxes_by_tensor(ptc: PTC, partitions: frozenset[str]) -> dict[str, set[Box]]:
    """tensor -> global boxes that the sub-tensors of `partitions` hold."""
    out: dict[str, set[Box]] = defaultdict(set)
    subtensors = ptc.subtensor_map
    for pid in partitions:
        for sid in ptc.partition_map[pid].subtensors:
            st = subtensors[sid]
            boxes = out[st.tensor]
            for p in st.pieces:
                boxes.add(p.global_box)
    return out


def host_lower_bounds(src: PTC, dst: PTC, allocation=None, held: Held | None = None) -> dict[str, int]:
    """Per dst host: bytes it must receive over the network (at least). A host's figure depends
    only on the dst partitions it gets and the src partitions it has, so hosts alike in both
    (DP replicas of one stage) are computed once. `held` (any dict, filled here) may be passed
    to share the src side between calls."""
    allocation = allocation or dst.allocation
    host = {d.id: d.host for d in src.topology.union(dst.topology).devices}
    held = {} if held is None else held
    src_on = _partitions_by_host(src.allocation, host)
    memo: dict[tuple[frozenset[str], frozenset[str]], int | None] = {}
    needed: dict[frozenset[str], dict[str, set[Box]]] = {}  # dst partitions -> their boxes
    out: dict[str, int] = {}
    for h, parts in sorted(_partitions_by_host(allocation, host).items()):
        key = (parts, src_on.get(h, frozenset()))
        if key not in memo:
            if parts not in needed:
                needed[parts] = _boxes_by_tensor(dst, parts)
            memo[key] = _missing_bytes(src, dst, needed[parts], key[1], held)
        if memo[key] is not None:
            out[h] = memo[key]
    return out


def _missing_bytes(src: PTC, dst: PTC, need: dict[str, set[Box]], src_parts: frozenset[str], held: Held) -> int | None:
    """Bytes of the dst boxes `need` (tensor -> boxes of some dst partitions) that `src_parts`
    (src) lack, each element once; None when `need` is empty (such a host receives nothing and
    has no figure)."""
    if not need:
        return None
    if src_parts not in held:
        held[src_parts] = _boxes_by_tensor(src, src_parts)
    have = held[src_parts]
    total = 0
    for tensor, boxes in need.items():
        held_boxes = have.get(tensor, set())
        if boxes <= held_boxes:  # every needed box is held as is: nothing to receive
            continue
        needed = disjoint_union(boxes)
        missing = sum(b.volume for b in needed) - _overlap_volume(needed, disjoint_union(held_boxes))
        total += missing * dst.itemsize(tensor)
    return total


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
