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

import attrs

from tenplex.compiler.pieces import Pieces, codes_of
from tenplex.ir.box import Box, disjoint_union
from tenplex.ir.ptc import PTC
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.topology import Links, Topology


def _overlap_volume(a: Sequence[Box], b: Sequence[Box]) -> int:
    """Volume of (∪a) ∩ (∪b) for two lists of disjoint boxes."""
    if not a or not b:
        return 0
    return sum(a[i].overlap_volume(b[j]) for i, j in overlapping_pairs(a, b))


@attrs.define
class Held:
    """Work shared between `host_lower_bounds` calls on one src and dst (another allocation of
    dst's partitions mostly gives hosts the same pairs of partition sets). Boxes are numbered by
    value, so sets of boxes compare as sets of ints: by `pieces` where the compiler read both
    PTCs already, else as met (only the partitions on some host are read, as `check_plan`
    needs no more)."""

    pieces: Pieces | None = None  # both PTCs' piece boxes by number (`Program.pieces`)
    number: dict[tuple, int] = attrs.Factory(dict)  # (start, stop) -> number, where `pieces` is None
    boxes: list[Box] = attrs.Factory(list)  # number -> box, where `pieces` is None
    src: dict[frozenset[str], dict[str, frozenset[int]]] = attrs.Factory(dict)  # src partitions -> tensor -> boxes held
    dst: dict[frozenset[str], dict[str, frozenset[int]]] = attrs.Factory(dict)  # dst partitions -> tensor -> boxes needed
    bytes: dict[tuple[frozenset[str], frozenset[str]], int | None] = attrs.Factory(dict)  # (dst, src partitions) -> missing
    missing: dict[tuple[frozenset[int], frozenset[int]], int] = attrs.Factory(dict)  # (needed, held boxes) -> elements


def _partitions_by_host(allocation, host: dict[int, str]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for pid, devs in allocation.items:
        for d in devs:
            out[host[d]].add(pid)
    return {h: frozenset(ps) for h, ps in out.items()}


def _boxes_by_tensor(ptc: PTC, partitions: frozenset[str], held: Held, side: str) -> dict[str, frozenset[int]]:
    """tensor -> numbers of the global boxes that the sub-tensors of `partitions` hold (of
    `ptc`, the `side` of `held.pieces` where given)."""
    if held.pieces is not None:
        rows = getattr(held.pieces, side).partitions  # (tensor, codes) per partition
        found: dict[str, list[int]] = {}  # the codes in lists, made sets once per tensor
        for pid in partitions:
            for tensor, codes in rows[pid]:
                got = found.get(tensor)
                if got is None:
                    found[tensor] = list(codes)
                else:
                    got += codes
        return {t: frozenset(b) for t, b in found.items()}
    out: dict[str, set[int]] = defaultdict(set)
    subtensors, number, boxes = ptc.subtensor_map, held.number, held.boxes
    for pid in partitions:
        for sid in ptc.partition_map[pid].subtensors:
            st = subtensors[sid]
            out[st.tensor].update(codes_of(st, number, boxes))
    return {t: frozenset(b) for t, b in out.items()}


def host_lower_bounds(src: PTC, dst: PTC, allocation=None, held: Held | None = None) -> dict[str, int]:
    """Per dst host: bytes it must receive over the network (at least). A host's figure depends
    only on the dst partitions it gets and the src partitions it has, so hosts alike in both
    (DP replicas of one stage) are computed once. `held` (filled here) may be passed to
    share that work between calls on the same src and dst."""
    allocation = allocation or dst.allocation
    host = src.topology.hosts_with(dst.topology)
    held = Held() if held is None else held
    src_on = _partitions_by_host(src.allocation, host)
    out: dict[str, int] = {}
    for h, parts in sorted(_partitions_by_host(allocation, host).items()):
        key = (parts, src_on.get(h, frozenset()))
        if key not in held.bytes:
            if parts not in held.dst:
                held.dst[parts] = _boxes_by_tensor(dst, parts, held, "dst")
            held.bytes[key] = _missing_bytes(src, dst, held.dst[parts], key[1], held)
        if held.bytes[key] is not None:
            out[h] = held.bytes[key]
    return out


def _missing_bytes(src: PTC, dst: PTC, need: dict[str, frozenset[int]], src_parts: frozenset[str], held: Held) -> int | None:
    """Bytes of the dst boxes `need` (tensor -> box numbers of some dst partitions) that
    `src_parts` (src) lack, each element once; None when `need` is empty (such a host receives
    nothing and has no figure). Tensors alike (a weight of every layer of a stage, its
    optimizer states) need and hold the same boxes, so each pair of box sets is counted once."""
    if not need:
        return None
    if src_parts not in held.src:
        held.src[src_parts] = _boxes_by_tensor(src, src_parts, held, "src")
    have = held.src[src_parts]
    total = 0
    for tensor, boxes in need.items():
        held_boxes = have.get(tensor, frozenset())
        if boxes <= held_boxes:  # every needed box is held as is: nothing to receive
            continue
        key = (boxes, held_boxes)
        if key not in held.missing:
            held.missing[key] = _missing_volume(boxes, held_boxes, held.boxes if held.pieces is None else held.pieces.boxes)
        total += held.missing[key] * dst.itemsize(tensor)
    return total


def _missing_volume(needed: frozenset[int], have: frozenset[int], boxes: list[Box]) -> int:
    """Elements of the boxes numbered `needed` outside those numbered `have` (`boxes`: by number)."""
    need = disjoint_union(boxes[k] for k in needed)
    return sum(b.volume for b in need) - _overlap_volume(need, disjoint_union(boxes[k] for k in have))


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
