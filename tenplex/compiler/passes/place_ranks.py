"""`place-ranks`: permute dst ranks over the dst devices to keep the most data in place.

A dst device is a *slot* carrying its partitions. The pass permutes slots in two levels, so that
the launcher's host structure (e.g. TP groups inside a host) survives: first whole hosts onto
hosts with the same number of dst devices, maximizing bytes already on the host; then, inside
each host, slots onto devices, maximizing bytes already on the device. Both levels are
assignment problems (networkx `minimum_weight_full_matching`). The identity wins ties, and the
new placement is kept only when it lowers the exact network lower bound, so the pass never
makes a plan move more bytes.
"""

from __future__ import annotations

from collections import defaultdict

import attrs
import networkx as nx
from networkx.algorithms.bipartite import minimum_weight_full_matching

from tenplex.compiler.cost import held_by_host, host_lower_bounds
from tenplex.compiler.program import Program
from tenplex.ir.ptc import PTC, Allocation
from tenplex.ir.sweep import overlapping_pairs


@attrs.frozen
class PlaceRanks:
    name = "place-ranks"
    requires = frozenset()
    provides = frozenset({"placed"})

    def apply(self, program: Program) -> Program:
        src, dst, topo = program.src, program.dst, program.topology
        shared = _shared_bytes(src, dst)  # dst partition -> {src partition: bytes}
        slots = dst.allocation.by_device  # dst device -> its partitions
        by_host: dict[str, list[int]] = defaultdict(list)
        for d in slots:
            by_host[topo.host_of(d)].append(d)
        host_bytes = _host_bytes(src, shared, slots, by_host, topo)
        src_devices = {q: set(devs) for q, devs in src.allocation.items}

        def on_host(slot_host: str, host: str) -> int:
            return host_bytes[slot_host].get(host, 0)

        def on_device(slot: int, device: int) -> int:
            return sum(b for p in slots[slot] for q, b in shared[p].items() if device in src_devices[q])

        host_map: dict[str, str] = {}
        same_size: dict[int, list[str]] = defaultdict(list)
        for h, ds in by_host.items():
            same_size[len(ds)].append(h)
        for hosts in same_size.values():
            host_map |= _assign(hosts, hosts, on_host)
        device_map: dict[int, int] = {}
        for h, ds in by_host.items():
            device_map |= _assign(sorted(ds), sorted(by_host[host_map[h]]), on_device)
        moved = Allocation({pid: tuple(device_map[d] for d in devs) for pid, devs in dst.allocation.items})
        # The matching is a heuristic on bytes held; keep it only when it lowers the exact network
        # lower bound (what the plan will move), or keeps it and leaves more bytes on their device.
        held = held_by_host(src, {d.id: d.host for d in topo.devices})
        keep = host_lower_bounds(src, dst, held=held)
        placed = host_lower_bounds(src, dst, moved, held=held) if moved != dst.allocation else keep
        in_place = sum(on_device(d, d) for d in slots), sum(on_device(d, device_map[d]) for d in slots)
        if (sum(placed.values()), -in_place[1]) < (sum(keep.values()), -in_place[0]):
            return attrs.evolve(program, dst=attrs.evolve(dst, allocation=moved), lower_bounds=placed)
        return attrs.evolve(program, lower_bounds=keep)


def _host_bytes(src: PTC, shared, slots, by_host, topo) -> dict[str, dict[str, int]]:
    """slot host -> {host: bytes of the slot host's partitions that the host holds in src};
    a partition replicated on several slots of one host counts once."""
    src_hosts = {q: {topo.host_of(e) for e in devs} for q, devs in src.allocation.items}
    out: dict[str, dict[str, int]] = {}
    for slot_host, devices in by_host.items():
        weights: dict[str, int] = defaultdict(int)
        for p in {p for s in devices for p in slots[s]}:
            for q, b in shared[p].items():
                for h in src_hosts[q]:
                    weights[h] += b
        out[slot_host] = weights
    return out


def _assign(slots: list, targets: list, weight) -> dict:
    """Max-weight perfect assignment slots -> targets; the identity (slot i -> target i) wins ties."""
    if len(slots) <= 1:
        return dict(zip(slots, targets))
    g = nx.Graph()
    scale = len(slots) + 1
    for i, s in enumerate(slots):
        for j, t in enumerate(targets):
            w = weight(s, t) * scale + (1 if i == j else 0)
            g.add_edge(("s", i), ("t", j), weight=-w)
    match = minimum_weight_full_matching(g, top_nodes=[("s", i) for i in range(len(slots))])
    return {s: targets[match[("s", i)][1]] for i, s in enumerate(slots)}


def _shared_bytes(src: PTC, dst: PTC) -> dict[str, dict[str, int]]:
    """dst partition -> {src partition: bytes of the dst partition that it holds}."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for meta in dst.tensors:
        a = [(st.id, p.global_box) for st in dst.by_tensor[meta.name] for p in st.pieces]
        b = [(st.id, p.global_box) for st in src.by_tensor.get(meta.name, ()) for p in st.pieces]
        size = dst.itemsize(meta.name)
        for i, j in overlapping_pairs([x for _, x in a], [x for _, x in b]):
            nbytes = a[i][1].intersect(b[j][1]).volume * size  # type: ignore[union-attr]
            out[dst.partition_of[a[i][0]]][src.partition_of[b[j][0]]] += nbytes
    return out
